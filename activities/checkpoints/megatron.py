"""Megatron-LM / Megatron-Core checkpoints (``megatron/training/checkpointing.py``).

``latest_checkpointed_iteration.txt`` (the tracker) holds the iteration of the last finished save (or ``release``)
and is what Megatron resumes from; it is written by rank 0 after the save (in the finalize function when the save
is asynchronous), not atomically, so it can be empty, name a directory that is not there (ahead) or lag a newer
directory (behind). ``iter_{:07d}/`` holds either the legacy layout, ``mp_rank_{tp:02d}[_{pp:03d}]/
model_optim_rng.pt`` (+ ``distrib_optim.pt``) for every tensor- and pipeline-parallel rank, or a distributed save
(``torch_dist``: ``metadata.json``, written when the save is complete, ``common.pt``, ``.metadata``, ``*.distcp``).

A directory newer than a readable tracker was not finalised: Megatron would resume from the tracker's iteration,
so it is reported incomplete. With no readable tracker every directory is judged by its content alone.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from functools import partial
from pathlib import Path

from activities.checkpoints.dcp import check_dcp, is_dcp_dir
from activities.checkpoints.files import (
    Candidate,
    guarded,
    incomplete,
    json_file,
    modified_at,
    torch_save_fields,
    torch_save_problem,
    unreadable,
)
from workflows.domain.checkpoints import CheckpointFormat, CheckpointStatus

__all__ = ["TRACKER", "find", "iteration_dir_name", "read_tracker"]

_FMT = CheckpointFormat.MEGATRON
TRACKER = "latest_checkpointed_iteration.txt"
_ITER = re.compile(r"^iter_(\d{7,})$")
_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")  # tensor, pipeline, expert rank
_MODEL_FILES = ("model_optim_rng.pt", "model_rng.pt")


def iteration_dir_name(iteration: int | None) -> str:
    """``iter_0000120``; ``release`` for None (a released model)."""
    return "release" if iteration is None else f"iter_{iteration:07d}"


def read_tracker(root: Path) -> tuple[int | None, str | None]:
    """The tracker's iteration (None for ``release``) and the problem with it (None when it is readable).

    Raises:
        OSError: It cannot be read (``FileNotFoundError`` when there is none).
    """
    text = (root / TRACKER).read_text(errors="replace").strip()
    if not text:
        return None, f"{TRACKER} is empty: Megatron cannot resume until it names a save"
    if text == "release":
        return None, None
    if not text.isdigit():
        return None, f"{TRACKER} holds {text[:40]!r}, not an iteration"
    return int(text), None


def find(root: Path, names: list[str]) -> tuple[list[Candidate], set[str]]:
    """Megatron's checkpoints under ``root`` (its tracker and ``iter_*`` directories) and the names it claims."""
    iters = {int(m.group(1)): n for n in names if (m := _ITER.match(n)) and (root / n).is_dir()}
    has_tracker = TRACKER in names
    if not iters and not has_tracker:
        return [], set()
    claimed = {*iters.values(), TRACKER}
    found: list[Candidate] = []
    tracked: int | None = None
    tracker_ok = False
    if has_tracker:
        try:
            tracked, problem = read_tracker(root)
        except OSError as e:
            found.append(unreadable(root / TRACKER, _FMT, None, e))
            problem = "unreadable"
        else:
            if problem is not None:
                found.append(incomplete(root / TRACKER, _FMT, None, problem))
            tracker_ok = problem is None
        if tracker_ok and tracked is None:  # release
            claimed.add("release")
            found.append(guarded(root / "release", _FMT, None, partial(_check_iter, root / "release", None)))
        elif tracker_ok and tracked is not None and tracked not in iters:
            name = iteration_dir_name(tracked)
            found.append(
                incomplete(
                    root / name, _FMT, tracked, f"{TRACKER} names iteration {tracked} but {name}/ does not exist"
                )
            )
    for iteration, name in sorted(iters.items()):
        path = root / name
        if tracker_ok and tracked is not None and iteration > tracked:
            found.append(
                incomplete(
                    path,
                    _FMT,
                    iteration,
                    f"newer than {TRACKER} ({tracked}): the save was not finalised; Megatron resumes from {tracked}",
                )
            )
            continue
        verdict = guarded(path, _FMT, iteration, partial(_check_iter, path, iteration))
        if tracker_ok and iteration == tracked and verdict.status is CheckpointStatus.VALID:
            verdict = replace(
                verdict, reason=f"named by {TRACKER}; {verdict.reason}", saved_at=modified_at(root / TRACKER)
            )
        elif tracker_ok and iteration == tracked:
            verdict = replace(verdict, reason=f"named by {TRACKER} but {verdict.reason}")
        found.append(verdict)
    return found, claimed


def _check_iter(path: Path, iteration: int | None) -> Candidate:
    names = sorted(os.listdir(path))
    if "metadata.json" in names or is_dcp_dir(path):
        return _check_distributed(path, iteration, names)
    ranks = {
        (int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0)): n for n in names if (m := _RANK_DIR.match(n))
    }
    if not ranks:
        return incomplete(path, _FMT, iteration, "no mp_rank_* directories and no metadata.json")
    tp = 1 + max(r[0] for r in ranks)
    pp = 1 + max(r[1] for r in ranks)
    ep = 1 + max(r[2] for r in ranks)
    first = path / ranks[min(ranks)]
    model = next((first / f for f in _MODEL_FILES if (first / f).exists()), first / _MODEL_FILES[0])
    sizes = torch_save_fields(model, ("args.tensor_model_parallel_size", "args.pipeline_model_parallel_size"))
    tp = max(tp, sizes.get("args.tensor_model_parallel_size", tp))
    pp = max(pp, sizes.get("args.pipeline_model_parallel_size", pp))
    missing = [(t, p, e) for t in range(tp) for p in range(pp) for e in range(ep) if (t, p, e) not in ranks]
    if missing:
        t, p, e = missing[0]
        return incomplete(
            path,
            _FMT,
            iteration,
            f"rank directory {_rank_dir_name(t, p, e, pp, ep)} missing ({tp}x{pp}x{ep} tensor x pipeline x expert)",
        )
    distrib = any((path / n / "distrib_optim.pt").exists() for n in ranks.values())
    for name in ranks.values():
        rank_dir = path / name
        model_file = next((rank_dir / f for f in _MODEL_FILES if (rank_dir / f).exists()), rank_dir / _MODEL_FILES[0])
        problem = torch_save_problem(model_file)
        if problem is None and distrib:
            problem = torch_save_problem(rank_dir / "distrib_optim.pt")
        if problem is not None:
            return incomplete(path, _FMT, iteration, f"{name}/{problem}")
    marks = [modified_at(path / n / f) for n in ranks.values() for f in _MODEL_FILES]
    newest = max((m for m in marks if m is not None), default=None)
    return Candidate(path, _FMT, iteration, CheckpointStatus.VALID, f"{len(ranks)} rank file(s) complete", newest)


def _rank_dir_name(tp: int, pp: int, ep: int, pp_size: int, ep_size: int) -> str:
    name = f"mp_rank_{tp:02d}"
    if pp_size > 1 or ep_size > 1:
        name += f"_{pp:03d}"
    if ep_size > 1:
        name += f"_{ep:03d}"
    return name


def _check_distributed(path: Path, iteration: int | None, names: list[str]) -> Candidate:
    if "metadata.json" not in names:
        return incomplete(path, _FMT, iteration, "no metadata.json: the distributed save did not finish")
    try:
        meta = json_file(path / "metadata.json")
    except ValueError as e:
        return incomplete(path, _FMT, iteration, str(e))
    backend = meta.get("sharded_backend") if isinstance(meta, dict) else None
    if backend != "torch_dist":
        return Candidate(
            path,
            _FMT,
            iteration,
            CheckpointStatus.VALID,
            f"metadata.json present (backend {backend}: shards not checked)",
            modified_at(path / "metadata.json"),
        )
    if "common.pt" in names and (problem := torch_save_problem(path / "common.pt")) is not None:
        return incomplete(path, _FMT, iteration, problem)
    verdict = check_dcp(path, _FMT, iteration)
    if verdict.status is not CheckpointStatus.VALID:
        return verdict
    return replace(verdict, reason=f"metadata.json and {verdict.reason}", saved_at=modified_at(path / "metadata.json"))
