"""The in-memory FakeScheduler: Slurm-like raw behaviour under the real idempotency guard."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from activities.slurm.port import SchedulerPort
from tests.fakes.scheduler import Call, FakeScheduler
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import JobState, NodeBaseState


@pytest.fixture
def fake() -> FakeScheduler:
    return FakeScheduler(clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))


async def _kind_of(awaitable: object) -> FailureKind:
    with pytest.raises(ReboundError) as caught:
        await awaitable  # type: ignore[misc]  # any coroutine of the fake
    return caught.value.kind


async def test_is_a_port_with_a_cluster(fake: FakeScheduler) -> None:
    assert isinstance(fake, SchedulerPort)
    job = fake.submit(2)
    snapshot = await fake.snapshot()
    assert snapshot.job(job.job_id) == job
    assert job.state is JobState.RUNNING and job.nodes == ("n1", "n2")
    assert {n.name: n.state for n in snapshot.nodes}["n1"] is NodeBaseState.ALLOCATED
    await fake.ping()
    assert [c.method for c in fake.calls] == ["snapshot", "ping"]


async def test_drain_records_port_and_slurm_calls_separately(fake: FakeScheduler) -> None:
    await fake.drain_node("n2", "rebound: xid 79")
    await fake.drain_node("n2", "rebound: xid 79")
    assert fake.calls == [Call("drain_node", ("n2", "rebound: xid 79"))] * 2
    assert fake.slurm_calls == [Call("drain", ("n2", "rebound: xid 79"))]  # the retry was a no-op
    node = await fake.get_node("n2")
    assert node is not None and node.is_drained and node.reason == "rebound: xid 79"
    assert await _kind_of(fake.drain_node("n2", "ops: cable")) is FailureKind.NOT_OWNED


async def test_resume_ownership(fake: FakeScheduler) -> None:
    await fake.drain_node("n3", "ops: cable")
    assert await _kind_of(fake.resume_node("n3", expected_reason="rebound: x")) is FailureKind.NOT_OWNED
    await fake.resume_node("n3")
    await fake.resume_node("n3")
    assert [c.method for c in fake.slurm_calls] == ["drain", "resume"]
    assert fake.nodes["n3"].is_usable


async def test_recovery_sequence_moves_the_job_off_the_bad_node(fake: FakeScheduler) -> None:
    job = fake.submit(2)
    await fake.requeue_job(job.job_id, hold=True, expected_restart_count=0)
    await fake.requeue_job(job.job_id, hold=True, expected_restart_count=0)  # a retried activity
    await fake.set_excluded_nodes(job.job_id, ["n2"])
    assert fake.schedule() == []  # held
    await fake.release_job(job.job_id, start_now=True)
    assert fake.schedule() == [job.job_id]
    after = fake.jobs[job.job_id]
    assert (after.state, after.restart_count, after.excluded_nodes) == (JobState.RUNNING, 1, ("n2",))
    assert "n2" not in after.nodes
    assert [c.method for c in fake.slurm_calls] == ["requeuehold", "excnodelist", "starttime=now", "release"]


async def test_requeue_busy_while_completing(fake: FakeScheduler) -> None:
    fake.requeue_completes_instantly = False
    job = fake.submit(1)
    await fake.requeue_job(job.job_id)
    assert fake.jobs[job.job_id].state is JobState.COMPLETING
    await fake.set_excluded_nodes(job.job_id, ["n1"])  # allowed while completing, as in Slurm
    kind = await _kind_of(fake.release_job(job.job_id, start_now=True))
    assert kind is FailureKind.SCHEDULER_BUSY
    fake.settle(job.job_id)
    await fake.release_job(job.job_id, start_now=True)


async def test_requeue_refusals(fake: FakeScheduler) -> None:
    job = fake.submit(1, requeue=False)
    assert await _kind_of(fake.requeue_job(job.job_id)) is FailureKind.SCHEDULER_REJECTED
    assert await _kind_of(fake.requeue_job(99)) is FailureKind.JOB_NOT_FOUND
    assert await _kind_of(fake.set_excluded_nodes(job.job_id, ["n2"])) is FailureKind.SCHEDULER_REJECTED


async def test_exclusion_of_an_unknown_node(fake: FakeScheduler) -> None:
    job = fake.submit(1, start=False)
    assert await _kind_of(fake.set_excluded_nodes(job.job_id, ["n9"])) is FailureKind.NODE_NOT_FOUND


async def test_node_failure_requeues_or_fails_its_jobs(fake: FakeScheduler) -> None:
    requeueable = fake.submit(["n1", "n2"])
    fragile = fake.submit(["n3"], requeue=False)
    fake.node_down("n2")
    fake.node_down("n3")
    assert fake.jobs[requeueable.job_id].state is JobState.PENDING
    assert fake.jobs[requeueable.job_id].restart_count == 1
    assert fake.jobs[fragile.job_id].state is JobState.NODE_FAIL
    assert not fake.nodes["n2"].is_responding
    # Slurm requeued it already: the workflow's own requeue (expecting 0 restarts) only holds it.
    await fake.requeue_job(requeueable.job_id, hold=True, expected_restart_count=0)
    assert fake.jobs[requeueable.job_id].state_reason == "JobHeldUser"
    assert [c.method for c in fake.slurm_calls] == ["uhold"]
    fake.node_up("n2")
    assert fake.nodes["n2"].is_usable


async def test_job_endings(fake: FakeScheduler) -> None:
    a, b = fake.submit(1), fake.submit(1)
    fake.fail_job(a.job_id, exit_code=None, signal=9, reason="JobLaunchFailure")
    fake.finish_job(b.job_id)
    assert (fake.jobs[a.job_id].exit_signal, fake.jobs[b.job_id].exit_code) == (9, 0)
    assert fake.nodes["n1"].state is NodeBaseState.IDLE
    assert await _kind_of(fake.release_job(a.job_id)) is FailureKind.SCHEDULER_REJECTED
    fake.forget_job(a.job_id)
    assert await fake.get_job(a.job_id) is None


async def test_failure_injection(fake: FakeScheduler) -> None:
    fake.fail_next("snapshot", FailureKind.SCHEDULER_TIMEOUT, times=2)
    assert await _kind_of(fake.snapshot()) is FailureKind.SCHEDULER_TIMEOUT
    assert await _kind_of(fake.snapshot()) is FailureKind.SCHEDULER_TIMEOUT
    await fake.snapshot()
    fake.unreachable = True
    assert await _kind_of(fake.drain_node("n1", "rebound: x")) is FailureKind.SCHEDULER_UNREACHABLE
    assert fake.slurm_calls == []
