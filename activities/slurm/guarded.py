"""Idempotent scheduler actions: decide on a fresh observation, then make one raw scheduler call.

Every backend that can act (scontrol, pyslurm, the test fake) supplies the raw calls, each a single Slurm
request that raises ``SlurmCallError`` carrying Slurm's error number. ``GuardedActions`` turns them into the
``SchedulerActions`` contract documented in ``activities.slurm.port``. The decisions are made on state read
just before acting; Slurm's error numbers are consulted only for the races that a read cannot rule out (the job
started, or got requeued, between the read and the call). ``restart_excluding`` composes those actions into
Slurm 22.05's restart sequence: requeue held, exclude, release (ADR 009).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import timedelta

from activities.slurm.errors import SlurmErrno
from activities.slurm.hostlist import HostlistError, compress
from activities.slurm.port import RestartRequest, RestartResult, ResubmitRequest, ResubmitResult
from activities.slurm.submission import sbatch_arguments, token_in
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import JobState, NodeBaseState, SlurmJob, SlurmNode

__all__ = ["GuardedActions", "HELD_REASONS", "SlurmCallError", "WAITING_OR_RUNNING", "is_held", "wanted_exclusion"]

#: ``state_reason`` of a held job: ``requeuehold``/``uhold`` give JobHeldUser, ``hold`` JobHeldAdmin (verified).
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})

#: How far the controller's clock may trail the workflow's when a job carrying a token is judged "submitted after
#: the reservation" (submit times come from slurmctld, the reservation time from the workflow).
CLOCK_SKEW = timedelta(minutes=5)

# States in which Slurm still accepts changes meant for the job's next start (verified on 22.05: exclusion
# works while a requeued job is COMPLETING as well as PENDING).
_NOT_STARTED = (JobState.PENDING, JobState.COMPLETING)
#: States of a restarted job: waiting to run again, or running again.
WAITING_OR_RUNNING = (JobState.PENDING, JobState.RUNNING)


class SlurmCallError(ReboundError):
    """A raw scheduler call failed; ``errno`` is Slurm's error number when it could be determined."""

    def __init__(self, kind: FailureKind, message: str, errno: int | None = None) -> None:
        super().__init__(kind, message)
        self.errno = errno


def is_held(job: SlurmJob) -> bool:
    """True when the job waits for ``release_job`` (user or admin hold)."""
    return job.state_reason in HELD_REASONS


class GuardedActions(ABC):
    """``SchedulerActions`` on top of raw calls; subclasses also provide ``get_job``/``get_node``/``list_nodes``."""

    @abstractmethod
    async def get_job(self, job_id: int) -> SlurmJob | None:
        """A fresh observation of one job (see ``SchedulerReads.get_job``)."""

    @abstractmethod
    async def list_nodes(self) -> tuple[SlurmNode, ...]:
        """A fresh observation of every node (see ``SchedulerReads.list_nodes``)."""

    @abstractmethod
    async def get_node(self, name: str) -> SlurmNode | None:
        """A fresh observation of one node (see ``SchedulerReads.get_node``)."""

    @abstractmethod
    async def list_jobs(self) -> tuple[SlurmJob, ...]:
        """A fresh observation of every job (see ``SchedulerReads.list_jobs``)."""

    @abstractmethod
    async def _submit(self, args: Sequence[str], script: bytes, env: Mapping[str, str]) -> int:
        """``sbatch ARGS`` with the script on stdin and ``env`` as its environment; the new job's id."""

    @abstractmethod
    async def _drain(self, node: str, reason: str) -> None:
        """``scontrol update nodename=N state=drain reason=R``."""

    @abstractmethod
    async def _resume(self, node: str) -> None:
        """``scontrol update nodename=N state=resume``."""

    @abstractmethod
    async def _requeue(self, job_id: int, hold: bool) -> None:
        """``scontrol requeue J`` or ``scontrol requeuehold J``."""

    @abstractmethod
    async def _hold(self, job_id: int) -> None:
        """``scontrol uhold J``: a user hold, like the one ``requeuehold`` sets."""

    @abstractmethod
    async def _set_excluded(self, job_id: int, hostlist: str) -> None:
        """``scontrol update jobid=J excnodelist=H`` (an empty ``H`` clears the list)."""

    @abstractmethod
    async def _release(self, job_id: int) -> None:
        """``scontrol release J``."""

    @abstractmethod
    async def _start_now(self, job_id: int) -> None:
        """``scontrol update jobid=J starttime=now``."""

    async def drain_node(self, node: str, reason: str) -> None:
        """See ``SchedulerActions.drain_node``.

        Raises:
            ReboundError: ``SCHEDULER_REJECTED`` (empty reason), ``NODE_NOT_FOUND``, ``NOT_OWNED``, or what
                the read or the raw call raise.
        """
        if not reason.strip():
            raise ReboundError(FailureKind.SCHEDULER_REJECTED, f"draining {node} needs a reason")
        current = await self._require_node(node)
        if current.is_drained:
            if current.reason == reason:
                return
            # Slurm would accept the drain and silently replace the other owner's reason (verified on 22.05).
            raise ReboundError(
                FailureKind.NOT_OWNED,
                f"node {node} is already drained by {current.reason_set_by_user or 'someone else'}: "
                f"{current.reason!r}; not replacing it with {reason!r}",
            )
        await self._drain(node, reason)

    async def resume_node(self, node: str, *, expected_reason: str | None = None) -> None:
        """See ``SchedulerActions.resume_node``.

        Raises:
            ReboundError: ``NODE_NOT_FOUND``, ``NOT_OWNED``, ``SCHEDULER_REJECTED``, or what the read raises.
        """
        current = await self._require_node(node)
        if not _needs_resume(current):
            return
        if expected_reason is not None and current.reason != expected_reason:
            raise ReboundError(
                FailureKind.NOT_OWNED,
                f"node {node} is held for {current.reason!r} by {current.reason_set_by_user or 'someone else'}, "
                f"not for {expected_reason!r}; leaving it as it is",
            )
        try:
            await self._resume(node)
        except SlurmCallError as e:
            # "Invalid node state specified": someone resumed it between our read and our call.
            if e.errno == SlurmErrno.INVALID_NODE_STATE and not _needs_resume(await self._require_node(node)):
                return
            raise

    async def requeue_job(self, job_id: int, *, hold: bool = False, expected_restart_count: int | None = None) -> None:
        """See ``SchedulerActions.requeue_job``.

        Raises:
            ReboundError: ``JOB_NOT_FOUND``, ``SCHEDULER_REJECTED`` (``--no-requeue``), ``SCHEDULER_BUSY``
                (still completing), or what the read or the raw call raise.
        """
        job = await self._require_job(job_id)
        already = expected_restart_count is not None and job.restart_count > expected_restart_count
        if not already and job.state is not JobState.PENDING:
            if not job.requeue_allowed:
                raise ReboundError(
                    FailureKind.SCHEDULER_REJECTED,
                    f"job {job_id} may not be requeued (submitted with --no-requeue, or JobRequeue=0)",
                )
            try:
                await self._requeue(job_id, hold)
                return
            except SlurmCallError as e:
                if e.errno == SlurmErrno.ALREADY_DONE:
                    raise SlurmCallError(
                        FailureKind.SCHEDULER_BUSY, f"job {job_id} is still completing: {e.message}", e.errno
                    ) from e
                if e.errno != SlurmErrno.JOB_PENDING:
                    raise
                job = await self._require_job(job_id)  # it went back to the queue meanwhile
        if hold and not is_held(job):
            if job.state is JobState.COMPLETING:
                raise ReboundError(
                    FailureKind.SCHEDULER_BUSY, f"job {job_id} is still completing its requeue; hold it once pending"
                )
            # Holding a running job would only bite at its next requeue, so only a waiting job is held.
            if job.state is JobState.PENDING:
                await self._hold(job_id)

    async def set_excluded_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        """See ``SchedulerActions.set_excluded_nodes``.

        Raises:
            ReboundError: ``JOB_NOT_FOUND``, ``NODE_NOT_FOUND``, ``SCHEDULER_REJECTED`` (running or finished,
                or a malformed node name), ``SCHEDULER_BUSY`` (started meanwhile), or what the read raises.
        """
        wanted = tuple(dict.fromkeys(nodes))
        try:
            hostlist = compress(wanted)
        except HostlistError as e:
            raise ReboundError(FailureKind.SCHEDULER_REJECTED, f"job {job_id}: {e}") from e
        job = await self._require_job(job_id)
        if set(job.excluded_nodes) == set(wanted):
            return
        if job.state not in _NOT_STARTED:
            raise ReboundError(
                FailureKind.SCHEDULER_REJECTED,
                f"job {job_id} is {job.state.value}: Slurm changes excluded nodes only before a job starts; "
                "requeue it (with hold=True) first",
            )
        await self._set_excluded(job_id, hostlist)

    async def release_job(self, job_id: int, *, start_now: bool = False) -> None:
        """See ``SchedulerActions.release_job``.

        Raises:
            ReboundError: ``JOB_NOT_FOUND``, ``SCHEDULER_REJECTED`` (finished), ``SCHEDULER_BUSY`` (``start_now``
                while the requeue is still COMPLETING, where Slurm ignores it), or what the read raises.
        """
        job = await self._require_job(job_id)
        if job.state.is_terminal():
            raise ReboundError(FailureKind.SCHEDULER_REJECTED, f"job {job_id} has already ended ({job.state.value})")
        if job.state not in _NOT_STARTED:
            return  # it has started: nothing holds it any more
        if start_now:
            if job.state is JobState.COMPLETING:
                raise ReboundError(
                    FailureKind.SCHEDULER_BUSY, f"job {job_id} is still completing; starttime=now would be ignored"
                )
            try:
                await self._start_now(job_id)
            except SlurmCallError as e:
                if e.errno == SlurmErrno.JOB_NOT_PENDING:
                    return  # it started between our read and our call
                raise
        if is_held(job):
            await self._release(job_id)

    async def restart_excluding(self, request: RestartRequest) -> RestartResult:
        """See ``SchedulerActions.restart_excluding``: requeue held, exclude, release (Slurm 22.05, ADR 009).

        Holding first means the exclusion can never race the job's restart. Starting at once (skipping Slurm's
        ``cred_expire`` wait) is only safe when every node of the previous run is excluded: those nodes revoke
        the job's credential for a while (see ``SchedulerActions.release_job``).

        Raises:
            ReboundError: ``JOB_NOT_FOUND``; ``SCHEDULER_BUSY`` while the old run is completing, holds a node
                Slurm has not declared DOWN yet, or is briefly still shown as ended; what the actions raise.
        """
        job_id = request.job_id
        job = await self._job_to_restart(job_id)
        if job.state is JobState.CANCELLED:
            # Its owner cancelled it (perhaps while we backed off): never bring back what a person stopped.
            return RestartResult(state=job.state, restart_count=job.restart_count)
        if job.state is JobState.COMPLETING:
            # The old run is still being torn down (by Slurm, an operator's requeue, or our earlier attempt).
            raise ReboundError(FailureKind.SCHEDULER_BUSY, f"job {job_id} is still completing")
        if job.state is not JobState.PENDING and job.restart_count <= request.expected_restart_count:
            # Not requeued yet (by us in an earlier attempt, by Slurm after a node failure, or by an operator):
            # a PENDING job already waits to run again, whatever its restart count says.
            await self._wait_for_dead_nodes(job)
            await self.requeue_job(job_id, hold=True, expected_restart_count=request.expected_restart_count)
            job = await self._job_to_restart(job_id)
        if job.state not in WAITING_OR_RUNNING:
            # COMPLETING (the old run is still being torn down), or briefly still shown as ended.
            raise ReboundError(FailureKind.SCHEDULER_BUSY, f"job {job_id} is {job.state.value}; not pending yet")
        start_now = False  # already running again (an earlier attempt released it)
        if job.state is JobState.PENDING:
            wanted = wanted_exclusion(request, job)
            if set(wanted) != set(job.excluded_nodes):
                await self.set_excluded_nodes(job_id, wanted)
            start_now = bool(request.previous_nodes) and set(request.previous_nodes) <= set(wanted)
            await self.release_job(job_id, start_now=start_now)
        return RestartResult(state=job.state, restart_count=job.restart_count, started_now=start_now)

    async def resubmit_excluding(self, request: ResubmitRequest) -> ResubmitResult:
        """See ``SchedulerActions.resubmit_excluding``: adopt what carries the token, else submit (ADR 014).

        Raises:
            ReboundError: What the listing or the raw submission raise.
        """
        carrying = sorted(
            job.job_id
            for job in await self.list_jobs()  # a fresh listing: an earlier attempt's job is there if it was made
            if token_in(job.comment) == request.token
            and job.user_id == request.user_id
            and job.job_id != request.job_id
            and (job.submit_time is None or job.submit_time >= request.not_before - CLOCK_SKEW)
        )
        if carrying:
            return ResubmitResult(job_id=carrying[0], adopted=True)
        args = sbatch_arguments(
            request.options,
            user_id=request.user_id,
            group_id=request.group_id,
            working_directory=request.working_directory,
            exclude=request.exclude,
            token=request.token,
        )
        return ResubmitResult(job_id=await self._submit(args, request.script, request.environment), adopted=False)

    async def _job_to_restart(self, job_id: int) -> SlurmJob:
        job = await self.get_job(job_id)
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
        nodes = {n.name: n for n in await self.list_nodes()}
        unlisted = [n for n in job.nodes if n not in nodes]
        if unlisted:
            # A node the listing does not show cannot be judged alive: fail closed, read again (never "fine").
            raise ReboundError(
                FailureKind.SCHEDULER_BUSY,
                f"job {job.job_id} holds node(s) {', '.join(unlisted)} the node listing does not show: cannot tell "
                "whether they are dead; not requeuing on that",
            )
        dying = [n for n in job.nodes if not nodes[n].is_responding and nodes[n].state is not NodeBaseState.DOWN]
        if dying:
            raise ReboundError(
                FailureKind.SCHEDULER_BUSY,
                f"job {job.job_id} still holds unresponsive node(s) {', '.join(dying)}: waiting for Slurm to "
                "declare them DOWN before requeuing",
            )

    async def _require_job(self, job_id: int) -> SlurmJob:
        job = await self.get_job(job_id)
        if job is None:
            raise ReboundError(FailureKind.JOB_NOT_FOUND, f"job {job_id} is not known to the scheduler")
        return job

    async def _require_node(self, name: str) -> SlurmNode:
        node = await self.get_node(name)
        if node is None:
            raise ReboundError(FailureKind.NODE_NOT_FOUND, f"node {name} is not part of the cluster")
        return node


def wanted_exclusion(request: RestartRequest, job: SlurmJob) -> tuple[str, ...]:
    """The exclusion a restarted job must carry: its owner's plus ``request.exclude`` (sorted, no repeats).

    Without a recorded owner's exclusion, what the job excludes now stands in for it (nothing is ever dropped).
    """
    kept = job.excluded_nodes if request.user_excluded is None else request.user_excluded
    return tuple(sorted(set(kept) | set(request.exclude)))


def _needs_resume(node: SlurmNode) -> bool:
    return node.is_drained or node.state in (NodeBaseState.DOWN, NodeBaseState.ERROR)
