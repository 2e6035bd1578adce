"""SnapshotCache: one scheduler read per interval for the whole worker, however many watchers ask."""

from __future__ import annotations

import asyncio

import pytest

from activities.slurm.snapshots import SnapshotCache
from tests.fakes.scheduler import FakeScheduler
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import ClusterSnapshot


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _SlowScheduler(FakeScheduler):
    """A scheduler whose snapshot takes a while, so callers really overlap."""

    async def snapshot(self) -> ClusterSnapshot:
        await asyncio.sleep(0.05)
        return await super().snapshot()


def _snapshot_calls(sched: FakeScheduler) -> int:
    return sum(c.method == "snapshot" for c in sched.calls)


async def test_concurrent_gets_share_one_fetch() -> None:
    sched = _SlowScheduler()
    cache = SnapshotCache(sched, max_age_s=10)
    snaps = await asyncio.gather(*(cache.get() for _ in range(200)))
    assert cache.fetches == 1
    assert _snapshot_calls(sched) == 1
    assert all(s is snaps[0] for s in snaps)


async def test_reused_while_young_refetched_when_old() -> None:
    sched, clock = FakeScheduler(), _Clock()
    cache = SnapshotCache(sched, max_age_s=1.0, clock=clock)
    first = await cache.get()
    clock.now += 0.9
    assert await cache.get() is first
    sched.submit(1)
    clock.now += 0.1  # exactly max_age: too old
    second = await cache.get()
    assert second is not first
    assert len(second.jobs) == 1
    assert cache.fetches == 2


async def test_age_counts_from_the_start_of_the_fetch() -> None:
    """A fetch that took long is as old as its ``observed_at``: it must not be reused for a full interval after."""
    clock = _Clock()

    class _Slow(FakeScheduler):
        async def snapshot(self) -> ClusterSnapshot:
            snap = await super().snapshot()
            clock.now += 0.8  # the scheduler took 0.8 s to answer
            return snap

    cache = SnapshotCache(_Slow(), max_age_s=1.0, clock=clock)
    await cache.get()
    clock.now += 0.3  # 1.1 s after the fetch started
    await cache.get()
    assert cache.fetches == 2


async def test_per_call_bound_can_only_tighten() -> None:
    clock = _Clock()
    cache = SnapshotCache(FakeScheduler(), max_age_s=1.0, clock=clock)
    first = await cache.get()
    clock.now += 0.5
    assert await cache.get(max_age_s=5) is first  # never looser than the cache's bound
    fresh = await cache.get(max_age_s=0)
    assert fresh is not first
    assert cache.fetches == 2


async def test_zero_max_age_fetches_every_time_but_one_at_a_time() -> None:
    in_flight = 0
    peak = 0

    class _Counting(FakeScheduler):
        async def snapshot(self) -> ClusterSnapshot:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1
            return await super().snapshot()

    cache = SnapshotCache(_Counting(), max_age_s=0)
    await asyncio.gather(*(cache.get() for _ in range(5)))
    assert cache.fetches == 5
    assert peak == 1


async def test_failure_is_shared_within_the_bound_then_retried() -> None:
    sched, clock = FakeScheduler(), _Clock()
    sched.fail_next("snapshot", FailureKind.SCHEDULER_UNREACHABLE)
    cache = SnapshotCache(sched, max_age_s=1.0, clock=clock)
    for _ in range(3):
        with pytest.raises(ReboundError) as err:
            await cache.get()
        assert err.value.kind is FailureKind.SCHEDULER_UNREACHABLE
    assert cache.fetches == 1  # an outage costs one call per interval, not one per watcher
    clock.now += 1.0
    assert isinstance(await cache.get(), ClusterSnapshot)
    assert cache.fetches == 2


async def test_cancelled_fetch_does_not_poison_the_cache() -> None:
    sched = _SlowScheduler()
    cache = SnapshotCache(sched, max_age_s=10)
    task = asyncio.create_task(cache.get())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert isinstance(await cache.get(), ClusterSnapshot)
    assert cache.fetches == 2


def test_negative_max_age_is_refused() -> None:
    with pytest.raises(ValueError, match="max_age_s"):
        SnapshotCache(FakeScheduler(), max_age_s=-1)


async def test_taken_after_never_answers_with_a_listing_begun_before_the_ask() -> None:
    """``taken_after`` is a fresh observation: a snapshot fetched before the ask is not reused, however young."""
    sched, clock = FakeScheduler(), _Clock()
    cache = SnapshotCache(sched, max_age_s=10.0, clock=clock)
    first = await cache.get()
    job = sched.submit(1, start=False)  # the job appears after that listing
    clock.now += 0.01
    fresh = await cache.taken_after(cache.now())
    assert fresh is not first and first.job(job.job_id) is None and fresh.job(job.job_id) is not None
    assert cache.fetches == 2


async def test_observations_asked_together_share_one_listing() -> None:
    """A thousand JobRecoveries starting at once cost one listing, not one each (squeue ignores -j on 22.05)."""
    from activities.slurm.activities import SlurmActivities
    from workflows.domain.recovery import ObserveJobInput

    sched = _SlowScheduler()
    cache = SnapshotCache(sched, max_age_s=10.0)
    await cache.get()  # an older listing: never the answer to an observation asked later
    ids = [sched.submit(1, start=False).job_id for _ in range(200)]
    slurm = SlurmActivities(sched, cache)
    seen = await asyncio.gather(*(slurm.observe_job(ObserveJobInput(job_id=j)) for j in ids))
    assert all(r.job is not None and r.job.job_id == j for j, r in zip(ids, seen, strict=True))
    assert _snapshot_calls(sched) <= 3
    assert not any(c.method == "get_job" for c in sched.calls)
