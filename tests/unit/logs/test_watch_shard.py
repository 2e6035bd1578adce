"""The shard activity's delivery of events: a delivered event (or one whose workflow is gone) drops its member,
a failed signal keeps it for the next poll."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from temporalio.service import RPCError, RPCStatusCode

from activities.logs.job_logs import LogPolicy
from activities.logs.watch_hub import ShardHub
from activities.logs.watch_shard import WatchShardActivities
from activities.slurm.snapshots import SnapshotCache
from tests.fakes.scheduler import FakeScheduler
from workflows.domain.loop import JobWatchInput, WatchOutcome
from workflows.domain.slurm import JobState
from workflows.domain.watch_hub import WatchEvent, WatchSubscription


@contextlib.asynccontextmanager
async def _no_queue(task_queue: str, activities: Sequence[Callable[..., Any]]) -> AsyncIterator[None]:
    yield


class _Deliveries:
    def __init__(self) -> None:
        self.sent: list[tuple[str, WatchEvent]] = []
        self.fail_with: BaseException | None = None

    async def __call__(self, workflow_id: str, event: WatchEvent) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.sent.append((workflow_id, event))


async def _hub_with_a_failed_job(tmp: Path) -> tuple[WatchShardActivities, ShardHub, _Deliveries]:
    sched = FakeScheduler()
    deliveries = _Deliveries()
    acts = WatchShardActivities(SnapshotCache(sched, max_age_s=0), LogPolicy(), deliveries, _no_queue)
    hub = ShardHub(0, LogPolicy(), lease_s=3600)
    for _ in range(2):
        job = sched.submit(1)
        inp = JobWatchInput(job_id=job.job_id, log_patterns=(str(tmp / "none-%j"),), last_state=JobState.RUNNING)
        hub.subscribe(WatchSubscription(watch=inp, workflow_id=f"wf-{job.job_id}", seq=1))
    sched.fail_job(1, exit_code=1)
    await acts.poll_once(hub)
    return acts, hub, deliveries


async def test_a_delivered_event_drops_its_member_and_others_stay(tmp_path: Path) -> None:
    acts, hub, deliveries = await _hub_with_a_failed_job(tmp_path)
    await acts.deliver_pending(hub)
    [(workflow_id, event)] = deliveries.sent
    assert workflow_id == "wf-1" and event.seq == 1 and event.result.outcome is WatchOutcome.ANOMALY
    assert list(hub.members) == ["wf-2"]
    await acts.deliver_pending(hub)
    assert len(deliveries.sent) == 1  # once


async def test_a_failed_signal_is_tried_again_and_a_gone_workflow_drops_the_member(tmp_path: Path) -> None:
    acts, hub, deliveries = await _hub_with_a_failed_job(tmp_path)
    deliveries.fail_with = RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")
    await acts.deliver_pending(hub)
    assert "wf-1" in hub.members and hub.members["wf-1"].pending is not None
    deliveries.fail_with = RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")
    await acts.deliver_pending(hub)
    assert list(hub.members) == ["wf-2"]
