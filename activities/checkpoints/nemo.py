"""NeMo 2 checkpoints (``nemo/lightning/pytorch/callbacks/model_checkpoint.py``): ``<name>--...-step=N[-last]/``
directories with ``weights/`` (a Megatron distributed save: ``metadata.json``, ``.metadata``, ``*.distcp``) and
``context/``. While a save runs, NeMo keeps an empty ``<checkpoint>-unfinished`` marker beside it (the checkpoint
path without ``.nemo``/``.ckpt``/``-EMA``, plus ``-unfinished``) and removes it once the save is final; NeMo's
AutoResume drops checkpoints that still have one.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

from activities.checkpoints.dcp import check_dcp, is_dcp_dir
from activities.checkpoints.files import Candidate, guarded, incomplete, step_in_name
from workflows.domain.checkpoints import CheckpointFormat, CheckpointStatus

__all__ = ["UNFINISHED_SUFFIX", "find", "unfinished_marker"]

_FMT = CheckpointFormat.NEMO
UNFINISHED_SUFFIX = "-unfinished"


def unfinished_marker(checkpoint: Path) -> Path:
    """Where NeMo puts the marker of an unfinished save of ``checkpoint`` (file or directory)."""
    name = checkpoint.name.removesuffix(".nemo").removesuffix(".ckpt").removesuffix("-EMA")
    return checkpoint.with_name(name + UNFINISHED_SUFFIX)


def find(root: Path, names: list[str]) -> tuple[list[Candidate], set[str]]:
    """NeMo's checkpoint directories among ``names`` (entries of ``root``), and the names it claims (their
    markers too; a marker whose checkpoint is a ``.ckpt`` file is left to the Lightning check, which reads it)."""
    found: list[Candidate] = []
    claimed: set[str] = set()
    for name in names:
        path = root / name
        if not path.is_dir() or name.endswith(".ckpt"):
            continue
        if (path / "weights").is_dir() or (path / "context").is_dir() or unfinished_marker(path).exists():
            step = step_in_name(name)
            found.append(guarded(path, _FMT, step, partial(_check, path, step)))
            claimed.update({name, unfinished_marker(path).name})
    return found, claimed


def _check(path: Path, step: int | None) -> Candidate:
    marker = unfinished_marker(path)
    if marker.exists():
        return incomplete(path, _FMT, step, f"{marker.name} marker present: the save did not finish")
    weights = path / "weights"
    if not weights.is_dir():
        return incomplete(path, _FMT, step, "no weights/ directory")
    if not (weights / "metadata.json").exists() and is_dcp_dir(weights):
        return incomplete(path, _FMT, step, "weights/metadata.json missing: the distributed save did not finish")
    verdict = check_dcp(weights, _FMT, step)
    if verdict.status is not CheckpointStatus.VALID:
        return replace(verdict, path=path, reason=f"weights/: {verdict.reason}")
    if not (path / "context").is_dir():
        return incomplete(path, _FMT, step, "no context/ directory (NeMo writes it with the weights)")
    return Candidate(
        path, _FMT, step, CheckpointStatus.VALID, f"no -unfinished marker, weights/ {verdict.reason}", verdict.saved_at
    )
