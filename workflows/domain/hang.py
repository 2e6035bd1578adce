"""A hang check's settings and verdict: what the watch reports and the incident keeps (the rules that produce the
verdict are ``workflows.policy.hang``)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from workflows.domain.base import Frozen


class HangPolicy(Frozen):
    """How long silence must last before a job counts as hung."""

    k: float = Field(5.0, gt=0, le=1000)
    """Multiplier of the p99 gap between step lines."""
    floor_s: float = Field(60.0, ge=0)
    """The learned window is never shorter: covers GC pauses, slow storage, a log buffer flushed late."""
    startup_s: float = Field(900.0, ge=0)
    """Window until enough gaps are learned, and after a restart until the first step: model and checkpoint load."""
    min_intervals: int = Field(20, ge=1)
    """Gaps (pooled across ranks) needed before the learned window applies."""
    longest_factor: float = Field(1.5, ge=0)
    """Multiplier of the longest gap the job ever came back from; 0 turns this guard off."""
    override_s: float | None = Field(None, gt=0)
    """The job's own window (``RecoverySpec.hang_after_s``): replaces the learned one, not the startup window."""
    require_progress_seen: bool = True
    """No verdict until a step line (or a heartbeat file's touch) was seen at all (an unrecognised log format is
    not a hang)."""
    silent_default_s: float = Field(1800.0, gt=0)
    """For a job that prints no step line: the window when it names none (``hang=``) and its checkpoint cadence is
    not learned yet (ranks parked in one collective this long, or no checkpoint, heartbeat or CPU time)."""
    cadence_factor: float = Field(2.0, ge=1.0, le=100)
    """For a job that prints no step line: the window learned from its checkpoints is this many times the longest
    interval between two of its saves."""
    cadence_min_intervals: int = Field(2, ge=1)
    """Intervals between saves needed before the checkpoint cadence sets the window."""


class WindowBasis(StrEnum):
    """Which rule set the window."""

    STARTUP = "startup"
    FLOOR = "floor"
    LEARNED = "learned"
    """``k`` x p99 of the recent gaps."""
    LONGEST = "longest"
    """``longest_factor`` x the longest gap the job came back from."""
    OVERRIDE = "override"
    CHECKPOINT_CADENCE = "checkpoint_cadence"
    """A job without step lines: ``cadence_factor`` x the longest interval between its checkpoint saves."""
    DEFAULT = "default"
    """A job without step lines and no learned cadence: the operator's ``silent_default_s``."""


class RankSilence(Frozen):
    """One rank at the time of the assessment."""

    rank: int
    node: str = ""
    last_step: int | None = None
    silent_for_s: float | None = None
    """Since its latest step line or activity; None if it was never heard from."""


class HangVerdict(Frozen):
    hung: bool
    window_s: float
    basis: WindowBasis
    window_detail: str
    """How the window was derived, with the numbers."""
    silent_for_s: float | None = None
    """Since the latest sign of progress of any rank (or the start of watching/of the attempt)."""
    stalled_ranks: tuple[int, ...] = ()
    """Ranks silent for at least the window."""
    unseen_ranks: tuple[int, ...] = ()
    """Expected ranks never heard from (often ranks that do not log steps; never named culprit)."""
    ranks: tuple[RankSilence, ...] = ()
    culprit_rank: int | None = None
    """When hung: the rank whose progress stopped first."""
    culprit_node: str = ""
    confidence: float = Field(0.0, ge=0, le=1)
    summary: str = ""
