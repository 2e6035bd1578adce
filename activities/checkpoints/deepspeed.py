"""DeepSpeed checkpoints (``deepspeed/runtime/engine.py`` ``save_checkpoint``, ``deepspeed/utils/zero_to_fp32.py``).

``latest`` (or ``latest_universal``) holds the tag of the last save, by default ``global_step{N}``, and is what
``load_checkpoint`` resumes from; rank 0 writes it after its own files and before the final barrier, so other
ranks' shards may still be missing. ``{tag}/`` holds ``mp_rank_{mp:02d}_model_states.pt`` per model-parallel rank
(``zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt`` under ZeRO-3) and, under ZeRO, one
``[bf16_]zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt`` per data-parallel rank and model-parallel rank.
Complete here: every file sound, model-parallel ranks 0..M-1 present, and the same data-parallel ranks 0..D-1 for
every model-parallel rank, D and M checked against ``dp_world_size``/``mp_world_size`` in the model states when
they can be read without running the file. A tag directory newer than ``latest`` was not finished.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from functools import partial
from pathlib import Path

from activities.checkpoints.files import (
    Candidate,
    guarded,
    incomplete,
    modified_at,
    step_in_name,
    torch_save_fields,
    torch_save_problem,
    unreadable,
)
from workflows.domain.checkpoints import CheckpointFormat, CheckpointStatus

__all__ = ["TRACKERS", "find", "is_tag_dir"]

_FMT = CheckpointFormat.DEEPSPEED
TRACKERS = ("latest", "latest_universal")
_MODEL = re.compile(r"^(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")


def is_tag_dir(path: Path) -> bool:
    """True when ``path`` is a directory holding DeepSpeed model states or ZeRO shards."""
    try:
        return path.is_dir() and any(_MODEL.match(n) or _OPTIM.match(n) for n in os.listdir(path))
    except OSError:
        return False


def find(root: Path, names: list[str]) -> tuple[list[Candidate], set[str]]:
    """DeepSpeed's checkpoints under ``root`` (its ``latest`` and tag directories) and the names it claims."""
    tags = [n for n in names if is_tag_dir(root / n)]
    trackers = [n for n in TRACKERS if n in names and (root / n).is_file()]
    if not tags and not trackers:
        return [], set()
    found: list[Candidate] = []
    latest: str | None = None
    if trackers:
        tracker = root / trackers[0]
        try:
            latest = tracker.read_text(errors="replace").strip() or None
        except OSError as e:
            found.append(unreadable(tracker, _FMT, None, e))
        else:
            if latest is None:
                found.append(
                    incomplete(tracker, _FMT, None, f"{tracker.name} is empty: DeepSpeed cannot resume from it")
                )
            elif "/" in latest or latest.startswith("."):
                found.append(incomplete(tracker, _FMT, None, f"{tracker.name} holds {latest[:40]!r}, not a tag"))
                latest = None
            elif latest not in tags:
                found.append(
                    incomplete(
                        root / latest,
                        _FMT,
                        step_in_name(latest),
                        f"{tracker.name} names {latest}, which does not exist or holds no model states (tracker ahead)",
                    )
                )
    latest_step = step_in_name(latest) if latest else None
    for tag in sorted(tags):
        path = root / tag
        step = step_in_name(tag)
        if latest is not None and tag != latest and latest_step is not None and step is not None and step > latest_step:
            found.append(incomplete(path, _FMT, step, f"newer than latest ({latest}): the save did not finish"))
            continue
        verdict = guarded(path, _FMT, step, partial(_check_tag, path, step))
        if tag == latest and trackers:
            note = f"named by {trackers[0]}"
            verdict = replace(
                verdict,
                reason=f"{note}; {verdict.reason}"
                if verdict.status is CheckpointStatus.VALID
                else f"{note} but {verdict.reason}",
            )
        found.append(verdict)
    return found, {*tags, *trackers}


def _check_tag(path: Path, step: int | None) -> Candidate:
    names = os.listdir(path)
    model = {n: (int(m.group(1) or 0), int(m.group(2))) for n in names if (m := _MODEL.match(n))}
    optim: dict[int, set[int]] = {}
    for n in names:
        if m := _OPTIM.match(n):
            optim.setdefault(int(m.group(2)), set()).add(int(m.group(1)))
    if not model:
        return incomplete(path, _FMT, step, "no *_model_states.pt file")
    first = path / min(model)
    fields = torch_save_fields(first, ("mp_world_size", "dp_world_size", "global_steps"))
    if step is None and isinstance(fields.get("global_steps"), int):
        step = fields["global_steps"]
    mp_ranks = {mp for _, mp in model.values()}
    mp_size = max(max(mp_ranks) + 1, fields.get("mp_world_size", 0))
    missing_mp = sorted(set(range(mp_size)) - mp_ranks)
    if missing_mp:
        return incomplete(
            path, _FMT, step, f"model states of model-parallel rank {missing_mp[0]} missing ({mp_size} expected)"
        )
    if optim:
        dp_size = max(max(max(r) for r in optim.values()) + 1, fields.get("dp_world_size", 0))
        for mp in range(mp_size):
            have = optim.get(mp, set())
            absent = sorted(set(range(dp_size)) - have)
            if absent:
                return incomplete(
                    path,
                    _FMT,
                    step,
                    f"ZeRO optimizer shard of data-parallel rank {absent[0]} (model-parallel rank {mp}) missing: "
                    f"{len(have)} of {dp_size}",
                )
    for n in sorted(names):
        if _MODEL.match(n) or _OPTIM.match(n):
            problem = torch_save_problem(path / n)
            if problem is not None:
                return incomplete(path, _FMT, step, problem)
    shards = sum(len(r) for r in optim.values())
    newest = max((t for n in names if (t := modified_at(path / n)) is not None), default=None)
    return Candidate(
        path,
        _FMT,
        step,
        CheckpointStatus.VALID,
        f"{len(model)} model state file(s), {shards} ZeRO shard(s) complete",
        newest,
    )
