"""The Rebound demo job's layout (``deploy/demo/checkpoint.py``): ``step_000120/`` with ``state.pt``,
``meta.json`` and ``COMPLETE`` (``"<sha256>  state.pt"``, written last and atomically). A save is written into
``.tmp-step_000120-<pid>/`` first, so such a directory is an unfinished save.
"""

from __future__ import annotations

import hashlib
import re
from functools import partial
from pathlib import Path

from activities.checkpoints.files import Candidate, guarded, incomplete, modified_at, problem_or_valid
from workflows.domain.checkpoints import CheckpointFormat

__all__ = ["find"]

_FMT = CheckpointFormat.REBOUND_DEMO
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_DIR = re.compile(r"^\.tmp-step_(\d+)-\d+$")
_MARKER, _PAYLOAD = "COMPLETE", "state.pt"


def find(root: Path, names: list[str]) -> tuple[list[Candidate], set[str]]:
    """The demo's checkpoints among ``names`` (entries of ``root``), and the names it claims."""
    found: list[Candidate] = []
    claimed: set[str] = set()
    for name in names:
        path = root / name
        if (m := _STEP_DIR.match(name)) and path.is_dir() and ((path / _PAYLOAD).exists() or (path / _MARKER).exists()):
            step = int(m.group(1))
            found.append(guarded(path, _FMT, step, partial(_check, path, step)))
            claimed.add(name)
        elif (m := _TMP_DIR.match(name)) and path.is_dir():
            found.append(incomplete(path, _FMT, int(m.group(1)), "temporary directory of an unfinished save"))
            claimed.add(name)
    return found, claimed


def _check(path: Path, step: int) -> Candidate:
    marker = path / _MARKER
    if not marker.exists():
        return incomplete(path, _FMT, step, f"no {_MARKER} marker (written last: the save did not finish)")
    parts = marker.read_text(errors="replace").split()
    if len(parts) != 2 or not re.fullmatch(r"[0-9a-f]{64}", parts[0]) or parts[1] != _PAYLOAD:
        return incomplete(path, _FMT, step, f"malformed {_MARKER} marker")
    digest = hashlib.sha256()
    with (path / _PAYLOAD).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    problem = None if digest.hexdigest() == parts[0] else f"{_PAYLOAD} does not match the checksum in {_MARKER}"
    return problem_or_valid(
        path, _FMT, step, problem, f"{_MARKER} present, {_PAYLOAD} checksum matches", modified_at(marker)
    )
