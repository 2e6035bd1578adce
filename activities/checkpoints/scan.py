"""``scan_checkpoints(DIR)``: every checkpoint in a job's checkpoint directory, each checked, the newest valid one.

Each format module looks at the directory's entries and claims the names it understands (in the order of
``_FORMATS``: the specific layouts before the generic ones, so a Hugging Face ``checkpoint-N`` is never also taken
for a plain DCP directory); what is left is looked at as plain ``torch.save`` files and DCP directories. When DIR
is itself one DCP save (its ``.metadata`` inside), that save is checked too. Several formats in one directory are
each checked, and the newest valid checkpoint wins: the highest step, then the latest completion marker.

Nothing is loaded and nothing pickled is run (``files``, ``inert_pickle``). A directory that cannot be listed
gives a report with ``error`` set and nothing else: a failed lookup is never read as "no checkpoint".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from activities.checkpoints import deepspeed, demo, hf_trainer, lightning, megatron, nemo, torch_save, torchtitan
from activities.checkpoints.dcp import check_dcp, is_dcp_dir
from activities.checkpoints.files import Candidate, step_in_name
from workflows.domain.checkpoints import (
    CheckedCheckpoint,
    CheckpointFormat,
    CheckpointRef,
    CheckpointReport,
    CheckpointStatus,
    IncompleteCheckpoint,
)

__all__ = ["candidates", "newest_first", "report_of", "scan_checkpoints"]

Finder = Callable[[Path, list[str]], tuple[list[Candidate], set[str]]]
_FORMATS: tuple[Finder, ...] = (
    demo.find,
    hf_trainer.find,
    torchtitan.find,
    megatron.find,
    deepspeed.find,
    nemo.find,
    lightning.find,
    torch_save.find,
)
_EPOCH = datetime.min.replace(tzinfo=UTC)


def scan_checkpoints(directory: Path) -> CheckpointReport:
    """Discover and check every checkpoint in ``directory``; never raises for an unreadable directory.

    Args:
        directory: The job's checkpoint directory (``ckpt=`` in its opt-in comment).

    Returns:
        The report: the newest valid checkpoint, the incomplete ones, every candidate checked; ``error`` set when
        the directory itself could not be read.
    """
    try:
        found = candidates(directory)
    except OSError as e:
        return CheckpointReport(
            dir=str(directory), format=None, latest_valid=None, error=f"cannot read {directory}: {e.strerror or e}"
        )
    return report_of(directory, found)


def candidates(directory: Path) -> list[Candidate]:
    """Every candidate in ``directory``, newest first.

    Raises:
        OSError: The directory cannot be listed (missing, not a directory, no permission).
    """
    names = sorted(os.listdir(directory))
    found: list[Candidate] = []
    if is_dcp_dir(directory) and not any(n.startswith(("iter_", "checkpoint-", "step-")) for n in names):
        found.append(check_dcp(directory, CheckpointFormat.TORCH_DCP, step_in_name(directory.name)))
        names = [n for n in names if not n.endswith((".distcp", ".metadata", ".metadata.tmp"))]
    for find in _FORMATS:
        more, claimed = find(directory, names)
        found.extend(more)
        names = [n for n in names if n not in claimed]
    return newest_first(found)


def newest_first(found: Iterable[Candidate]) -> list[Candidate]:
    """Highest step first (a checkpoint without one after those with one), then the latest completion marker."""
    return sorted(
        found,
        key=lambda c: (c.step is not None, c.step or 0, c.saved_at or _EPOCH, str(c.path)),
        reverse=True,
    )


def report_of(directory: Path, found: list[Candidate]) -> CheckpointReport:
    """The report of ``found`` (newest first, as ``candidates`` returns them)."""
    latest = next((c for c in found if c.status is CheckpointStatus.VALID), None)
    fmt = latest.format if latest is not None else (found[0].format if found else None)
    return CheckpointReport(
        dir=str(directory),
        format=fmt,
        latest_valid=None
        if latest is None
        else CheckpointRef(path=str(latest.path), step=latest.step, saved_at=latest.saved_at, format=latest.format),
        incomplete=tuple(
            IncompleteCheckpoint(path=str(c.path), step=c.step, reason=c.reason)
            for c in found
            if c.status is CheckpointStatus.INCOMPLETE
        ),
        checked=tuple(
            CheckedCheckpoint(path=str(c.path), format=c.format, step=c.step, status=c.status, reason=c.reason)
            for c in found
        ),
    )
