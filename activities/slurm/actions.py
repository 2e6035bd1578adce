"""Recovery actions on the scheduler: each idempotent, each verified against a fresh observation."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from temporalio import activity

from activities.errors import classified_errors
from activities.slurm.port import SchedulerPort
from workflows.constants import DRAIN_REASON_PREFIX, is_rebound_drain
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.loop import DrainInput, DrainResult, RequeueInput, RequeueResult
from workflows.domain.slurm import JobState, SlurmJob

log = logging.getLogger(__name__)

_WAITING_OR_RUNNING = (JobState.PENDING, JobState.RUNNING)


class SlurmActionActivities:
    """Drain and requeue, bound to the worker's scheduler port."""

    def __init__(self, scheduler: SchedulerPort) -> None:
        self._scheduler = scheduler

    @activity.defn(name="slurm_drain_node")
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
                reason = node.reason if node else "?"
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

    async def _job(self, job_id: int) -> SlurmJob:
        job = await self._scheduler.get_job(job_id)
        if job is None:
            raise ReboundError(FailureKind.JOB_NOT_FOUND, f"job {job_id} is gone: cannot requeue it")
        return job

    async def _wait_for_dead_nodes(self, job: SlurmJob) -> None:
        """Leave a job that still holds an unresponsive node to Slurm until it declares the node DOWN.

        Requeuing it earlier corrupts its GPU allocation on Slurm 22.05 (seen on the lab: the successor started
        with "Invalid generic resource (gres) specification" and "dealloc of node n3 bad node_offset"). Once the
        node is DOWN, Slurm requeues or ends the job by itself, and the next attempt carries on from there.
        """
        if job.state not in (JobState.RUNNING, JobState.COMPLETING):
            return
        nodes = {n.name: n for n in await self._scheduler.list_nodes()}
        dying = [n for n in job.nodes if n in nodes and not nodes[n].is_responding and nodes[n].state.value != "down"]
        if dying:
            raise ReboundError(
                FailureKind.SCHEDULER_BUSY,
                f"job {job.job_id} still holds unresponsive node(s) {', '.join(dying)}: waiting for Slurm to "
                "declare them DOWN before requeuing",
            )

    @activity.defn(name="slurm_requeue_job")
    async def requeue_job(self, inp: RequeueInput) -> RequeueResult:
        """Requeue the job held, exclude the implicated nodes, release it; verify with a fresh ``squeue``.

        Holding first means the exclusion can never race the job's restart. Starting at once (skipping Slurm's
        ``cred_expire`` wait) is only safe when every node of the previous run is excluded: those nodes revoke
        the job's credential for a while (see ``SchedulerActions.release_job``).
        """
        log.info("requeue job %s excluding %s key=%s", inp.job_id, inp.exclude, inp.key)
        sched = self._scheduler
        with classified_errors():
            job = await self._job(inp.job_id)
            if job.state is JobState.CANCELLED:
                # Its owner cancelled it (perhaps while we backed off): never bring back what a person stopped.
                return RequeueResult(
                    job_id=inp.job_id, verified_at=datetime.now(UTC), state=job.state, restart_count=job.restart_count
                )
            if job.state is JobState.COMPLETING:
                # The old run is still being torn down (by Slurm, an operator's requeue, or our earlier attempt).
                raise ReboundError(FailureKind.SCHEDULER_BUSY, f"job {inp.job_id} is still completing")
            needs_requeue = job.state is not JobState.PENDING and job.restart_count <= inp.expected_restart_count
            if needs_requeue:
                # Not requeued yet (by us in an earlier attempt, by Slurm after a node failure, or by an operator):
                # a PENDING job already waits to run again, whatever its restart count says.
                await self._wait_for_dead_nodes(job)
                await sched.requeue_job(inp.job_id, hold=True, expected_restart_count=inp.expected_restart_count)
                job = await self._job(inp.job_id)
            if job.state not in _WAITING_OR_RUNNING:
                # COMPLETING (the old run is still being torn down), or briefly still shown as ended.
                raise ReboundError(
                    FailureKind.SCHEDULER_BUSY, f"job {inp.job_id} is {job.state.value}; not pending yet"
                )
            if job.state is JobState.PENDING:
                wanted = tuple(sorted(set(job.excluded_nodes) | set(inp.exclude)))
                if set(wanted) != set(job.excluded_nodes):
                    await sched.set_excluded_nodes(inp.job_id, wanted)
                start_now = bool(inp.previous_nodes) and set(inp.previous_nodes) <= set(wanted)
                await sched.release_job(inp.job_id, start_now=start_now)
            else:
                start_now = False  # already running again (an earlier attempt released it)
            fresh = await sched.get_job(inp.job_id)
            _verify_requeued(inp, fresh)
        assert fresh is not None
        return RequeueResult(
            job_id=inp.job_id,
            verified_at=datetime.now(UTC),
            state=fresh.state,
            restart_count=fresh.restart_count,
            excluded_nodes=fresh.excluded_nodes,
            started_now=start_now,
        )


def _verify_requeued(inp: RequeueInput, fresh: SlurmJob | None) -> None:
    """The fresh observation must show a successor (pending, or running again), kept off the implicated nodes.

    A pending successor must carry the exclusion. A running one (Slurm itself requeued it after a node failure
    and started it before we could exclude anything) must simply not be on an implicated node: those are
    drained or down, so Slurm cannot have placed it there, and this check proves it.
    """
    if fresh is None or fresh.state not in _WAITING_OR_RUNNING:
        raise ReboundError(
            FailureKind.SCHEDULER_BUSY, f"job {inp.job_id} is {fresh.state.value if fresh else 'gone'} after requeue"
        )
    excluded = set(inp.exclude) <= set(fresh.excluded_nodes)
    kept_off = fresh.state is JobState.RUNNING and not set(inp.exclude) & set(fresh.nodes)
    # A running job counts only as a successor (restart count moved); a pending one is a successor by nature.
    counted = fresh.state is JobState.PENDING or fresh.restart_count > inp.expected_restart_count
    if not counted or not (excluded or kept_off):
        raise ReboundError(
            FailureKind.SCHEDULER_BUSY,
            f"requeue of job {inp.job_id} not visible yet (restarts {fresh.restart_count}, "
            f"excluded {fresh.excluded_nodes}, nodes {fresh.nodes})",
        )
