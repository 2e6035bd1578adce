"""The shard hub with the shared scheduler feed: it reads its view, confirms what the view says changed with the
scheduler (one job) before reporting it, and reads the scheduler itself while its view is not ready."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from activities.logs.job_logs import LogPolicy
from activities.logs.watch_hub import ShardHub
from activities.logs.watch_shard import WatchShardActivities
from activities.slurm.snapshots import SnapshotCache
from tests.fakes.scheduler import FakeScheduler
from workflows.domain.loop import JobWatchInput, WatchOutcome
from workflows.domain.scheduler_feed import FeedUpdate
from workflows.domain.slurm import JobState
from workflows.domain.watch_hub import WatchEvent, WatchSubscription


@contextlib.asynccontextmanager
async def _no_queue(task_queue: str, activities: Sequence[Callable[..., Any]]) -> AsyncIterator[None]:
    yield


async def _no_delivery(workflow_id: str, event: WatchEvent) -> None:
    return None


def _setup(tmp: Path) -> tuple[FakeScheduler, SnapshotCache, WatchShardActivities, ShardHub, int]:
    sched = FakeScheduler()
    cache = SnapshotCache(sched, max_age_s=0)
    acts = WatchShardActivities(cache, LogPolicy(), _no_delivery, _no_queue, shared_feed=sched)
    hub = ShardHub(0, LogPolicy(), lease_s=3600)
    job = sched.submit(1)
    inp = JobWatchInput(job_id=job.job_id, log_patterns=(str(tmp / "none-%j"),), last_state=JobState.RUNNING)
    hub.subscribe(WatchSubscription(watch=inp, workflow_id="wf", seq=1))
    return sched, cache, acts, hub, job.job_id


def _digest(sched: FakeScheduler, seq: int = 1, **changes: object) -> FeedUpdate:
    jobs = tuple(j.model_copy(update=changes) for j in sched.jobs.values())
    return FeedUpdate(
        shard=0, epoch="e", seq=seq, observed_at=datetime.now(UTC), digest=True, jobs=jobs,
        nodes=tuple(sched.nodes.values()),
    )  # fmt: skip


async def test_a_view_that_says_failed_is_not_believed_while_the_scheduler_says_running(tmp_path: Path) -> None:
    sched, cache, acts, hub, job_id = _setup(tmp_path)
    hub.view.apply([_digest(sched, state=JobState.FAILED)])  # a wrong (or lagging) word from the feed
    await acts.poll_once(hub)
    assert hub.members["wf"].pending is None  # confirmed with get_job: still running, no event
    assert cache.fetches == 0  # and no listing: the view served the poll
    sched.fail_job(job_id, exit_code=1)
    await acts.poll_once(hub)
    pending = hub.members["wf"].pending
    assert pending is not None and pending.result.outcome is WatchOutcome.ANOMALY
    assert cache.fetches == 0


async def test_a_quiet_view_costs_no_scheduler_call_and_a_view_not_ready_reads_the_scheduler(tmp_path: Path) -> None:
    sched, cache, acts, hub, _ = _setup(tmp_path)
    await acts.poll_once(hub)
    assert cache.fetches == 1  # no digest yet: the hub reads the scheduler itself
    hub.view.apply([_digest(sched)])
    before = len(sched.calls)
    for _ in range(3):
        await acts.poll_once(hub)
    assert cache.fetches == 1 and len(sched.calls) == before  # the view says nothing changed: nothing asked
