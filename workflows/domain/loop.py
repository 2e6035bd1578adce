"""Inputs and results of the recovery loop's activities: watch, attribute, drain, requeue, wait for resume."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from workflows.domain.base import Frozen
from workflows.domain.gpu import GpuEvent
from workflows.domain.incident import Anomaly, Attribution, LogFinding
from workflows.domain.slurm import JobState, SlurmJob


class JobWatchInput(Frozen):
    """Watch one job until something changes or goes wrong."""

    job_id: int
    log_patterns: tuple[str, ...] = ()
    offsets: dict[str, int] = {}
    poll_interval_s: float = Field(1.0, gt=0)
    last_state: JobState | None = None
    last_restart_count: int = 0


class WatchOutcome(StrEnum):
    CHANGED = "changed"
    """The job changed state or restart count without evidence of a failure (e.g. PENDING -> RUNNING)."""
    ANOMALY = "anomaly"
    GONE = "gone"
    """The scheduler no longer lists the job."""


class JobWatchResult(Frozen):
    outcome: WatchOutcome
    observed_at: datetime
    job: SlurmJob | None = None
    anomaly: Anomaly | None = None
    findings: tuple[LogFinding, ...] = ()
    offsets: dict[str, int] = {}
    polls: int = 0


class AttributeInput(Frozen):
    """Gather evidence for an anomaly (a short settle window for late log lines, node states) and attribute it."""

    job_id: int
    anomaly: Anomaly
    job_nodes: tuple[str, ...] = ()
    task_count: int = 0
    log_patterns: tuple[str, ...] = ()
    offsets: dict[str, int] = {}
    findings: tuple[LogFinding, ...] = ()
    gpu_events: tuple[GpuEvent, ...] = ()
    settle_s: float = Field(1.0, ge=0)
    """Keep reading logs this long: a peer's error or srun's summary often lands a moment after the first line."""
    corroborate_s: float = Field(10.0, ge=0)
    """When only silence points at a node, wait up to this long for the scheduler to confirm it is down."""


class AttributeResult(Frozen):
    attribution: Attribution
    offsets: dict[str, int] = {}
    findings: tuple[LogFinding, ...] = ()
    job_state: JobState | None = None
    """The job's state at the end of the settle window: CANCELLED means its owner stopped it, not a failure."""


class DrainInput(Frozen):
    node: str
    reason: str
    key: str
    """Idempotency key of the decision (``<workflow id>/incident-<n>/drain-<node>``), logged with the action."""


class DrainResult(Frozen):
    node: str
    verified_at: datetime
    drained_by_us: bool
    """False when someone else had already drained it: Rebound leaves such a node exactly as it is."""
    detail: str = ""


class RequeueInput(Frozen):
    job_id: int
    exclude: tuple[str, ...] = ()
    expected_restart_count: int
    """The restart count when the failure was detected: a retry (or Slurm's own requeue) is not requeued again."""
    previous_nodes: tuple[str, ...] = ()
    key: str


class RequeueResult(Frozen):
    job_id: int
    verified_at: datetime
    state: JobState
    restart_count: int
    excluded_nodes: tuple[str, ...] = ()
    started_now: bool = False


class WaitResumeInput(Frozen):
    """Wait until the restarted job logs a training step (after loading its checkpoint, if it says so)."""

    job_id: int
    log_patterns: tuple[str, ...] = ()
    offsets: dict[str, int] = {}
    expected_restart_count: int = 0
    poll_interval_s: float = Field(0.5, gt=0)


class ResumeOutcome(StrEnum):
    RESUMED = "resumed"
    FAILED_AGAIN = "failed_again"
    GONE = "gone"
    CANCELLED = "cancelled"
    """Its owner cancelled it while Rebound waited for it to train again."""


class WaitResumeResult(Frozen):
    outcome: ResumeOutcome
    observed_at: datetime
    step: int | None = None
    """The first training step the restarted job logged."""
    checkpoint: str = ""
    checkpoint_step: int | None = None
    """The step the loaded checkpoint holds, when the job says: ``step - checkpoint_step - 1`` steps were redone."""
    offsets: dict[str, int] = {}
    job: SlurmJob | None = None
