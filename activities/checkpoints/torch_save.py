"""A plain ``torch.save`` file (``*.pt``, ``*.pth``, ``*.bin``, ``*.tar``) that no framework layout claims, and
plain DCP directories. The step comes from the name (``step_120.pt``), else from a ``step``/``global_step``/
``iteration`` value in the file, read without running it.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

from activities.checkpoints.dcp import check_dcp, is_dcp_dir
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
from workflows.domain.checkpoints import CheckpointFormat

__all__ = ["find"]

_FMT = CheckpointFormat.TORCH_SAVE
_SUFFIXES = (".pt", ".pth", ".bin", ".tar")
_STEP_FIELDS = ("step", "global_step", "iteration")
_TRAILING_NUMBER = re.compile(r"(\d+)$")


def find(root: Path, names: list[str]) -> tuple[list[Candidate], set[str]]:
    """Plain ``torch.save`` files and DCP directories among ``names`` (entries of ``root``) and their leftover
    temporary files, and the names it claims."""
    found: list[Candidate] = []
    claimed: set[str] = set()
    for name in names:
        path = root / name
        base = name
        for suffix in TMP_SUFFIXES:
            base = base.removesuffix(suffix)
        if base != name and base.endswith(_SUFFIXES):
            found.append(incomplete(path, _FMT, step_in_name(base), "temporary file of an unfinished save"))
        elif name.endswith(_SUFFIXES) and not path.is_dir():
            found.append(guarded(path, _FMT, step_in_name(name), partial(_check, path)))
        elif path.is_dir() and is_dcp_dir(path):
            m = _TRAILING_NUMBER.search(name)
            step = step_in_name(name) if step_in_name(name) is not None else (int(m.group(1)) if m else None)
            found.append(check_dcp(path, CheckpointFormat.TORCH_DCP, step))
        else:
            continue
        claimed.add(name)
    return found, claimed


def _check(path: Path) -> Candidate:
    step = step_in_name(path.name)
    problem = torch_save_problem(path)
    if problem is None and step is None:
        fields = torch_save_fields(path, _STEP_FIELDS)
        step = next((v for f in _STEP_FIELDS if isinstance(v := fields.get(f), int)), None)
    return problem_or_valid(path, _FMT, step, problem, "torch.save archive complete", modified_at(path))
