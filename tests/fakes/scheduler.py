"""An in-memory Slurm behind ``SchedulerPort``, for workflow and activity tests (SkyPilot's FakeCloud, for Slurm).

``FakeScheduler`` keeps jobs and nodes as domain models and imitates what Slurm 22.05 does at the raw-call level
(the primitives of ``GuardedActions``), including its awkward parts, so the real idempotency layer runs on top:

* a drain replaces an existing reason silently (the guard is what refuses it);
* requeue of a pending job fails with "Job is pending execution", of a ``--no-requeue`` job with "presently
  disabled"; exclusion of a running job with "no longer pending execution"; resume of a healthy node with
  "Invalid node state specified";
* a requeue increments ``restart_count``, clears the allocation and leaves the job PENDING (``BeginTime``, or
  ``JobHeldUser`` with hold); with ``requeue_completes_instantly=False`` it stays COMPLETING until ``settle``;
* a node that goes down requeues its requeueable jobs (NODE_FAIL for the others), as Slurm does.

Resubmission (ADR 014): ``read_submission`` answers from the job's fields, ``scripts`` (default: a one-line
script) and ``environments`` (default: not captured); the raw ``_submit`` reads its ``sbatch`` arguments back
into a new PENDING job (``schedule`` starts it). ``lose_submit_answer`` makes the next submissions go through
and then fail as a worker killed right after ``sbatch`` would (the job exists, its id was never returned).

Known fidelity gaps: no ``cred_expire`` delay (``schedule`` starts any eligible job at once), one job per node,
no partitions or resources beyond node counts, no ``MinJobAge`` (use ``forget_job``), no step or log output.

Test-side controls: ``submit``, ``schedule``, ``fail_job``, ``finish_job``, ``requeue_by_slurm``, ``node_down``,
``node_up``, ``settle``, ``forget_job``, ``fail_next`` and ``unreachable``. ``calls`` records every port call
made by the code under test, and every action (``restart_excluding`` is a sequence of them, each recorded after
it); ``slurm_calls`` the raw calls that reached "Slurm" (a no-op leaves none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from activities.slurm.errors import SlurmErrno, default_kind
from activities.slurm.guarded import GuardedActions, SlurmCallError, is_held
from activities.slurm.hostlist import expand
from activities.slurm.port import JobSubmission, RestartRequest, RestartResult, ResubmitRequest, ResubmitResult
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import ClusterSnapshot, JobState, NodeBaseState, SlurmJob, SlurmNode
from workflows.domain.submission import SubmissionOptions

__all__ = ["Call", "FakeScheduler"]

_ACTIONS = frozenset(
    {
        "drain_node",
        "resume_node",
        "requeue_job",
        "set_excluded_nodes",
        "release_job",
        "restart_excluding",
        "resubmit_excluding",
    }
)


@dataclass(frozen=True)
class Call:
    """One recorded call: the method name and its arguments (keyword arguments included, by name)."""

    method: str
    args: tuple[object, ...] = ()
    kwargs: dict[str, object] = field(default_factory=dict)


class FakeScheduler(GuardedActions):
    """In-memory ``SchedulerPort``. Node names default to the lab's ``n1``..``n4``."""

    def __init__(
        self,
        nodes: Sequence[str] = ("n1", "n2", "n3", "n4"),
        *,
        clock: Callable[[], datetime] | None = None,
        user: str = "root",
    ) -> None:
        self.clock = clock or (lambda: datetime.now(UTC))
        self.user = user
        self.jobs: dict[int, SlurmJob] = {}
        self.nodes: dict[str, SlurmNode] = {
            name: SlurmNode(name=name, state=NodeBaseState.IDLE, partitions=("main",), gres="gpu:4", cpus=4)
            for name in nodes
        }
        self.calls: list[Call] = []
        self.slurm_calls: list[Call] = []
        self.unreachable = False
        self.requeue_completes_instantly = True
        self.scripts: dict[int, bytes] = {}
        self.environments: dict[int, dict[str, str]] = {}
        """What slurmctld saved as a job's environment (absent: the backend cannot read it)."""
        self.submitted: list[tuple[tuple[str, ...], bytes, dict[str, str]]] = []
        """Every submission that reached "Slurm": sbatch's arguments, the script, the environment."""
        self.lose_submit_answer = 0
        self._failures: dict[str, list[ReboundError]] = {}
        self._next_id = 1
        self._depth = 0

    # ----- test-side controls ---------------------------------------------------------------------------------

    def submit(
        self,
        nodes: int | Sequence[str] = 2,
        *,
        name: str = "train",
        requeue: bool = True,
        start: bool = True,
        comment: str = "",
        user_id: int | None = None,
    ) -> SlurmJob:
        """Add a job; with ``start`` it runs at once on the given (or the first free usable) nodes."""
        job_id = self._next_id
        self._next_id += 1
        count = nodes if isinstance(nodes, int) else len(nodes)
        now = self.clock()
        self.jobs[job_id] = SlurmJob(
            job_id=job_id,
            name=name,
            user=self.user,
            partition="main",
            state=JobState.PENDING,
            requeue_allowed=requeue,
            node_count=count,
            task_count=count,
            submit_time=now,
            eligible_time=now,
            standard_output=f"/lab/runs/{name}-{job_id}.out",
            standard_error=f"/lab/runs/{name}-{job_id}.out",
            comment=comment,
            user_id=user_id,
            working_directory="/lab/runs",
        )
        if start:
            self._start(job_id, None if isinstance(nodes, int) else tuple(nodes))
        return self.jobs[job_id]

    def schedule(self) -> list[int]:
        """Start every pending, unheld, eligible job that fits on free usable nodes; returns their ids."""
        started = []
        for job in list(self.jobs.values()):
            if job.state is JobState.PENDING and not is_held(job) and self._free_nodes(job):
                self._start(job.job_id, None)
                started.append(job.job_id)
        return started

    def fail_job(
        self,
        job_id: int,
        *,
        exit_code: int | None = 1,
        signal: int | None = None,
        state: JobState = JobState.FAILED,
        reason: str = "NonZeroExitCode",
    ) -> SlurmJob:
        """End the job abnormally (``exit_code`` None with a ``signal`` for a killed batch script)."""
        return self._end(job_id, state, reason, exit_code, signal)

    def finish_job(self, job_id: int) -> SlurmJob:
        """End the job successfully."""
        return self._end(job_id, JobState.COMPLETED, "", 0, None)

    def requeue_by_slurm(self, job_id: int) -> SlurmJob:
        """Requeue as Slurm itself does after a node failure (not a port call: nothing is recorded)."""
        self._do_requeue(job_id, hold=False)
        return self.jobs[job_id]

    def settle(self, job_id: int) -> SlurmJob:
        """Finish a requeue left COMPLETING (``requeue_completes_instantly=False``): the job becomes PENDING."""
        self._update(job_id, state=JobState.PENDING)
        return self.jobs[job_id]

    def node_down(self, name: str, reason: str = "Not responding") -> SlurmNode:
        """The node stops responding: DOWN, and its jobs are requeued (or NODE_FAIL without ``--requeue``)."""
        self._set_node(
            name,
            state=NodeBaseState.DOWN,
            flags=(*_without(self.nodes[name].flags, "NOT_RESPONDING"), "NOT_RESPONDING"),
            reason=reason,
            reason_set_by_user=self.user,
            reason_changed_at=self.clock(),
        )
        for job in list(self.jobs.values()):
            if job.state is JobState.RUNNING and name in job.nodes:
                if job.requeue_allowed:
                    self._do_requeue(job.job_id, hold=False)
                else:
                    self._end(job.job_id, JobState.NODE_FAIL, "NodeDown", None, None)
        return self.nodes[name]

    def node_up(self, name: str) -> SlurmNode:
        """slurmd is back (ReturnToService=2): responding and idle, a drain stays."""
        node = self.nodes[name]
        drained = node.is_drained
        self._set_node(
            name,
            state=NodeBaseState.IDLE,
            flags=_without(node.flags, "NOT_RESPONDING"),
            reason=node.reason if drained else "",
            reason_set_by_user=node.reason_set_by_user if drained else "",
        )
        return self.nodes[name]

    def forget_job(self, job_id: int) -> None:
        """Slurm purged the job (``MinJobAge`` passed): it is no longer listed."""
        del self.jobs[job_id]

    def fail_next(self, method: str, error: ReboundError | FailureKind, times: int = 1) -> None:
        """Make the next ``times`` calls of port method ``method`` raise ``error`` before doing anything."""
        if isinstance(error, FailureKind):
            error = ReboundError(error, f"injected {error.value} on {method}")
        self._failures.setdefault(method, []).extend([error] * times)

    # ----- SchedulerReads -------------------------------------------------------------------------------------

    async def snapshot(self) -> ClusterSnapshot:
        """See ``SchedulerReads.snapshot``."""
        with self._port_call("snapshot"):
            return ClusterSnapshot(
                observed_at=self.clock(), jobs=tuple(self.jobs.values()), nodes=tuple(self.nodes.values())
            )

    async def list_jobs(self) -> tuple[SlurmJob, ...]:
        """See ``SchedulerReads.list_jobs``."""
        with self._port_call("list_jobs"):
            return tuple(self.jobs.values())

    async def get_job(self, job_id: int) -> SlurmJob | None:
        """See ``SchedulerReads.get_job``."""
        with self._port_call("get_job", job_id):
            return self.jobs.get(job_id)

    async def list_nodes(self) -> tuple[SlurmNode, ...]:
        """See ``SchedulerReads.list_nodes``."""
        with self._port_call("list_nodes"):
            return tuple(self.nodes.values())

    async def get_node(self, name: str) -> SlurmNode | None:
        """See ``SchedulerReads.get_node``."""
        with self._port_call("get_node", name):
            return self.nodes.get(name)

    async def ping(self) -> None:
        """See ``SchedulerReads.ping``."""
        with self._port_call("ping"):
            return None

    # ----- SchedulerActions (the guard in GuardedActions decides; the raw calls below imitate Slurm) -----------

    async def drain_node(self, node: str, reason: str) -> None:
        """See ``SchedulerActions.drain_node``."""
        with self._port_call("drain_node", node, reason):
            await super().drain_node(node, reason)

    async def resume_node(self, node: str, *, expected_reason: str | None = None) -> None:
        """See ``SchedulerActions.resume_node``."""
        with self._port_call("resume_node", node, expected_reason=expected_reason):
            await super().resume_node(node, expected_reason=expected_reason)

    async def requeue_job(self, job_id: int, *, hold: bool = False, expected_restart_count: int | None = None) -> None:
        """See ``SchedulerActions.requeue_job``."""
        with self._port_call("requeue_job", job_id, hold=hold, expected_restart_count=expected_restart_count):
            await super().requeue_job(job_id, hold=hold, expected_restart_count=expected_restart_count)

    async def set_excluded_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        """See ``SchedulerActions.set_excluded_nodes``."""
        with self._port_call("set_excluded_nodes", job_id, tuple(nodes)):
            await super().set_excluded_nodes(job_id, nodes)

    async def release_job(self, job_id: int, *, start_now: bool = False) -> None:
        """See ``SchedulerActions.release_job``."""
        with self._port_call("release_job", job_id, start_now=start_now):
            await super().release_job(job_id, start_now=start_now)

    async def restart_excluding(self, request: RestartRequest) -> RestartResult:
        """See ``SchedulerActions.restart_excluding`` (the Slurm 22.05 sequence of ``GuardedActions``)."""
        with self._port_call("restart_excluding", request):
            return await super().restart_excluding(request)

    async def resubmit_excluding(self, request: ResubmitRequest) -> ResubmitResult:
        """See ``SchedulerActions.resubmit_excluding`` (adopt or submit: ``GuardedActions``)."""
        with self._port_call("resubmit_excluding", request.job_id, request.token):
            return await super().resubmit_excluding(request)

    async def read_submission(self, job_id: int) -> JobSubmission:
        """See ``SchedulerActions.read_submission``: the job's own fields, ``scripts[job_id]`` as its script."""
        with self._port_call("read_submission", job_id):
            job = self._job_or_raise(job_id)
            options = SubmissionOptions(
                name=job.name,
                partition=job.partition,
                nodes=job.node_count,
                ntasks=job.task_count,
                output=job.standard_output,
                error=job.standard_error,
                comment=job.comment,
                excluded_nodes=job.excluded_nodes,
                requeue=job.requeue_allowed,
            )
            return JobSubmission(
                job_id=job_id,
                user=job.user,
                user_id=job.user_id or 0,
                group_id=job.user_id or 0,
                working_directory=job.working_directory or "/lab/runs",
                options=options,
                script=self.scripts.get(job_id, b"#!/bin/bash\nsrun python train.py\n"),
                environment=self.environments.get(job_id),
                environment_note="captured from the fake's saved environment" if job_id in self.environments else "",
            )

    async def _submit(self, args: Sequence[str], script: bytes, env: Mapping[str, str]) -> int:
        self._raw("submit", *args)
        self.submitted.append((tuple(args), script, dict(env)))
        given = dict(a.removeprefix("--").partition("=")[::2] for a in args)
        job = self.submit(
            int(given.get("nodes", "1")),
            name=given.get("job-name", "sbatch"),
            requeue="requeue" in given,
            start=False,
            comment=given.get("comment", ""),
            user_id=int(given["uid"]),
        )
        self._update(job.job_id, excluded_nodes=expand(given.get("exclude", "")))
        self.scripts[job.job_id] = script
        if self.lose_submit_answer:
            self.lose_submit_answer -= 1
            raise ReboundError(FailureKind.SCHEDULER_TIMEOUT, "fake: the worker died after sbatch answered")
        return job.job_id

    async def _drain(self, node: str, reason: str) -> None:
        self._raw("drain", node, reason)
        current = self._node_or_raise(node)
        self._set_node(
            node,
            flags=(*_without(current.flags, "DRAIN"), "DRAIN"),
            reason=reason,
            reason_set_by_user=self.user,
            reason_changed_at=self.clock(),
        )

    async def _resume(self, node: str) -> None:
        self._raw("resume", node)
        current = self._node_or_raise(node)
        if not current.is_drained and current.state is not NodeBaseState.DOWN:
            raise _slurm_error(SlurmErrno.INVALID_NODE_STATE, "slurm_update error: Invalid node state specified")
        busy = any(j.state is JobState.RUNNING and node in j.nodes for j in self.jobs.values())
        state = NodeBaseState.ALLOCATED if busy else NodeBaseState.IDLE
        self._set_node(
            node,
            state=state,
            flags=_without(current.flags, "DRAIN"),
            reason="",
            reason_set_by_user="",
            reason_changed_at=None,
        )

    async def _requeue(self, job_id: int, hold: bool) -> None:
        self._raw("requeuehold" if hold else "requeue", job_id)
        job = self._job_or_raise(job_id)
        if job.state in (JobState.PENDING, JobState.COMPLETING):  # the fake's COMPLETING is always a requeue
            raise _slurm_error(SlurmErrno.JOB_PENDING, f"Job is pending execution for job {job_id}")
        if not job.requeue_allowed:
            raise _slurm_error(SlurmErrno.DISABLED, f"Requested operation is presently disabled for job {job_id}")
        self._do_requeue(job_id, hold)

    async def _hold(self, job_id: int) -> None:
        self._raw("uhold", job_id)
        job = self._job_or_raise(job_id)
        if job.state in (JobState.PENDING, JobState.COMPLETING):
            self._update(job_id, state_reason="JobHeldUser")

    async def _set_excluded(self, job_id: int, hostlist: str) -> None:
        self._raw("excnodelist", job_id, hostlist)
        job = self._job_or_raise(job_id)
        if job.state not in (JobState.PENDING, JobState.COMPLETING):
            raise _slurm_error(SlurmErrno.JOB_NOT_PENDING, f"Job is no longer pending execution for job {job_id}")
        names = expand(hostlist)
        if any(name not in self.nodes for name in names):
            raise _slurm_error(SlurmErrno.INVALID_NODE_NAME, f"Invalid node name specified for job {job_id}")
        self._update(job_id, excluded_nodes=names)

    async def _release(self, job_id: int) -> None:
        self._raw("release", job_id)
        job = self._job_or_raise(job_id)
        if job.state.is_terminal():
            raise _slurm_error(SlurmErrno.JOB_FINISHED, f"Job has already finished for job {job_id}")
        if is_held(job):
            self._update(job_id, state_reason="")

    async def _start_now(self, job_id: int) -> None:
        self._raw("starttime=now", job_id)
        job = self._job_or_raise(job_id)
        if job.state is not JobState.PENDING:
            raise _slurm_error(SlurmErrno.JOB_NOT_PENDING, f"Job is no longer pending execution for job {job_id}")
        self._update(job_id, eligible_time=self.clock())

    # ----- internals ------------------------------------------------------------------------------------------

    @contextmanager
    def _port_call(self, method: str, *args: object, **kwargs: object) -> Iterator[None]:
        # The outermost call is recorded, and every action (a restart is made of them, and a test that asserts no
        # requeue happened must see one inside it); the guard's own fresh reads are the adapter's business.
        if self._depth == 0 or method in _ACTIONS:
            self.calls.append(Call(method, args, dict(kwargs)))
            if self.unreachable:
                raise ReboundError(FailureKind.SCHEDULER_UNREACHABLE, "fake slurmctld is unreachable")
            pending = self._failures.get(method)
            if pending:
                raise pending.pop(0)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def _raw(self, method: str, *args: object) -> None:
        self.slurm_calls.append(Call(method, args))

    def _job_or_raise(self, job_id: int) -> SlurmJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise _slurm_error(SlurmErrno.INVALID_JOB_ID, f"Invalid job id specified for job {job_id}")
        return job

    def _node_or_raise(self, name: str) -> SlurmNode:
        node = self.nodes.get(name)
        if node is None:
            raise _slurm_error(SlurmErrno.INVALID_NODE_NAME, "slurm_update error: Invalid node name specified")
        return node

    def _update(self, job_id: int, **changes: object) -> None:
        self.jobs[job_id] = self.jobs[job_id].model_copy(update=changes)

    def _set_node(self, name: str, **changes: object) -> None:
        self.nodes[name] = self.nodes[name].model_copy(update=changes)

    def _free_nodes(self, job: SlurmJob) -> tuple[str, ...] | None:
        busy = {n for j in self.jobs.values() if j.state is JobState.RUNNING for n in j.nodes}
        free = [n.name for n in self.nodes.values() if n.is_usable and n.name not in busy]
        free = [n for n in free if n not in job.excluded_nodes]
        return tuple(free[: job.node_count]) if len(free) >= job.node_count else None

    def _start(self, job_id: int, nodes: tuple[str, ...] | None) -> None:
        chosen = nodes if nodes is not None else self._free_nodes(self.jobs[job_id])
        if chosen is None:
            raise AssertionError(f"fake: no free usable nodes for job {job_id}")
        self._update(
            job_id,
            state=JobState.RUNNING,
            state_reason="",
            nodes=chosen,
            batch_host=chosen[0],
            start_time=self.clock(),
            end_time=None,
            exit_code=None,
            exit_signal=None,
        )
        for name in chosen:
            self._set_node(name, state=NodeBaseState.ALLOCATED)

    def _end(self, job_id: int, state: JobState, reason: str, code: int | None, signal: int | None) -> SlurmJob:
        job = self.jobs[job_id]
        self._update(
            job_id, state=state, state_reason=reason, exit_code=code, exit_signal=signal, end_time=self.clock()
        )
        self._free(job.nodes)
        return self.jobs[job_id]

    def _do_requeue(self, job_id: int, hold: bool) -> None:
        job = self.jobs[job_id]
        now = self.clock()
        self._update(
            job_id,
            state=JobState.PENDING if self.requeue_completes_instantly else JobState.COMPLETING,
            state_reason="JobHeldUser" if hold else "BeginTime",
            restart_count=job.restart_count + 1,
            nodes=(),
            batch_host="",
            start_time=None,
            end_time=None,
            exit_code=None,
            exit_signal=None,
            submit_time=now,
            eligible_time=now,
        )
        self._free(job.nodes)

    def _free(self, names: Sequence[str]) -> None:
        for name in names:
            node = self.nodes.get(name)
            if node is not None and node.state is NodeBaseState.ALLOCATED:
                self._set_node(name, state=NodeBaseState.IDLE)


def _without(flags: tuple[str, ...], flag: str) -> tuple[str, ...]:
    return tuple(f for f in flags if f != flag)


def _slurm_error(errno: SlurmErrno, text: str) -> SlurmCallError:
    return SlurmCallError(default_kind(errno), f"fake scontrol: {text}", errno)
