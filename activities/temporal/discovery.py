"""ClusterWatch's activities: find opted-in jobs in the shared snapshot, and start their JobRecovery workflows.

Discovery polls the worker's ``SnapshotCache`` (shared with the per-job watchers, so it adds no scheduler calls
of its own) inside one heartbeating activity, and returns only when something changed: the workflow's history
grows with events, not with polls. Starting goes through the Temporal client with the job's business-key id and
``USE_EXISTING``, so starting a job twice, from two workers or after a retry, is a no-op.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from temporalio import activity
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.errors import classified_errors
from activities.slurm.snapshots import SnapshotCache
from activities.slurm.submission import token_in
from activities.temporal.rebound_workflows import lineage_workflow_id, start_job_recovery
from workflows.constants import job_workflow_id
from workflows.domain.checkpoints import CheckpointFallback
from workflows.domain.discovery import (
    DiscoveredJob,
    DiscoverJobsInput,
    DiscoverJobsResult,
    RejectedOptIn,
    StartJobRecoveryInput,
    StartJobRecoveryResult,
)
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.optin_caps import OptInCaps
from workflows.domain.recovery import DetectionPolicy, JobRecoveryInput
from workflows.domain.slurm import ClusterSnapshot, JobState
from workflows.domain.watch_routing import WatchRouting
from workflows.policy.optin import JobSelector, OptInError, spec_for, with_fallback

__all__ = ["DiscoveryActivities", "StartJobRecovery", "TemporalJobRecoveryStarter"]

#: Jobs discovery considers new; jobs already known stay known while ``JobState.is_active()``.
DISCOVERABLE_STATES = (JobState.PENDING, JobState.RUNNING)

#: Starts one job's JobRecovery; injected so tests (and other front ends) can replace the Temporal client.
StartJobRecovery = Callable[[StartJobRecoveryInput], Awaitable[StartJobRecoveryResult]]

#: How long the lineage's JobRecovery may take to answer whether a resubmitted job is its own.
_LINEAGE_QUERY_S = 10.0

# Temporal answers that mean "not now" rather than "never".
_TRANSIENT_RPC = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.ABORTED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.UNKNOWN,
    }
)


class TemporalJobRecoveryStarter:
    """Starts JobRecovery workflows through a Temporal client, as ``rebound watch`` does."""

    def __init__(
        self,
        client: Client,
        *,
        task_queue: str,
        poll_interval_s: float = 1.0,
        detection: DetectionPolicy | None = None,
        checkpoint_fallback: CheckpointFallback = CheckpointFallback.OFF,
        watch_hub: WatchRouting | None = None,
    ) -> None:
        """Bind the starter.

        Args:
            client: A client with the pydantic data converter.
            task_queue: Where the JobRecovery workflows run (the central worker's queue).
            poll_interval_s: How often each job's watcher looks at the shared snapshot.
            detection: Hang and straggler policies for the started workflows (defaults when None).
            checkpoint_fallback: The operator's ``checkpoints.fallback``, for jobs whose spec does not choose.
            watch_hub: How the started workflows reach the watch hub (ADR 015); None: per-job watches.
        """
        self._watch_hub = watch_hub
        self._client = client
        self._task_queue = task_queue
        self._poll_interval_s = poll_interval_s
        self._detection = detection or DetectionPolicy()
        self._checkpoint_fallback = checkpoint_fallback

    async def __call__(self, inp: StartJobRecoveryInput) -> StartJobRecoveryResult:
        """Start the job's JobRecovery, or find the one already running.

        Raises:
            ReboundError: ``TEMPORAL_UNREACHABLE`` when Temporal does not answer now; ``CONFIGURATION`` when it
                refuses the request (an unregistered search attribute, a missing permission).
        """
        wf_id = job_workflow_id(inp.cluster, inp.job_id)
        owner = await self._lineage_owner(inp)
        if owner is not None:
            return StartJobRecoveryResult(workflow_id=owner, lineage=True)
        # Built and validated here: a payload that fails to decode would wedge the workflow task, not fail it.
        args = JobRecoveryInput(
            cluster=inp.cluster,
            job_id=inp.job_id,
            poll_interval_s=self._poll_interval_s,
            spec=with_fallback(inp.spec, self._checkpoint_fallback),
            detection=self._detection,
            watch_hub=self._watch_hub,
        )
        try:
            handle = await start_job_recovery(self._client, args, task_queue=self._task_queue, opted_in=True)
        except WorkflowAlreadyStartedError as e:  # only under a stricter id reuse policy than ours; still done
            return StartJobRecoveryResult(workflow_id=wf_id, run_id=e.run_id)
        except RPCError as e:
            kind = FailureKind.TEMPORAL_UNREACHABLE if e.status in _TRANSIENT_RPC else FailureKind.CONFIGURATION
            raise ReboundError(kind, f"starting {wf_id} failed: {e.status.name}: {e.message}") from e
        return StartJobRecoveryResult(workflow_id=wf_id, run_id=handle.result_run_id)

    async def _lineage_owner(self, inp: StartJobRecoveryInput) -> str | None:
        """The JobRecovery that resubmitted this job, by its own record; None: the job is started as any other.

        The comment's token only names whom to ask (the lineage's first job id). The job belongs to that
        lineage when the JobRecovery lists its id or reserved exactly this token; a forged, copied or stale
        token claims nothing and the job gets its own JobRecovery.

        Raises:
            ReboundError: ``TEMPORAL_UNREACHABLE`` when the lineage's JobRecovery cannot be asked now (the next
                discovery round offers the job again: never a second workflow on a guess).
        """
        if not inp.resubmit_token:
            return None
        try:
            return await lineage_workflow_id(
                self._client, inp.cluster, inp.job_id, inp.resubmit_token, timeout_s=_LINEAGE_QUERY_S
            )
        except (RPCError, TimeoutError, WorkflowQueryFailedError) as e:
            raise ReboundError(
                FailureKind.TEMPORAL_UNREACHABLE, f"asking the lineage of job {inp.job_id} ({inp.resubmit_token}): {e}"
            ) from e


class DiscoveryActivities:
    """Discovery and JobRecovery starts for one worker, bound to its snapshot cache and the operator's selectors."""

    def __init__(
        self,
        snapshots: SnapshotCache,
        selectors: Sequence[JobSelector] = (),
        client: Client | None = None,
        *,
        task_queue: str = "",
        poll_interval_s: float = 1.0,
        detection: DetectionPolicy | None = None,
        checkpoint_fallback: CheckpointFallback = CheckpointFallback.OFF,
        start: StartJobRecovery | None = None,
        caps: OptInCaps | None = None,
    ) -> None:
        """Bind the activities.

        Args:
            snapshots: The worker's shared snapshot cache.
            selectors: Operator selectors (``workers.discovery.load_selectors``), in priority order.
            client: The Temporal client that starts JobRecovery workflows (unless ``start`` is given).
            task_queue: The JobRecovery workflows' task queue (with ``client``).
            poll_interval_s: How often discovery, and each started job's watcher, look at the snapshot.
            detection: Hang and straggler policies for the started workflows (with ``client``).
            checkpoint_fallback: The operator's ``checkpoints.fallback`` for the started workflows (with ``client``).
            start: Replaces the client-based start (tests).
            caps: The operator's ceilings on what a job's comment may ask for (``optin.*``); None: the defaults.

        Raises:
            ValueError: Neither ``client`` nor ``start`` was given, or ``poll_interval_s`` is not positive.
        """
        if start is None:
            if client is None:
                raise ValueError("DiscoveryActivities needs a Temporal client or a start function")
            start = TemporalJobRecoveryStarter(
                client,
                task_queue=task_queue,
                poll_interval_s=poll_interval_s,
                detection=detection,
                checkpoint_fallback=checkpoint_fallback,
            )
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        self._snapshots = snapshots
        self._selectors = tuple(selectors)
        self._caps = caps or OptInCaps()
        self._start = start
        self._poll_interval_s = poll_interval_s
        self._warned: dict[int, str] = {}
        """Job id -> the malformed comment already warned about (a changed comment warns again)."""

    @activity.defn(name="discovery_find_jobs")
    async def discover_jobs(self, inp: DiscoverJobsInput) -> DiscoverJobsResult:
        """Poll the shared snapshot until new opted-in active jobs appear, known jobs end, or the wait runs out.

        Heartbeats every poll (the poll count travels in the details, so a retried attempt keeps counting). A
        malformed opt-in comment is logged once per job and the job skipped.

        Raises:
            ApplicationError: The scheduler could not be read (retried by Temporal for transient kinds).
        """
        details = activity.info().heartbeat_details
        polls = int(details[0]) if details else 0
        known = frozenset(inp.known)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + inp.max_wait_s
        while True:
            with classified_errors():
                snapshot = await self._snapshots.get()
            polls += 1
            activity.heartbeat(polls)
            new, rejected = self._scan(snapshot, known)
            gone = _gone(snapshot, known)
            if new or gone or loop.time() >= deadline:
                return DiscoverJobsResult(
                    observed_at=snapshot.observed_at, new=new, gone=gone, rejected=rejected, polls=polls
                )
            await asyncio.sleep(self._poll_interval_s)

    @activity.defn(name="temporal_start_job_recovery")
    async def start_job_recovery(self, inp: StartJobRecoveryInput) -> StartJobRecoveryResult:
        """Start the job's JobRecovery workflow; a no-op when it already runs (business-key id, USE_EXISTING).

        Raises:
            ApplicationError: ``TEMPORAL_UNREACHABLE`` (retried) or ``CONFIGURATION`` (not retried).
        """
        with classified_errors():
            return await self._start(inp)

    def _scan(
        self, snapshot: ClusterSnapshot, known: frozenset[int]
    ) -> tuple[tuple[DiscoveredJob, ...], tuple[RejectedOptIn, ...]]:
        new: list[DiscoveredJob] = []
        rejected: list[RejectedOptIn] = []
        for job in snapshot.jobs:
            if job.job_id in known or job.state not in DISCOVERABLE_STATES:
                continue
            try:
                spec = spec_for(job, self._selectors, self._caps)
            except OptInError as e:
                rejected.append(RejectedOptIn(job_id=job.job_id, reason=str(e)))
                if self._warned.get(job.job_id) != job.comment:
                    self._warned[job.job_id] = job.comment
                    activity.logger.warning("job %s is not monitored: %s (comment %r)", job.job_id, e, job.comment)
                continue
            if spec is not None:
                if spec.capped and self._warned.get(job.job_id) != job.comment:
                    # Once per comment; the job's timeline says so too (CAPPED), once its JobRecovery starts.
                    self._warned[job.job_id] = job.comment
                    activity.logger.warning("job %s: comment clamped: %s", job.job_id, "; ".join(spec.capped))
                token = token_in(job.comment) or ""
                new.append(
                    DiscoveredJob(
                        job_id=job.job_id,
                        name=job.name,
                        user=job.user,
                        state=job.state,
                        spec=spec,
                        resubmit_token=token,
                    )
                )
        # Forget warnings about jobs the scheduler no longer lists, so the memory stays bounded.
        listed = {job.job_id for job in snapshot.jobs}
        for job_id in [j for j in self._warned if j not in listed]:
            del self._warned[job_id]
        return tuple(new), tuple(rejected)


def _gone(snapshot: ClusterSnapshot, known: frozenset[int]) -> tuple[int, ...]:
    active = {job.job_id for job in snapshot.jobs if job.state.is_active()}
    return tuple(sorted(known - active))
