"""JobRecovery on a real (in-memory) Temporal dev server: the real activities over the FakeScheduler, with real
rank log files in a temp directory. Slurm itself is exercised by the e2e tests; here the loop's logic is."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.worker import Worker

from activities.gpu.dcgm_activities import DcgmActivities, DcgmTargets
from activities.logs.attribution import AttributionActivities
from activities.logs.watch import WatchActivities
from activities.slurm.actions import SlurmActionActivities
from activities.slurm.activities import SlurmActivities
from activities.slurm.resubmission import SubmissionActivities
from activities.slurm.snapshots import SnapshotCache
from activities.temporal.fleet import FleetActivities
from activities.webhooks.notify import NotifyActivities
from tests.fakes.scheduler import FakeScheduler
from tests.munge_support import MungeLab
from workflows.constants import (
    CAUSE,
    OPERATOR_REQUEST_UPDATE,
    RECOVERY_STATE,
    isolation_request_id,
    node_task_queue,
)
from workflows.domain.fleet import FleetMode, FleetPolicy, IsolationDecision
from workflows.domain.gpu import GpuEvent, GpuEventKind, GpuHealthReport, NvmlReadGpuHealthInput
from workflows.domain.incident import ActionKind, ActionRung
from workflows.domain.operators import OperatorAction, OperatorActionKind, OperatorRequest
from workflows.domain.recovery import (
    JobRecoveryInput,
    JobRecoveryResult,
    JobRecoveryStatus,
    PauseRequest,
    RecoverySpec,
    RecoveryState,
    RestartSetting,
)
from workflows.domain.slurm import JobState
from workflows.fleet import FleetWorkflow
from workflows.job_recovery import JobRecoveryWorkflow

Handle = WorkflowHandle[JobRecoveryWorkflow, JobRecoveryResult]


class Harness:
    """One test's world: a fake cluster with unique node names, rank logs on disk, a worker."""

    def __init__(self, client: Client, task_queue: str, tmp: Path, munge: MungeLab | None = None) -> None:
        tag = uuid.uuid4().hex[:6]
        self.nodes = [f"t{tag}n{i}" for i in range(1, 5)]
        self.sched = FakeScheduler(self.nodes)
        self.client, self.task_queue, self.tmp = client, task_queue, tmp
        self.snapshots = SnapshotCache(self.sched, max_age_s=0.05)
        # Each test has its own cluster, hence its own Fleet on this test's task queue. Acting, with a breaker
        # wide enough for these tests' drains (the breaker has its own tests).
        self.cluster = f"test{tag}"
        # Operators' credentials are verified by a real munged (tests.munge_support); root is the operator.
        self.operators = ["root"]
        self.munge = munge
        self.dcgm = DcgmTargets(None)
        """Which nodes have a DCGM exporter (none unless a test says)."""
        self.fleet_policy = FleetPolicy(
            mode=FleetMode.ACT, breaker_max_fraction=1.0, breaker_max_nodes=100, health_check_after_s=3600
        )

    def watch_activities(self) -> WatchActivities:
        return WatchActivities(self.snapshots)

    def extra_activities(self) -> list[Callable[..., Any]]:
        """Fakes registered by name beside the real activities (a subclass's)."""
        return []

    def worker(self, **options: Any) -> Worker:
        """The test's worker; ``options`` go to ``Worker`` (slots, more workflows)."""
        slurm = SlurmActivities(self.sched)
        watch = self.watch_activities()
        attribution = AttributionActivities(self.sched)
        actions = SlurmActionActivities(self.sched)
        submissions = SubmissionActivities(self.sched, self.tmp / "state")
        fleet = FleetActivities(
            self.client, self.sched, cluster=self.cluster, task_queue=self.task_queue, policy=self.fleet_policy
        )
        return Worker(
            self.client,
            task_queue=self.task_queue,
            workflows=[JobRecoveryWorkflow, FleetWorkflow, *options.pop("workflows", [])],
            activities=[
                slurm.observe_job,
                watch.anchor,
                watch.watch,
                watch.wait_resume,
                attribution.attribute_failure,
                actions.drain_node,
                actions.requeue_job,
                submissions.capture_submission,
                submissions.resubmit_job,
                fleet.request_isolation,
                fleet.cluster_view,
                fleet.view,
                fleet.resume_node,
                fleet.confirm_decision,
                NotifyActivities(None).notify_webhook,  # no webhook configured: "disabled" at once
                DcgmActivities(targets=lambda: self.dcgm, timeout_s=2).read_gpus,
                *([self.munge.verifier(self.operators).verify] if self.munge else []),
                *self.extra_activities(),
            ],
            **options,
        )

    def log(self, job_id: int, rank: int, *lines: str) -> None:
        with (self.tmp / f"job-{job_id}-rank-{rank}.log").open("a") as f:
            for line in lines:
                f.write(line + "\n")

    def step(self, job_id: int, rank: int, step: int, node: str) -> None:
        ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        self.log(job_id, rank, f"{ts} [INFO] rank={rank}/4 node={node} step={step} loss=0.5 step_time=0.1s")

    async def start(self, job_id: int, budget: int = 5, restart: RestartSetting = RestartSetting.AUTO) -> Handle:
        spec = RecoverySpec(logs=(str(self.tmp / "job-%j-*.log"),), restart_budget=budget, restart=restart)
        return await self.client.start_workflow(
            JobRecoveryWorkflow.run,
            JobRecoveryInput(cluster=self.cluster, job_id=job_id, poll_interval_s=0.1, spec=spec),
            id=f"rebound/test/job/{job_id}/{uuid.uuid4().hex}",
            task_queue=self.task_queue,
        )


@pytest_asyncio.fixture
async def h(temporal_client: Client, task_queue: str, tmp_path: Path, munge_lab: MungeLab) -> AsyncIterator[Harness]:
    harness = Harness(temporal_client, task_queue, tmp_path, munge_lab)
    async with harness.worker():
        yield harness


async def until(handle: Handle, pred: object, timeout: float = 20) -> JobRecoveryStatus:
    assert callable(pred)
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        st = await handle.query(JobRecoveryWorkflow.status)
        if pred(st):
            return st
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met; last state {st.state}: {[e.event for e in st.timeline]}")
        await asyncio.sleep(0.1)


def _actions(st: JobRecoveryStatus, kind: ActionKind) -> list[str]:
    return [a.target for i in st.incidents for a in i.actions if a.kind is kind]


async def test_rank_crash_is_excluded_restarted_and_verified(h: Harness) -> None:
    """A rank that exits on its own is the job's word against its node: the job restarts without the node, the
    Fleet records a suspicion, nothing is drained (``workflows.policy.action_ladder``)."""
    job = h.sched.submit(h.nodes[:2], name="llm")
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    h.step(job.job_id, 0, 7, h.nodes[0])

    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    h.log(job.job_id, 2, f"{ts} [ERROR] rank=2/4 node={h.nodes[1]} step=8 fatal error: exiting with code 13")
    h.log(job.job_id, 0, "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1")
    h.sched.fail_job(job.job_id, exit_code=13)

    st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    assert _actions(st, ActionKind.DRAIN) == []
    assert _actions(st, ActionKind.REQUEUE) == [str(job.job_id)]
    assert not h.sched.nodes[h.nodes[1]].is_drained
    excluded = next(e.detail for e in st.timeline if e.event == "EXCLUDED")
    # rank 2 runs on the second node (block layout)
    assert excluded.startswith(f"excluded {h.nodes[1]} from job {job.job_id}'s next placement: rank 2 failed first")
    assert excluded.endswith("a rank died with no hardware evidence; suspicion recorded")
    requeued = h.sched.jobs[job.job_id]
    assert requeued.restart_count == 1 and h.nodes[1] in requeued.excluded_nodes

    h.sched.schedule()
    assert h.nodes[1] not in h.sched.jobs[job.job_id].nodes
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"  # a line stamped days ago is an old run's
    h.log(job.job_id, 0, f"{now} [INFO] rank=0/4 node=x resumed from checkpoint step_000005 (step 5)")
    h.step(job.job_id, 0, 6, h.sched.jobs[job.job_id].nodes[0])
    st = await until(handle, lambda s: s.state is RecoveryState.WATCHING and s.incidents[-1].resumed_at is not None)

    inc = st.incidents[0]
    assert inc.attribution is not None and inc.attribution.implicated_ranks == (2,)
    assert inc.restarted_at is not None and inc.resumed_at is not None
    assert inc.resumed_from == "step_000005"
    assert all(a.verified_at is not None for a in inc.actions)
    assert [a.key.rsplit("/", 2)[-2:] for a in inc.actions] == [["incident-1", "requeue"]]
    assert inc.attribution.action is ActionRung.EXCLUDE
    assert st.restarts_used == 1
    desc = await handle.describe()
    assert desc.typed_search_attributes.get(CAUSE) == "rank-crash"
    assert desc.typed_search_attributes.get(RECOVERY_STATE) == "WATCHING"

    h.sched.finish_job(job.job_id)
    result = await asyncio.wait_for(handle.result(), 20)
    assert result.state is RecoveryState.FINISHED


def agent(h: Harness, node: str, *events: GpuEvent) -> Worker:
    """A node agent stand-in on ``node``'s own task queue: its fresh GPU read lists ``events`` (the real agent's
    read is tested against the real NVML library in tests/unit/gpu and on the lab)."""

    @activity.defn(name="nvml_read_gpu_health")
    async def read(params: NvmlReadGpuHealthInput) -> GpuHealthReport:
        return GpuHealthReport(host=node, events=events, next_event_cursor=len(events))

    return Worker(h.client, task_queue=node_task_queue(node), activities=[read])


async def test_gpu_fault_signal_interrupts_the_watch(h: Harness) -> None:
    job = h.sched.submit(h.nodes[:2])
    event = GpuEvent(kind=GpuEventKind.XID, host=h.nodes[0], index=1, xid=79, observed_at=datetime.now(UTC), sequence=1)
    async with agent(h, h.nodes[0], event), agent(h, h.nodes[1]):
        handle = await h.start(job.job_id)
        await until(handle, lambda s: s.state is RecoveryState.WATCHING)
        await handle.signal(JobRecoveryWorkflow.gpu_fault_reported, event)
        await handle.signal(JobRecoveryWorkflow.gpu_fault_reported, event)  # a duplicate changes nothing
        st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    inc = st.incidents[0]
    assert inc.detected_at == event.observed_at
    assert inc.attribution is not None and inc.attribution.cause == "xid-79"
    assert inc.attribution.implicated_gpus == (f"{h.nodes[0]}:1",)
    assert _actions(st, ActionKind.DRAIN) == [h.nodes[0]]
    assert len(st.incidents) == 1
    await handle.terminate()


async def test_a_forged_gpu_fault_signal_drains_nothing(h: Harness) -> None:
    """A GPU fault is node-level evidence only when the node's own agent lists it in a fresh read: a signal the
    agent never sent (anyone who reaches Temporal can signal) drains nothing."""
    job = h.sched.submit(h.nodes[:2])
    forged = GpuEvent(kind=GpuEventKind.XID, host=h.nodes[0], index=0, xid=79, observed_at=datetime.now(UTC))
    async with agent(h, h.nodes[0]), agent(h, h.nodes[1]):
        handle = await h.start(job.job_id)
        await until(handle, lambda s: s.state is RecoveryState.WATCHING)
        await handle.signal(JobRecoveryWorkflow.gpu_fault_reported, forged)
        st = await until(handle, lambda s: any(e.event == "GPU_CLAIM" for e in s.timeline))
        await asyncio.sleep(1)
        st = await handle.query(JobRecoveryWorkflow.status)
    claim = next(e.detail for e in st.timeline if e.event == "GPU_CLAIM")
    assert "XID 79" in claim and "forged?" in claim
    assert _actions(st, ActionKind.DRAIN) == [] and not h.sched.nodes[h.nodes[0]].is_drained
    # Not even an incident: the job was never touched, and it is watched again.
    assert not st.incidents and st.state is RecoveryState.WATCHING and h.sched.jobs[job.job_id].restart_count == 0
    await handle.terminate()


async def test_user_bug_gives_up_without_touching_the_cluster(h: Harness) -> None:
    job = h.sched.submit(h.nodes[:2])
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    for rank in range(4):
        h.log(job.job_id, rank, "Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
              "ValueError: shape mismatch: expected [batch, 32], got [32, 31]")  # fmt: skip
    h.sched.fail_job(job.job_id, exit_code=1)
    result = await asyncio.wait_for(handle.result(), 20)
    assert result.state is RecoveryState.GAVE_UP and "user-bug" in result.reason
    st = await handle.query(JobRecoveryWorkflow.status)
    assert st.incidents[0].attribution is not None and not st.incidents[0].attribution.retryable
    assert not [c for c in h.sched.calls if c.method in ("drain_node", "requeue_job")]
    assert h.sched.jobs[job.job_id].restart_count == 0


async def test_restart_budget_is_enforced(h: Harness) -> None:
    job = h.sched.submit(h.nodes[:2])
    handle = await h.start(job.job_id, budget=1)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    h.sched.fail_job(job.job_id, exit_code=1)  # no evidence: unknown, retried without exclusion
    await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    h.sched.schedule()
    h.step(job.job_id, 0, 1, h.nodes[0])
    await until(handle, lambda s: s.state is RecoveryState.WATCHING and s.restarts_used == 1)
    h.sched.fail_job(job.job_id, exit_code=1)
    result = await asyncio.wait_for(handle.result(), 20)
    assert result.state is RecoveryState.GAVE_UP and "budget" in result.reason
    assert h.sched.jobs[job.job_id].restart_count == 1


async def test_completed_job_finishes(h: Harness) -> None:
    job = h.sched.submit(h.nodes[:1], start=False)
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    h.sched.schedule()
    await until(handle, lambda s: s.job_state is JobState.RUNNING)
    h.sched.finish_job(job.job_id)
    result = await asyncio.wait_for(handle.result(), 20)
    assert result.state is RecoveryState.FINISHED


async def test_unknown_job_gives_up(h: Harness) -> None:
    handle = await h.start(424242)
    result = await asyncio.wait_for(handle.result(), 20)
    assert result.state is RecoveryState.GAVE_UP and "424242" in result.reason


async def test_owner_cancel_is_not_an_incident(h: Harness) -> None:
    job = h.sched.submit(h.nodes[:2])
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    h.sched._end(job.job_id, JobState.CANCELLED, "", None, 15)  # scancel
    h.log(job.job_id, 0, f"srun: error: {h.nodes[0]}: tasks 0-1: Terminated")
    result = await asyncio.wait_for(handle.result(), 20)
    assert result.state is RecoveryState.FINISHED and "cancelled" in result.reason
    assert not [c for c in h.sched.calls if c.method in ("drain_node", "requeue_job")]


async def test_a_job_that_may_not_be_requeued_gives_up_clearly(h: Harness) -> None:
    job = h.sched.submit(h.nodes[:2], requeue=False)
    handle = await h.start(job.job_id, restart=RestartSetting.REQUEUE)  # resubmission: test_job_recovery_resubmit
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    h.sched.fail_job(job.job_id, exit_code=1)
    result = await asyncio.wait_for(handle.result(), 30)
    assert result.state is RecoveryState.GAVE_UP
    assert "SCHEDULER_REJECTED" in result.reason and "--no-requeue" in result.reason


async def test_a_paused_job_is_not_watched_until_resumed(h: Harness, munge_lab: MungeLab) -> None:
    job = h.sched.submit(h.nodes[:2], name="llm")
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)

    def signed(kind: OperatorActionKind, note: str = "") -> OperatorRequest:
        action = OperatorAction(kind=kind, cluster=h.cluster, job_id=job.job_id, note=note, nonce=uuid.uuid4().hex)
        return munge_lab.request(action)

    with pytest.raises(WorkflowUpdateFailedError):  # unsigned: refused, nothing changes
        await handle.execute_update(JobRecoveryWorkflow.pause, PauseRequest(operator="op", note="maintenance"))
    st = await handle.execute_update(
        OPERATOR_REQUEST_UPDATE, result_type=JobRecoveryStatus, arg=signed(OperatorActionKind.PAUSE, "maint")
    )
    assert st.paused_by == "root"  # the verified Unix user, whatever the caller claims

    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    h.log(job.job_id, 2, f"{ts} [ERROR] rank=2/4 node={h.nodes[1]} step=8 fatal error: exiting with code 13")
    await asyncio.sleep(1.5)
    st = await handle.query(JobRecoveryWorkflow.status)
    assert not st.incidents and not h.sched.nodes[h.nodes[1]].is_drained  # paused: nothing seen, nothing done

    await handle.execute_update(
        OPERATOR_REQUEST_UPDATE, result_type=JobRecoveryStatus, arg=signed(OperatorActionKind.RESUME)
    )
    st = await until(handle, lambda s: bool(s.incidents) and s.state is not RecoveryState.WATCHING)
    assert st.paused_by == "" and [e.event for e in st.timeline].count("PAUSED") == 1


async def test_a_non_operator_cannot_pause_a_job(h: Harness, munge_lab: MungeLab) -> None:
    job = h.sched.submit(h.nodes[:2], name="llm")
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    action = OperatorAction(kind=OperatorActionKind.PAUSE, cluster=h.cluster, job_id=job.job_id, nonce="n" * 16)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(
            OPERATOR_REQUEST_UPDATE, result_type=JobRecoveryStatus, arg=munge_lab.request(action, user="nobody")
        )
    assert "nobody is not an operator" in str(refused.value.cause)
    other = action.model_copy(update={"job_id": job.job_id + 1, "nonce": "m" * 16})
    with pytest.raises(WorkflowUpdateFailedError) as wrong_job:  # a credential for another job's pause
        await handle.execute_update(
            OPERATOR_REQUEST_UPDATE, result_type=JobRecoveryStatus, arg=munge_lab.request(other)
        )
    assert "not this one" in str(wrong_job.value.cause)
    st = await handle.query(JobRecoveryWorkflow.status)
    assert st.paused_by == "" and st.state is RecoveryState.WATCHING


async def test_observe_mode_records_the_decision_and_touches_nothing(
    temporal_client: Client, task_queue: str, tmp_path: Path
) -> None:
    h = Harness(temporal_client, task_queue, tmp_path)
    h.fleet_policy = h.fleet_policy.model_copy(update={"mode": FleetMode.OBSERVE})
    async with h.worker():
        job = h.sched.submit(h.nodes[:2], name="llm")
        handle = await h.start(job.job_id)
        await until(handle, lambda s: s.state is RecoveryState.WATCHING)
        ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        h.log(job.job_id, 2, f"{ts} [ERROR] rank=2/4 node={h.nodes[1]} step=8 fatal error: exiting with code 13")
        h.sched.fail_job(job.job_id, exit_code=13)
        result = await asyncio.wait_for(handle.result(), 30)
        st = await handle.query(JobRecoveryWorkflow.status)
    assert result.state is RecoveryState.FINISHED and "observe mode" in result.reason
    inc = st.incidents[0]
    assert inc.attribution is not None and inc.attribution.implicated_nodes == (h.nodes[1],)
    assert inc.actions == () and inc.outcome.startswith("observed only")
    assert not h.sched.nodes[h.nodes[1]].is_drained and h.sched.jobs[job.job_id].restart_count == 0


async def test_a_forged_fleet_answer_is_ignored_and_the_fleets_own_decides(h: Harness) -> None:
    """``isolation_decided`` is a signal anyone who reaches Temporal can send; the job acts only on the Fleet's own
    record (a query). A forged answer sent ahead of the request (its id is predictable) says "observe only" and
    "exclude the other node"; the Fleet (acting) really decides, and that is what happens."""
    job = h.sched.submit(h.nodes[:2], name="llm")
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    forged = IsolationDecision(
        request_id=isolation_request_id(handle.id, 1),
        mode=FleetMode.OBSERVE,
        act=False,
        exclude=(h.nodes[0],),
        reasons=("forged",),
        decided_at=datetime.now(UTC),
    )
    await handle.signal(JobRecoveryWorkflow.isolation_decided, forged)

    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    h.log(job.job_id, 2, f"{ts} [ERROR] rank=2/4 node={h.nodes[1]} step=8 fatal error: exiting with code 13")
    h.sched.fail_job(job.job_id, exit_code=13)
    st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    assert any(e.event == "FLEET" and "forged?" in e.detail for e in st.timeline)
    assert _actions(st, ActionKind.REQUEUE) == [str(job.job_id)]  # the Fleet acts; the forgery said observe only
    requeued = h.sched.jobs[job.job_id]
    assert h.nodes[1] in requeued.excluded_nodes and h.nodes[0] not in requeued.excluded_nodes


async def test_the_owner_pauses_rebound_in_the_jobs_comment(h: Harness) -> None:
    """``scontrol update job=N comment='rebound: monitor=off'``: the owner (Slurm authenticates them) pauses
    Rebound; a crash is recorded, nothing is done, and the ended job is not restarted."""
    job = h.sched.submit(h.nodes[:2], name="llm", comment="rebound: budget=3")
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    h.sched.jobs[job.job_id] = h.sched.jobs[job.job_id].model_copy(update={"comment": "rebound: budget=3;monitor=off"})
    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    h.log(job.job_id, 2, f"{ts} [ERROR] rank=2/4 node={h.nodes[1]} step=8 fatal error: exiting with code 13")
    h.sched.fail_job(job.job_id, exit_code=13)
    result = await asyncio.wait_for(handle.result(), 30)
    assert result.state is RecoveryState.FINISHED and "monitor=off" in result.reason
    st = await handle.query(JobRecoveryWorkflow.status)
    assert any(e.event == "OWNER_PAUSED" for e in st.timeline)
    assert not [c for c in h.sched.calls if c.method in ("drain_node", "requeue_job")]
    assert h.sched.jobs[job.job_id].restart_count == 0
