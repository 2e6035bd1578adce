"""``restart_excluding``: the Slurm adapters' restart sequence (requeue held, exclude, release; ADR 009).

Run on the fake, which imitates Slurm 22.05 at the raw-call level under the real ``GuardedActions``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.slurm.actions import SlurmActionActivities
from activities.slurm.port import CompositeScheduler, RestartRequest, RestartResult
from tests.fakes.scheduler import Call, FakeScheduler
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.loop import RequeueInput
from workflows.domain.slurm import JobState


@pytest.fixture
def fake() -> FakeScheduler:
    return FakeScheduler()


async def _kind_of(call: Awaitable[object]) -> FailureKind:
    with pytest.raises(ReboundError) as caught:
        await call
    return caught.value.kind


def _request(
    job_id: int, exclude: tuple[str, ...], previous: tuple[str, ...] = (), expected: int = 0
) -> RestartRequest:
    return RestartRequest(job_id=job_id, exclude=exclude, previous_nodes=previous, expected_restart_count=expected)


async def test_a_running_job_is_requeued_held_excluded_and_released(fake: FakeScheduler) -> None:
    job = fake.submit(["n1", "n2"])
    result = await fake.restart_excluding(_request(job.job_id, ("n2",), previous=("n1", "n2")))
    assert result == RestartResult(state=JobState.PENDING, restart_count=1, started_now=False)
    assert [c.method for c in fake.slurm_calls] == ["requeuehold", "excnodelist", "release"]
    after = fake.jobs[job.job_id]
    assert (after.state, after.excluded_nodes, after.state_reason) == (JobState.PENDING, ("n2",), "")
    # Every action of the sequence is visible to tests, after the restart itself.
    assert [c.method for c in fake.calls] == ["restart_excluding", "requeue_job", "set_excluded_nodes", "release_job"]


async def test_it_starts_at_once_only_when_every_old_node_is_excluded(fake: FakeScheduler) -> None:
    job = fake.submit(["n1", "n2"])
    result = await fake.restart_excluding(_request(job.job_id, ("n1", "n2"), previous=("n1", "n2")))
    assert result.started_now
    assert [c.method for c in fake.slurm_calls] == ["requeuehold", "excnodelist", "starttime=now", "release"]
    assert fake.schedule() == [job.job_id]
    assert not {"n1", "n2"} & set(fake.jobs[job.job_id].nodes)


async def test_a_retry_after_the_restart_went_through_does_not_requeue_again(fake: FakeScheduler) -> None:
    job = fake.submit(["n1", "n2"])
    request = _request(job.job_id, ("n2",), previous=("n1", "n2"))
    await fake.restart_excluding(request)
    assert fake.schedule() == [job.job_id]
    again = await fake.restart_excluding(request)  # a retried activity: the successor already runs
    assert again == RestartResult(state=JobState.RUNNING, restart_count=1, started_now=False)
    assert [c.method for c in fake.slurm_calls] == ["requeuehold", "excnodelist", "release"]


async def test_slurms_own_requeue_is_only_excluded_and_released(fake: FakeScheduler) -> None:
    job = fake.submit(["n1", "n2"])
    fake.requeue_by_slurm(job.job_id)
    result = await fake.restart_excluding(_request(job.job_id, ("n2",)))
    assert result.state is JobState.PENDING and result.restart_count == 1
    assert [c.method for c in fake.slurm_calls] == ["excnodelist"]  # not held: nothing to release
    assert fake.jobs[job.job_id].excluded_nodes == ("n2",)


async def test_a_cancelled_job_is_never_brought_back(fake: FakeScheduler) -> None:
    job = fake.submit(["n1"])
    fake.fail_job(job.job_id, state=JobState.CANCELLED, exit_code=None, signal=15, reason="")
    result = await fake.restart_excluding(_request(job.job_id, ("n1",)))
    assert result == RestartResult(state=JobState.CANCELLED, restart_count=0)
    assert fake.slurm_calls == []


async def test_not_yet(fake: FakeScheduler) -> None:
    fake.requeue_completes_instantly = False
    job = fake.submit(["n1", "n2"])
    await fake.requeue_job(job.job_id)  # an operator's requeue, still tearing the old run down
    assert await _kind_of(fake.restart_excluding(_request(job.job_id, ("n2",)))) is FailureKind.SCHEDULER_BUSY
    assert await _kind_of(fake.restart_excluding(_request(99, ()))) is FailureKind.JOB_NOT_FOUND


async def test_a_job_on_an_unresponsive_node_is_left_to_slurm_until_the_node_is_down(fake: FakeScheduler) -> None:
    job = fake.submit(["n1", "n2"])
    fake.nodes["n2"] = fake.nodes["n2"].model_copy(update={"flags": ("NOT_RESPONDING",)})
    assert await _kind_of(fake.restart_excluding(_request(job.job_id, ("n2",)))) is FailureKind.SCHEDULER_BUSY
    assert fake.slurm_calls == []
    fake.node_down("n2")  # Slurm declares it DOWN and requeues the job itself
    result = await fake.restart_excluding(_request(job.job_id, ("n2",)))
    assert result.state is JobState.PENDING and fake.jobs[job.job_id].excluded_nodes == ("n2",)


async def test_a_job_that_may_not_be_requeued_is_refused(fake: FakeScheduler) -> None:
    job = fake.submit(["n1"], requeue=False)
    assert await _kind_of(fake.restart_excluding(_request(job.job_id, ("n1",)))) is FailureKind.SCHEDULER_REJECTED


async def test_the_composite_scheduler_restarts_through_its_actions_side() -> None:
    reads, actions = FakeScheduler(), FakeScheduler()
    job = actions.submit(2)
    reads.submit(2)
    request = _request(job.job_id, ("n2",))
    await CompositeScheduler(reads=reads, actions=actions).restart_excluding(request)
    assert reads.calls == []
    assert actions.calls[0] == Call("restart_excluding", (request,))


def _excluding(job_id: int, exclude: tuple[str, ...], user: tuple[str, ...], expected: int = 0) -> RestartRequest:
    return RestartRequest(job_id=job_id, exclude=exclude, user_excluded=user, expected_restart_count=expected)


async def test_the_restart_sets_exactly_the_owners_exclusion_plus_the_standing_one(fake: FakeScheduler) -> None:
    job = fake.submit(["n1", "n2"])
    # The owner excluded n4; an earlier restart excluded n3, which Rebound no longer stands by.
    fake.jobs[job.job_id] = fake.jobs[job.job_id].model_copy(update={"excluded_nodes": ("n3", "n4")})
    await fake.restart_excluding(_excluding(job.job_id, ("n2",), user=("n4",)))
    assert fake.jobs[job.job_id].excluded_nodes == ("n2", "n4")
    assert [c.method for c in fake.slurm_calls] == ["requeuehold", "excnodelist", "release"]


async def test_the_owners_exclusion_is_never_dropped(fake: FakeScheduler) -> None:
    job = fake.submit(["n1"])
    fake.jobs[job.job_id] = fake.jobs[job.job_id].model_copy(update={"excluded_nodes": ("n3", "n4")})
    await fake.restart_excluding(_excluding(job.job_id, (), user=("n4",)))
    assert fake.jobs[job.job_id].excluded_nodes == ("n4",)


async def test_an_exact_exclusion_is_not_set_again(fake: FakeScheduler) -> None:
    job = fake.submit(["n1", "n2"])
    request = _excluding(job.job_id, ("n2",), user=("n4",))
    await fake.restart_excluding(request)
    fake.slurm_calls.clear()
    again = await fake.restart_excluding(request)  # a retried activity: pending, already excluding exactly that
    assert again.state is JobState.PENDING
    assert [c.method for c in fake.slurm_calls] == []


async def test_without_a_recorded_owners_exclusion_nothing_is_dropped(fake: FakeScheduler) -> None:
    job = fake.submit(["n1", "n2"])
    fake.jobs[job.job_id] = fake.jobs[job.job_id].model_copy(update={"excluded_nodes": ("n3",)})
    await fake.restart_excluding(_request(job.job_id, ("n2",)))
    assert fake.jobs[job.job_id].excluded_nodes == ("n2", "n3")


async def test_the_activity_verifies_the_exact_exclusion(fake: FakeScheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    job = fake.submit(["n1", "n2"])
    fake.jobs[job.job_id] = fake.jobs[job.job_id].model_copy(update={"excluded_nodes": ("n3", "n4")})
    activities = SlurmActionActivities(fake)
    inp = RequeueInput(
        job_id=job.job_id, exclude=("n2",), user_excluded=("n4",), expected_restart_count=0, previous_nodes=(), key="k"
    )
    done = await ActivityEnvironment().run(activities.requeue_job, inp)
    assert (done.state, done.excluded_nodes) == (JobState.PENDING, ("n2", "n4"))
    # A stale exclusion still showing (the change not visible yet) is not taken as done.
    fake.jobs[job.job_id] = fake.jobs[job.job_id].model_copy(update={"excluded_nodes": ("n2", "n3", "n4")})

    async def lost(job_id: int, nodes: Sequence[str]) -> None:  # Slurm accepted, the next read is older
        del job_id, nodes

    monkeypatch.setattr(fake, "set_excluded_nodes", lost)
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(activities.requeue_job, inp)
    assert caught.value.type == FailureKind.SCHEDULER_BUSY.value and "not visible yet" in caught.value.message
