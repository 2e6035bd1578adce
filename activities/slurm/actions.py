"""Recovery actions on the scheduler, through the port: each idempotent, each verified against a fresh observation."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from temporalio import activity

from activities.errors import classified_errors
from activities.heartbeating import heartbeating_throughout
from activities.slurm.guarded import WAITING_OR_RUNNING
from activities.slurm.port import RestartRequest, SchedulerPort
from workflows.constants import DRAIN_REASON_PREFIX, is_rebound_drain
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.loop import DrainInput, DrainResult, RequeueInput, RequeueResult
from workflows.domain.slurm import JobState, SlurmJob

log = logging.getLogger(__name__)


class SlurmActionActivities:
    """Drain and requeue, bound to the worker's scheduler port."""

    def __init__(self, scheduler: SchedulerPort) -> None:
        self._scheduler = scheduler

    @activity.defn(name="slurm_drain_node")
    @heartbeating_throughout
    async def drain_node(self, inp: DrainInput) -> DrainResult:
        """Drain ``inp.node`` with Rebound's reason, unless someone else drained it; verify with a fresh read.

        A retried call changes nothing: the port's drain is a no-op when the node already carries our reason.
        """
        if not is_rebound_drain(inp.reason):
            raise ReboundError(FailureKind.CONFIGURATION, f"drain reason must start with {DRAIN_REASON_PREFIX!r}")
        log.info("drain %s (%s) key=%s", inp.node, inp.reason, inp.key)
        with classified_errors():
            try:
                await self._scheduler.drain_node(inp.node, inp.reason)
            except ReboundError as e:
                if e.kind is not FailureKind.NOT_OWNED:
                    raise
                node = await self._scheduler.get_node(inp.node)
                if node is None or not node.is_drained:
                    # It changed between the refusal and this read: whose drain it is cannot be said from here.
                    raise ReboundError(  # retried: the next attempt decides on a fresh read
                        FailureKind.SCHEDULER_BUSY,
                        f"node {inp.node} was drained by someone else, then "
                        f"{'vanished from' if node is None else 'was undrained in'} the listing: reading again",
                    ) from e
                reason = node.reason
                # Another Rebound incident may have drained it first (a node shared by two jobs): still ours.
                ours = is_rebound_drain(reason)
                return DrainResult(
                    node=inp.node,
                    verified_at=datetime.now(UTC),
                    drained_by_us=ours,
                    detail=f"already drained by {'Rebound' if ours else 'someone else'}: {reason}",
                )
            node = await self._scheduler.get_node(inp.node)
            if node is None or not node.is_drained or node.reason != inp.reason:
                raise ReboundError(  # retried: the next attempt reads again
                    FailureKind.SCHEDULER_BUSY,
                    f"drain of {inp.node} not visible yet (flags {node.flags if node else '?'}, reason "
                    f"{node.reason if node else '?'!r})",
                )
        return DrainResult(node=inp.node, verified_at=datetime.now(UTC), drained_by_us=True, detail=node.state.value)

    @activity.defn(name="slurm_requeue_job")
    @heartbeating_throughout
    async def requeue_job(self, inp: RequeueInput) -> RequeueResult:
        """Restart the job without the implicated nodes through the port; verify with a fresh observation.

        How the restart is done is the scheduler adapter's (on Slurm 22.05: requeue held, exclude, release;
        ADR 009); this activity only proves the successor exists and is kept off the implicated nodes.
        """
        log.info("requeue job %s excluding %s key=%s", inp.job_id, inp.exclude, inp.key)
        request = RestartRequest(
            job_id=inp.job_id,
            exclude=inp.exclude,
            previous_nodes=inp.previous_nodes,
            expected_restart_count=inp.expected_restart_count,
            user_excluded=inp.user_excluded,
        )
        with classified_errors():
            restart = await self._scheduler.restart_excluding(request)
            if restart.state is JobState.CANCELLED:
                return RequeueResult(
                    job_id=inp.job_id,
                    verified_at=datetime.now(UTC),
                    state=restart.state,
                    restart_count=restart.restart_count,
                )
            fresh = await self._scheduler.get_job(inp.job_id)
            _verify_requeued(inp, fresh)
        assert fresh is not None
        return RequeueResult(
            job_id=inp.job_id,
            verified_at=datetime.now(UTC),
            state=fresh.state,
            restart_count=fresh.restart_count,
            excluded_nodes=fresh.excluded_nodes,
            started_now=restart.started_now,
        )


def _verify_requeued(inp: RequeueInput, fresh: SlurmJob | None) -> None:
    """The fresh observation must show a successor (pending, or running again), kept off the implicated nodes.

    A pending successor must carry the exclusion (exactly the owner's plus ``inp.exclude`` when the owner's is
    known: a stale exclusion still there means the change is not visible yet). A running one (Slurm itself
    requeued it after a node failure and started it before we could exclude anything) must simply not be on an
    implicated node: those are drained or down, so Slurm cannot have placed it there, and this check proves it.
    """
    if fresh is None or fresh.state not in WAITING_OR_RUNNING:
        raise ReboundError(
            FailureKind.SCHEDULER_BUSY, f"job {inp.job_id} is {fresh.state.value if fresh else 'gone'} after requeue"
        )
    if inp.user_excluded is None:
        excluded = set(inp.exclude) <= set(fresh.excluded_nodes)
    else:
        excluded = set(fresh.excluded_nodes) == set(inp.user_excluded) | set(inp.exclude)
    kept_off = fresh.state is JobState.RUNNING and not set(inp.exclude) & set(fresh.nodes)
    # A running job counts only as a successor (restart count moved); a pending one is a successor by nature.
    counted = fresh.state is JobState.PENDING or fresh.restart_count > inp.expected_restart_count
    if not counted or not (excluded or kept_off):
        raise ReboundError(
            FailureKind.SCHEDULER_BUSY,
            f"requeue of job {inp.job_id} not visible yet (restarts {fresh.restart_count}, "
            f"excluded {fresh.excluded_nodes}, nodes {fresh.nodes})",
        )
