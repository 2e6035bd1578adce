"""A failed or partial lookup is never read as a state: the scheduler adapters and actions fail closed."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.slurm.actions import SlurmActionActivities
from activities.slurm.port import RestartRequest
from tests.fakes.scheduler import FakeScheduler
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.loop import DrainInput
from workflows.domain.slurm import JobState, SlurmNode


class _Unlisted(FakeScheduler):
    """A node listing that leaves some nodes out (a partial answer)."""

    def __init__(self, missing: Sequence[str]) -> None:
        super().__init__()
        self.missing = set(missing)

    async def list_nodes(self) -> tuple[SlurmNode, ...]:
        return tuple(n for n in await super().list_nodes() if n.name not in self.missing)


async def test_a_job_node_missing_from_the_listing_is_not_judged_alive() -> None:
    fake = _Unlisted(missing=["n2"])
    job = fake.submit(["n1", "n2"])
    request = RestartRequest(job_id=job.job_id, exclude=("n2",), previous_nodes=("n1", "n2"), expected_restart_count=0)
    with pytest.raises(ReboundError) as caught:
        await fake.restart_excluding(request)
    assert caught.value.kind is FailureKind.SCHEDULER_BUSY and "n2" in caught.value.message
    assert fake.slurm_calls == []  # nothing requeued on a guess
    assert fake.jobs[job.job_id].state is JobState.RUNNING
    fake.missing.clear()  # the next attempt sees every node: the restart goes ahead
    await fake.restart_excluding(request)
    assert [c.method for c in fake.slurm_calls] == ["requeuehold", "excnodelist", "release"]


class _VanishesAfterRefusal(FakeScheduler):
    """Someone else's drain refuses ours; the read that should say whose it is finds no node."""

    armed = False
    reads = 0

    async def get_node(self, name: str) -> SlurmNode | None:
        node = await super().get_node(name)
        if not self.armed:
            return node
        self.reads += 1
        return node if self.reads == 1 else None  # the drain's own read sees it; the check after does not


async def test_a_drain_refused_then_unreadable_is_not_reported_as_someone_elses() -> None:
    fake = _VanishesAfterRefusal()
    await fake.drain_node("n1", "maintenance by ops")
    fake.armed = True
    acts = SlurmActionActivities(fake)
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(acts.drain_node, DrainInput(node="n1", reason="rebound: xid 79", key="k"))
    assert caught.value.type == FailureKind.SCHEDULER_BUSY.value and not caught.value.non_retryable
    assert fake.nodes["n1"].reason == "maintenance by ops"  # the other owner's drain is untouched


async def test_a_drain_refused_by_another_owner_is_reported_as_theirs() -> None:
    fake = FakeScheduler()
    await fake.drain_node("n1", "maintenance by ops")
    result = await ActivityEnvironment().run(
        SlurmActionActivities(fake).drain_node, DrainInput(node="n1", reason="rebound: xid 79", key="k")
    )
    assert not result.drained_by_us and "maintenance by ops" in result.detail


@pytest.mark.parametrize("kind", [FailureKind.SCHEDULER_AUTH, FailureKind.SCHEDULER_UNREACHABLE])
async def test_a_refused_or_failed_read_is_an_error_not_an_empty_cluster(kind: FailureKind) -> None:
    fake = FakeScheduler()
    fake.submit(["n1"])
    for method in ("snapshot", "list_jobs", "list_nodes", "get_job", "get_node"):
        fake.fail_next(method, kind)
    for call in (fake.snapshot(), fake.list_jobs(), fake.list_nodes(), fake.get_job(1), fake.get_node("n1")):
        with pytest.raises(ReboundError) as caught:
            await call
        assert caught.value.kind is kind
