"""What a job's checkpoint directory holds, as Rebound checked it: the contract between the checkpoint scanner
(``activities/checkpoints/``), the ``rebound checkpoints`` command and the JobRecovery workflow, which records the
latest valid checkpoint before every restart and verifies the resume against it.

A checkpoint is *valid* when its format's completion marker exists and every file that marker promises is present
and large enough; *incomplete* when a save was started and not finished (no marker, a missing or short shard, an
``-unfinished`` sibling, a tracker pointing at a partial save); *unreadable* when Rebound could not look (no
permission, an I/O error): a failed lookup is never read as a state.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from workflows.domain.base import Frozen

__all__ = [
    "CheckedCheckpoint",
    "CheckpointFallback",
    "CheckpointFormat",
    "CheckpointQuarantineInput",
    "CheckpointQuarantineResult",
    "CheckpointRef",
    "CheckpointReport",
    "CheckpointRestoreResult",
    "CheckpointScanInput",
    "CheckpointStatus",
    "IncompleteCheckpoint",
    "QuarantineAction",
]


class CheckpointFormat(StrEnum):
    """The layouts Rebound knows (``shared/facts/checkpoints.md``)."""

    TORCH_DCP = "torch_dcp"
    TORCHTITAN = "torchtitan"
    MEGATRON = "megatron"
    NEMO = "nemo"
    HF_TRAINER = "hf_trainer"
    LIGHTNING = "lightning"
    DEEPSPEED = "deepspeed"
    REBOUND_DEMO = "rebound_demo"
    TORCH_SAVE = "torch_save"
    """A plain ``torch.save`` file that no framework layout above claims."""


class CheckpointStatus(StrEnum):
    VALID = "valid"
    INCOMPLETE = "incomplete"
    UNREADABLE = "unreadable"


class CheckpointRef(Frozen):
    """One valid checkpoint: where it is, the training step it holds, when its completion marker was written."""

    path: str
    step: int | None
    saved_at: datetime | None
    """The modification time of the completion marker (UTC), None when the format has none to read."""
    format: CheckpointFormat


class IncompleteCheckpoint(Frozen):
    """A save that was started and not finished, and why Rebound says so."""

    path: str
    step: int | None
    reason: str


class CheckedCheckpoint(Frozen):
    """Every candidate the scan looked at, with its verdict."""

    path: str
    format: CheckpointFormat
    step: int | None
    status: CheckpointStatus
    reason: str


class CheckpointReport(Frozen):
    """A directory's checkpoints: the newest valid one (several formats in one directory: the newest wins), the
    incomplete ones, and every candidate checked. ``format`` is the format of ``latest_valid`` (else of the newest
    candidate, else None when nothing was recognised)."""

    dir: str
    format: CheckpointFormat | None
    latest_valid: CheckpointRef | None
    incomplete: tuple[IncompleteCheckpoint, ...] = ()
    checked: tuple[CheckedCheckpoint, ...] = ()
    error: str | None = None
    """Set when the directory itself could not be read (missing, no permission): nothing else is then known."""


class CheckpointFallback(StrEnum):
    """What Rebound may do about a partial newest checkpoint before a restart (``ckpt_fallback=``; default off)."""

    OFF = "off"
    """Report it (the incident names it); touch nothing."""
    QUARANTINE = "quarantine"
    """Set it aside (rename it, or point the tracker at the previous valid save) so the framework's own resume
    picks the previous complete one; ``rebound checkpoints restore DIR`` undoes it."""


class CheckpointScanInput(Frozen):
    """``checkpoint_scan``: the job's checkpoint directory."""

    dir: str


class QuarantineAction(StrEnum):
    NOTHING = "nothing"
    """No partial checkpoint newer than the latest valid one (or one already set aside): nothing to do."""
    QUARANTINED = "quarantined"
    REFUSED = "refused"
    """Not done, and why is in ``reason``: a symlinked or foreign-owned path, no valid checkpoint to fall back to,
    an unreadable directory."""


class CheckpointQuarantineInput(Frozen):
    """``checkpoint_quarantine``: set aside the partial checkpoints newer than the latest valid one in ``dir``."""

    dir: str
    expected_owner_uid: int | None = None
    """The job's user (``SlurmJob.user_id``): every path moved or rewritten must belong to it. The activity refuses
    without it; the library and ``rebound checkpoints restore`` then use the directory's own owner."""


class CheckpointQuarantineResult(Frozen):
    action: QuarantineAction
    reason: str
    fallback: CheckpointRef | None = None
    """The checkpoint the framework's resume should now pick."""
    set_aside: tuple[str, ...] = ()
    """Paths renamed into the quarantine folder, and trackers rewritten (their originals kept beside them)."""


class CheckpointRestoreResult(Frozen):
    """``rebound checkpoints restore DIR``: what was put back, and what could not be (a new save took its name)."""

    restored: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    summary: str = ""
