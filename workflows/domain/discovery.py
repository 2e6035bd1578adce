"""The ClusterWatch workflow's inputs, state and answers, and its activities' payloads."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from workflows.domain.base import Frozen
from workflows.domain.recovery import RecoverySpec
from workflows.domain.slurm import JobState

#: How many recent errors ``ClusterWatchStatus.errors`` keeps (older ones are in the workflow history).
MAX_RECENT_ERRORS = 20


class RejectedOptIn(Frozen):
    """A job whose ``rebound`` comment did not parse, or that Rebound cannot watch (``UnsupportedJob``): left
    alone, reported to operators with the reason."""

    job_id: int
    reason: str


class WatchError(Frozen):
    """Something ClusterWatch could not do; it carries on and tries again."""

    at: datetime
    kind: str
    """The ``FailureKind`` value (``ApplicationError.type``), or the error's class name when unclassified."""
    message: str
    job_id: int | None = None
    """The job whose JobRecovery could not be started; None for a failed discovery."""


class ClusterWatchStatus(Frozen):
    """What the ``status`` query answers; also the state carried across continue-as-new."""

    cluster: str
    known: tuple[int, ...] = ()
    """Active opted-in jobs whose JobRecovery was started (ascending job ids)."""
    rejected: tuple[RejectedOptIn, ...] = ()
    """Jobs with a malformed opt-in comment, or that opted in but cannot be watched (a heterogeneous job's
    components), as of the last discovery."""
    last_discovery_at: datetime | None = None
    discoveries: int = 0
    """Discovery rounds completed, over all runs."""
    started: int = 0
    """JobRecovery starts requested, over all runs (a start of an already running one is a no-op)."""
    errors: tuple[WatchError, ...] = ()
    """The most recent errors, oldest first (at most ``MAX_RECENT_ERRORS``)."""
    runs: int = 1
    """Workflow runs so far (continue-as-new adds one)."""


class ClusterWatchInput(Frozen):
    """Start (or continue-as-new) the discovery loop of one cluster."""

    cluster: str
    max_wait_s: float = Field(600.0, gt=0, le=1800)
    """A discovery returns after this long even when nothing changed (bounds each activity attempt)."""
    rounds_per_run: int = Field(1000, ge=1)
    """Continue-as-new after this many rounds, if the server has not suggested it earlier."""
    carried: ClusterWatchStatus | None = None
    """State carried across continue-as-new; None for a fresh start."""


class DiscoverJobsInput(Frozen):
    """Wait for opted-in active jobs not in ``known``, or for known jobs that ended."""

    cluster: str
    known: tuple[int, ...] = ()
    max_wait_s: float = Field(600.0, gt=0)


class DiscoveredJob(Frozen):
    """An active job that opted in (or was selected) and is not known yet."""

    job_id: int = Field(gt=0)
    name: str = ""
    user: str = ""
    state: JobState
    spec: RecoverySpec = RecoverySpec()
    resubmit_token: str = ""
    """The resubmission token in the job's comment, if any: a hint to ask Rebound's own record (ADR 014)."""


class DiscoverJobsResult(Frozen):
    """Why the discovery returned: new jobs, known jobs gone, or the wait ran out (all empty)."""

    observed_at: datetime
    new: tuple[DiscoveredJob, ...] = ()
    gone: tuple[int, ...] = ()
    """Known jobs that are no longer active (ended, or no longer listed by the scheduler)."""
    rejected: tuple[RejectedOptIn, ...] = ()
    polls: int = 0


class StartJobRecoveryInput(Frozen):
    """Start the JobRecovery workflow of one job; a no-op when it is already running."""

    cluster: str
    job_id: int = Field(gt=0)
    spec: RecoverySpec = RecoverySpec()
    resubmit_token: str = ""
    """As in ``DiscoveredJob``: the job joins a lineage only when that lineage's JobRecovery lists it or the token."""


class StartJobRecoveryResult(Frozen):
    """The job's JobRecovery workflow (the existing run when it was already running)."""

    workflow_id: str
    run_id: str | None = None
    lineage: bool = False
    """The job is a resubmission an existing JobRecovery follows: nothing was started (``workflow_id`` is it)."""
