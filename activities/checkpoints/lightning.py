"""PyTorch Lightning checkpoints (``src/lightning/pytorch/callbacks/model_checkpoint.py``): ``*.ckpt`` files
written by ``torch.save`` through an atomic save, ``last.ckpt`` as a copy or (``save_last="link"``) a symlink to
the newest one, and sharded (FSDP) checkpoints: a ``*.ckpt`` directory of DCP files plus ``meta.pt``, which is
written after the shards. A broken ``last.ckpt`` symlink means the checkpoint it named is gone. Under NeMo a
``<name>-unfinished`` marker beside a ``.ckpt`` says its save did not finish.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from activities.checkpoints.dcp import check_dcp
from activities.checkpoints.files import (
    TMP_SUFFIXES,
    Candidate,
    guarded,
    incomplete,
    modified_at,
    problem_or_valid,
    step_in_name,
    torch_save_fields,
    torch_save_problem,
)
from activities.checkpoints.nemo import unfinished_marker
from workflows.domain.checkpoints import CheckpointFormat, CheckpointStatus

__all__ = ["META", "find"]

_FMT = CheckpointFormat.LIGHTNING
META = "meta.pt"


def find(root: Path, names: list[str]) -> tuple[list[Candidate], set[str]]:
    """Lightning's checkpoints among ``names`` (entries of ``root``), and the names it claims."""
    found: list[Candidate] = []
    claimed: set[str] = set()
    for name in names:
        base = _without_tmp_suffix(name)
        if base != name and base.endswith(".ckpt"):
            found.append(incomplete(root / name, _FMT, step_in_name(base), "temporary file of an unfinished save"))
            claimed.add(name)
        elif name.endswith(".ckpt"):
            path = root / name
            found.append(guarded(path, _FMT, step_in_name(name), partial(_check, path)))
            claimed.update({name, unfinished_marker(path).name})
    return found, claimed


def _check(path: Path) -> Candidate:
    step = step_in_name(path.name)
    marker = unfinished_marker(path)
    if marker.exists():
        return incomplete(path, _FMT, step, f"{marker.name} marker present: the save did not finish")
    if path.is_symlink():
        target = Path(os.readlink(path))
        step = step if step is not None else step_in_name(target.name)
        if not path.exists():
            return incomplete(path, _FMT, step, f"symlink to {target}, which does not exist")
    if path.is_dir():
        if not (path / META).exists():
            return incomplete(path, _FMT, step, f"sharded checkpoint without {META} (written after the shards)")
        problem = torch_save_problem(path / META)
        if problem is not None:
            return incomplete(path, _FMT, step, problem)
        if step is None:
            step = _global_step(path / META)
        verdict = check_dcp(path, _FMT, step)
        if verdict.status is not CheckpointStatus.VALID:
            return verdict
        return Candidate(
            path, _FMT, step, CheckpointStatus.VALID, f"{META} and {verdict.reason}", modified_at(path / META)
        )
    problem = torch_save_problem(path)
    if problem is None and step is None:
        step = _global_step(path)
    return problem_or_valid(path, _FMT, step, problem, "torch.save archive complete", modified_at(path))


def _without_tmp_suffix(name: str) -> str:
    for suffix in TMP_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def _global_step(path: Path) -> int | None:
    value = torch_save_fields(path, ("global_step",)).get("global_step")
    return value if isinstance(value, int) else None
