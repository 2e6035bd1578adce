"""torchtitan's ``step-N/`` directories (``torchtitan/components/checkpoint.py``): a DCP save (``.metadata``), or
model-only safetensors with ``model.safetensors.index.json``. torchtitan's own ``_find_load_step`` skips a
directory with neither; its purge does not check validity, so a partial newest one stays on disk.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from activities.checkpoints.dcp import check_dcp, is_dcp_dir
from activities.checkpoints.files import Candidate, find_step_dirs, incomplete, modified_at, problem_or_valid
from activities.checkpoints.weights import SAFETENSORS_INDEX, index_problem
from workflows.domain.checkpoints import CheckpointFormat

__all__ = ["find"]

_FMT = CheckpointFormat.TORCHTITAN
_DIR = re.compile(r"^step-(\d+)$")


def find(root: Path, names: list[str]) -> tuple[list[Candidate], set[str]]:
    """torchtitan's checkpoints among ``names`` (entries of ``root``), and the names it claims."""
    return find_step_dirs(root, names, _DIR, _FMT, _check)


def _check(path: Path, step: int) -> Candidate:
    names = os.listdir(path)  # raises when the directory cannot be read: unreadable, not incomplete
    if SAFETENSORS_INDEX in names:
        return problem_or_valid(
            path,
            _FMT,
            step,
            index_problem(path, SAFETENSORS_INDEX),
            f"{SAFETENSORS_INDEX}: every shard complete",
            modified_at(path / SAFETENSORS_INDEX),
        )
    if is_dcp_dir(path):
        return check_dcp(path, _FMT, step)
    return incomplete(path, _FMT, step, f"neither .metadata nor {SAFETENSORS_INDEX}: the save did not finish")
