"""The checkpoint a restart resumes from: what the incident records before the restart (the latest valid
checkpoint, its step and age, the steps that will be redone, a partial newer save), and what the resume check
concluded about where the restarted job really started. The rules are ``workflows.policy.resume_point``."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from workflows.domain.base import Frozen
from workflows.domain.checkpoints import CheckedCheckpoint, CheckpointRef, IncompleteCheckpoint

__all__ = ["ResumePoint", "RestartCheckpoint"]


class RestartCheckpoint(Frozen):
    """The job's checkpoints as a restart finds them, recorded in the incident before the restart."""

    dir: str
    latest_valid: CheckpointRef | None = None
    """The checkpoint the restarted job should resume from; None: it restarts from scratch."""
    age_s: float | None = Field(None, ge=0)
    """Seconds between its completion and the scan."""
    last_seen_step: int | None = None
    """The highest step the job logged before the incident (None: it logs no steps)."""
    steps_lost: int | None = Field(None, ge=0)
    """``last_seen_step - latest_valid.step``: the steps the restart will redo."""
    partial_newest: IncompleteCheckpoint | None = None
    """A save newer than ``latest_valid`` that was started and not finished (the framework may try to load it)."""
    previous_valid: CheckedCheckpoint | None = None
    """The newest valid checkpoint older than ``latest_valid``: what is left if ``latest_valid`` cannot be loaded."""
    quarantined: tuple[str, ...] = ()
    """What ``ckpt_fallback=quarantine`` set aside before the restart (paths moved, trackers rewritten)."""
    error: str = ""
    """The directory could not be scanned: nothing is known about its checkpoints (never read as "none")."""
    summary: str = ""


class ResumePoint(StrEnum):
    """Where the restarted job started, against the checkpoint recorded before the restart."""

    VERIFIED = "verified"
    """From that checkpoint: its own load line names it, or its first step follows the checkpoint's step."""
    FROM_SCRATCH = "from_scratch"
    """From step 0 although a valid checkpoint existed: an incident, not a success."""
    OTHER = "other"
    """From another checkpoint than the latest valid one (an older one: more steps redone)."""
    UNCONFIRMED = "unconfirmed"
    """Nothing said where it started (no load line, no step line, or a step the rules cannot place)."""
    NO_CHECKPOINT = "no_checkpoint"
    """No valid checkpoint existed (or none was looked for): from scratch is what it could do."""
