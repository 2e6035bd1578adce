"""The node check's activities on the central worker (ADR 018): run the check job on a drained node inside its
maintenance reservation, then release the node (to service, or drained again).

``slurm_node_check_run`` is idempotent, decided on fresh reads: a node that carries Rebound's drain is reserved
(``rebound-check-<node>``, reused when a crashed attempt left it), resumed and checked; a node already resumed
inside its reservation is an earlier attempt's, picked up where it was (the job carrying the check's token is
adopted, an older check job on the node is cancelled); any other node is not Rebound's to check. Rebound's own
timeout bounds the wait, anchored at the job's submission (a retry does not extend it), and ``scancel`` ends a
check that hangs. ``slurm_node_check_release`` drains the node first when asked (nothing lands between), then
deletes the reservation; both verified on a fresh read.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import math
from datetime import UTC, datetime
from pathlib import Path

from temporalio import activity

from activities.errors import classified_errors
from activities.heartbeating import heartbeating_throughout
from activities.slurm.maintenance import CheckJobRequest, MaintenancePort
from activities.slurm.port import SchedulerPort
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.node_check import (
    CheckOutcome,
    NodeCheckReleaseInput,
    NodeCheckReleaseResult,
    NodeCheckRunInput,
    NodeCheckRunResult,
    RankReport,
    reservation_name,
)
from workflows.domain.slurm import JobState, SlurmJob, SlurmNode
from workflows.policy.node_check import judge_check, read_reports

__all__ = ["CHECK_COMMENT_PREFIX", "NodeCheckActivities"]

log = logging.getLogger(__name__)

#: The check job's comment: this prefix and the check's token.
CHECK_COMMENT_PREFIX = "rebound-check:"
_POLL_S = 1.0
#: A job in one of these states on the node shares it with the check.
_ON_NODE = (JobState.RUNNING, JobState.COMPLETING, JobState.SUSPENDED)


class NodeCheckActivities:
    """Bound to the scheduler port (reads, drain, resume), the maintenance commands and the check's settings."""

    def __init__(
        self,
        scheduler: SchedulerPort,
        maintenance: MaintenancePort,
        *,
        command: tuple[str, ...],
        output_dir: Path,
        user: str | None = None,
        poll_s: float = _POLL_S,
    ) -> None:
        self._scheduler = scheduler
        self._maint = maintenance
        self._command = command
        self._output_dir = output_dir
        self._user = user or getpass.getuser()
        self._poll_s = poll_s

    @activity.defn(name="slurm_node_check_run")
    async def run(self, inp: NodeCheckRunInput) -> NodeCheckRunResult:
        """Reserve, resume and check the node; the reservation stays for the release (module docstring)."""
        with classified_errors():
            return await self._run(inp)

    @activity.defn(name="slurm_node_check_release")
    @heartbeating_throughout
    async def release(self, inp: NodeCheckReleaseInput) -> NodeCheckReleaseResult:
        """Drain the node with ``inp.drain_reason`` (when given), then delete its check reservation."""
        with classified_errors():
            return await self._release(inp)

    async def _run(self, inp: NodeCheckRunInput) -> NodeCheckRunResult:
        node, res = inp.node, reservation_name(inp.node)
        current = await self._scheduler.get_node(node)
        if current is None:
            return NodeCheckRunResult(
                node=node, outcome=CheckOutcome.NOT_OURS, detail="the scheduler lists no such node"
            )
        existing = await self._maint.show_reservation(res)
        ours = current.is_drained and current.reason == inp.drain_reason
        resumed_by_us = not current.is_drained and existing is not None  # an earlier attempt got this far
        if not ours and not resumed_by_us:
            if existing is not None:
                await self._maint.delete_reservation(res)  # ours, left by a crash: nothing of ours to check now
            reason = current.reason if current.is_drained else ""
            what = f"drained by someone else: {reason!r}" if reason else "resumed by someone else"
            return NodeCheckRunResult(node=node, outcome=CheckOutcome.NOT_OURS, detail=what, current_reason=reason)
        if existing is None or existing.nodes != node:
            if existing is not None:
                await self._maint.delete_reservation(res)
            await self._maint.create_reservation(res, node, inp.reservation_minutes, self._user)
            if await self._maint.show_reservation(res) is None:
                raise ReboundError(FailureKind.SCHEDULER_BUSY, f"reservation {res} not visible yet")
        if current.is_drained:
            await self._scheduler.resume_node(node, expected_reason=inp.drain_reason)
        job = await self._check_job(inp, current)
        return await self._wait(inp, job, res)

    async def _check_job(self, inp: NodeCheckRunInput, node: SlurmNode) -> SlurmJob:
        """The job carrying this check's token (adopted), or a new one; older check jobs on the node are cancelled."""
        comment = f"{CHECK_COMMENT_PREFIX}{inp.token}"
        jobs = await self._scheduler.list_jobs()
        mine = next((j for j in jobs if j.comment == comment), None)
        for job in jobs:
            stale = job.comment.startswith(CHECK_COMMENT_PREFIX) and job.comment != comment
            if stale and inp.node in job.nodes + job.required_nodes and not job.state.is_terminal():
                log.info("cancelling the earlier check job %s on %s", job.job_id, inp.node)
                await self._maint.cancel(job.job_id)
        if mine is not None:
            return mine
        ranks = inp.ranks or min(max(2, node.gpus or 0), node.cpus or 2)
        job_id = await self._maint.submit_check(
            CheckJobRequest(
                node=inp.node,
                reservation=reservation_name(inp.node),
                ranks=ranks,
                gpus=node.gpus or 0,
                # Slurm's limit is a backstop only (whole minutes, checked every ~30 s): Rebound cancels first.
                time_limit_min=max(1, math.ceil(inp.timeout_s / 60)) + 1,
                comment=comment,
                output=str(self._output_dir / f"check-{inp.node}-%j.out"),
                command=(*self._command, "--timeout-s", f"{max(5.0, inp.timeout_s / 3):g}"),
            )
        )
        fresh = await self._scheduler.get_job(job_id)
        if fresh is None:
            raise ReboundError(FailureKind.SCHEDULER_BUSY, f"check job {job_id} not listed yet")
        return fresh

    async def _wait(self, inp: NodeCheckRunInput, job: SlurmJob, res: str) -> NodeCheckRunResult:
        start = job.submit_time or datetime.now(UTC)
        ranks = job.task_count or inp.ranks or 1
        output = self._output_dir / f"check-{inp.node}-{job.job_id}.out"

        def result(outcome: CheckOutcome, detail: str, reports: tuple[RankReport, ...] = ()) -> NodeCheckRunResult:
            return NodeCheckRunResult(
                node=inp.node, outcome=outcome, detail=detail, job_id=job.job_id, reservation=res, reports=reports
            )

        while True:
            activity.heartbeat(job.job_id)
            jobs = await self._scheduler.list_jobs()
            fresh = next((j for j in jobs if j.job_id == job.job_id), None)
            others = [j.job_id for j in jobs if j.job_id != job.job_id and inp.node in j.nodes and j.state in _ON_NODE]
            if others:  # the reservation should make this impossible: the node was not the check's alone
                await self._maint.cancel(job.job_id)
                return result(
                    CheckOutcome.INCONCLUSIVE, f"job(s) {others} ran on {inp.node} beside check job {job.job_id}"
                )
            reports = read_reports(_lines(output), inp.node)
            elapsed = (datetime.now(UTC) - start).total_seconds()
            ended = "gone" if fresh is None else fresh.state.value if fresh.state.is_terminal() else ""
            verdict = judge_check(
                reports, ranks, job.job_id, ended=ended, timed_out_s=inp.timeout_s if elapsed > inp.timeout_s else None
            )
            if verdict is not None:
                if not ended:
                    if verdict[0] is CheckOutcome.PASSED and elapsed <= inp.timeout_s:
                        # Every rank passed: let the job end (its reservation cannot be deleted while it runs).
                        await asyncio.sleep(self._poll_s)
                        continue
                    await self._maint.cancel(job.job_id)  # a failed rank's peers may hang in the all-reduce
                return result(verdict[0], verdict[1], reports)
            await asyncio.sleep(self._poll_s)

    async def _release(self, inp: NodeCheckReleaseInput) -> NodeCheckReleaseResult:
        node = inp.node
        if inp.drain_reason:
            try:
                await self._scheduler.drain_node(node, inp.drain_reason)
            except ReboundError as e:
                if e.kind is not FailureKind.NOT_OWNED:
                    raise  # someone else's drain came first: theirs stays, the result says whose
        await self._maint.delete_reservation(inp.reservation)
        if await self._maint.show_reservation(inp.reservation) is not None:
            raise ReboundError(FailureKind.SCHEDULER_BUSY, f"reservation {inp.reservation} still listed")
        after = await self._scheduler.get_node(node)
        if after is None:
            return NodeCheckReleaseResult(node=node, drained=False, detail="the scheduler lists no such node")
        reason = after.reason if after.is_drained else ""
        if inp.drain_reason and not reason:
            raise ReboundError(FailureKind.SCHEDULER_BUSY, f"drain of {node} not visible yet")
        drained = bool(inp.drain_reason) and reason == inp.drain_reason
        return NodeCheckReleaseResult(
            node=node, drained=drained, current_reason=reason, detail="drained again" if drained else "released"
        )


def _lines(path: Path) -> list[str]:
    """The check job's output so far (absent until the job starts)."""
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
