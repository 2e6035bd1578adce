"""The shared scheduler feed (ADR 015, "One scheduler poll per cluster") on a real dev server: the real
SchedulerFeed and ShardFeed workflows, the real feed activity and shard hubs, over the FakeScheduler.

Each "process" has its own SnapshotCache over its own counting view of the one FakeScheduler, so the tests see who
ran ``squeue`` (``snapshot()``) and who asked for one job (``get_job``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.logs.job_logs import LogPolicy
from activities.slurm.scheduler_feed import SchedulerFeedActivities
from activities.slurm.snapshots import SnapshotCache
from activities.temporal import rebound_workflows
from tests.fakes.scheduler import FakeScheduler
from tests.workflows.hub_support import SHARDS, HubHarness, eventually
from tests.workflows.test_job_recovery import Harness, _actions, until
from workers.watch_hub import build_scheduler_feed, build_watch_shards
from workflows.constants import shard_feed_workflow_id
from workflows.domain.incident import ActionKind
from workflows.domain.recovery import RecoveryState
from workflows.domain.scheduler_feed import SchedulerFeedInput
from workflows.domain.slurm import ClusterSnapshot, JobState, SlurmJob
from workflows.domain.watch_routing import shard_of
from workflows.scheduler_feed import SchedulerFeedWorkflow, ShardFeedWorkflow
from workflows.watch_shard import WatchShardWorkflow


class CountingReads:
    """One process's way to the scheduler: counts its ``squeue`` runs (snapshots) and one-job reads."""

    def __init__(self, sched: FakeScheduler) -> None:
        self.sched = sched
        self.snapshots = 0
        self.job_reads = 0

    async def snapshot(self) -> ClusterSnapshot:
        self.snapshots += 1
        return await self.sched.snapshot()

    async def get_job(self, job_id: int) -> SlurmJob | None:
        self.job_reads += 1
        return await self.sched.get_job(job_id)


class Process:
    """One worker process's watch side: its client, its cache and counters, its shard hubs and feed activity."""

    def __init__(
        self, client: Client, sched: FakeScheduler, task_queue: str, *, shards: bool = True, feed: bool = True
    ) -> None:
        self.serves = (shards, feed)
        self.reads = CountingReads(sched)
        cache = SnapshotCache(self.reads, max_age_s=0.05)  # type: ignore[arg-type]
        self.shards = build_watch_shards(client, cache, LogPolicy(), shared_feed=self.reads)  # type: ignore[arg-type]
        self.feed: SchedulerFeedActivities = build_scheduler_feed(client, cache, task_queue=task_queue)
        self.client = client

    def watch_worker(self, queue: str) -> Worker:
        shards, feed = self.serves
        activities: list[Callable[..., Any]] = []
        if shards:
            activities.append(self.shards.watch_shard)
        if feed:
            activities.append(self.feed.scheduler_feed)
        return Worker(self.client, task_queue=queue, activities=activities)


class FeedHarness(HubHarness):
    """The hub harness with the shared feed: every process's hubs read the feed's views."""

    def __init__(self, client: Client, task_queue: str, tmp: Path) -> None:
        super().__init__(client, task_queue, tmp, lease_s=600)
        self.heartbeat_timeout_s = 5.0
        self.first = Process(client, self.sched, task_queue)
        self.shards = self.first.shards  # what HubHarness.members looks at
        self.watchers: dict[int, Worker] = {}
        self.feed_input = SchedulerFeedInput(
            cluster=self.cluster,
            shards=SHARDS,
            watch_task_queue=self.watch_queue,
            shard_queue_prefix=self.routing.shard_queue_prefix,
            poll_interval_s=0.1,
            digest_interval_s=60,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
        )

    def worker(self, **options: Any) -> Worker:
        workflows = [SchedulerFeedWorkflow, ShardFeedWorkflow, WatchShardWorkflow]
        return Harness.worker(self, workflows=workflows, max_concurrent_activities=self.acting_slots, **options)

    @contextlib.asynccontextmanager
    async def with_feed(self, *procs: Process) -> AsyncIterator[FeedHarness]:
        """The hub harness's workers and shards (``serving``), each process's watch worker (its shards and the feed),
        and the feed."""
        for p in procs:
            queue = self.watch_queue if p.serves[0] else self.feed_input.watch_task_queue
            self.watchers[id(p)] = p.watch_worker(queue)
        try:
            async with self.serving(*(self.watchers[id(p)] for p in procs)) as started:
                feed = rebound_workflows.start_scheduler_feed(self.client, self.feed_input, task_queue=self.task_queue)
                started.append(await feed)
                yield self
        finally:
            for k in range(SHARDS):
                with contextlib.suppress(Exception):
                    await self.client.get_workflow_handle(shard_feed_workflow_id(self.cluster, k)).terminate("over")

    async def kill(self, proc: Process) -> None:
        """The process's watch side stops: its shards and the feed, if it ran it, are retried elsewhere."""
        await self.watchers[id(proc)].shutdown()


async def test_a_jobs_state_change_reaches_its_hub_through_the_feed_and_recovery_proceeds(
    temporal_client: Client, task_queue: str, tmp_path: Path
) -> None:
    fh = FeedHarness(temporal_client, task_queue, tmp_path)
    async with fh.with_feed(fh.first):
        job = fh.sched.submit(fh.nodes[:2], name="llm")
        handle = await fh.start(job.job_id)
        await until(handle, lambda s: s.state is RecoveryState.WATCHING)
        await eventually(lambda: fh.members(job.job_id) == 1)
        hub = fh.first.shards.hubs[shard_of(job.job_id, SHARDS)]
        await eventually(lambda: hub.view.ready)  # the feed's first digest reached the hub
        applied, polls = hub.view.applied, fh.first.reads.snapshots
        # No log line at all: only the scheduler says the job failed, and only the feed tells the hub.
        fh.sched.fail_job(job.job_id, exit_code=13)
        failed_at = asyncio.get_running_loop().time()
        await eventually(lambda: hub.view.jobs[job.job_id].state is JobState.FAILED)
        seen_s = asyncio.get_running_loop().time() - failed_at
        print(f"the failed state reached the hub's view {seen_s:.2f} s after the scheduler said it (poll 0.1 s)")
        st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING, timeout=30)
        assert _actions(st, ActionKind.REQUEUE) == [str(job.job_id)]
        assert len(st.incidents) == 1
        assert hub.view.applied > applied  # the change came as a delta
        assert fh.first.reads.job_reads >= 1  # ... and was confirmed with the scheduler for that one job
        assert fh.first.reads.snapshots > polls  # the feed went on polling
        await handle.terminate("test over")


async def test_two_workers_poll_the_scheduler_once_and_the_feed_moves_when_its_worker_dies(
    temporal_client: Client, task_queue: str, tmp_path: Path
) -> None:
    fh = FeedHarness(temporal_client, task_queue, tmp_path)
    second_client = await Client.connect(
        temporal_client.service_client.config.target_host, data_converter=pydantic_data_converter
    )
    second = Process(second_client, fh.sched, task_queue)
    procs = (fh.first, second)
    async with fh.with_feed(*procs):
        jobs = [fh.sched.submit(fh.nodes[:1]) for _ in range(2 * SHARDS)]  # every shard has members
        handles = [await fh.start(j.job_id) for j in jobs]
        for h in handles:
            await until(h, lambda s: s.state is RecoveryState.WATCHING)
        await eventually(lambda: any(p.feed.running for p in procs))
        owner = next(p for p in procs if p.feed.running)
        other = second if owner is fh.first else fh.first

        def all_views_ready(ps: tuple[Process, ...]) -> bool:
            hubs = [h for p in ps for h in p.shards.hubs.values()]
            return len(hubs) == SHARDS and all(h.view.ready and h.members for h in hubs)

        await eventually(lambda: all_views_ready(procs), timeout=30)
        # Steady state: only the feed's process runs squeue; every hub, in both processes, reads its view.
        before = (owner.reads.snapshots, other.reads.snapshots)
        await asyncio.sleep(2)
        ran = owner.reads.snapshots - before[0]
        assert ran >= 5  # ~every 0.1 s
        assert other.reads.snapshots == before[1]
        print(f"in 2 s with 2 processes: the feed's process ran squeue {ran} times, the other 0")

        # The feed's process dies: the feed (and its shards) move to the other process within the heartbeat timeout.
        # (First its shards' members reach their heartbeat details, as in the hub's own takeover test.)
        await eventually(lambda: not any(h.changed for p in procs for h in p.shards.hubs.values()))
        await asyncio.sleep(5)
        await fh.kill(owner)
        killed_at = asyncio.get_running_loop().time()
        await eventually(lambda: other.feed.running, timeout=30)
        moved_s = asyncio.get_running_loop().time() - killed_at
        await eventually(lambda: all_views_ready((other,)), timeout=30)
        ready_s = asyncio.get_running_loop().time() - killed_at
        print(f"the feed moved in {moved_s:.1f} s, the moved shards' views were ready after {ready_s:.1f} s")
        victim = jobs[0]
        fh.sched.fail_job(victim.job_id, exit_code=1)
        st = await until(handles[0], lambda s: s.state is RecoveryState.VERIFYING, timeout=30)
        assert len(st.incidents) == 1 and _actions(st, ActionKind.REQUEUE) == [str(victim.job_id)]
        before_other = other.reads.snapshots
        await asyncio.sleep(1)
        assert other.reads.snapshots > before_other  # the survivor polls now
        for h in handles:
            with contextlib.suppress(Exception):
                await h.terminate("test over")


async def test_a_shard_taken_over_while_the_feed_stays_gets_its_view_from_its_mailbox_at_once(
    temporal_client: Client, task_queue: str, tmp_path: Path
) -> None:
    """The feed's process lives; the process running the shards dies and another takes them: their hubs start with
    empty views and ask their mailboxes for the last digest and the changes since (not the feed's next digest,
    60 s away here)."""
    fh = FeedHarness(temporal_client, task_queue, tmp_path)

    async def process() -> Process:
        client = await Client.connect(
            temporal_client.service_client.config.target_host, data_converter=pydantic_data_converter
        )
        return Process(client, fh.sched, task_queue, feed=False)

    fh.first.serves = (False, True)  # the feed only, on a queue of its own (a worker on a queue serves it all)
    fh.feed_input = fh.feed_input.model_copy(update={"watch_task_queue": f"{fh.watch_queue}-feed"})
    b1, b2 = await process(), await process()
    async with fh.with_feed(fh.first, b1):
        jobs = [fh.sched.submit(fh.nodes[:1]) for _ in range(2 * SHARDS)]
        handles = [await fh.start(j.job_id) for j in jobs]
        for h in handles:
            await until(h, lambda s: s.state is RecoveryState.WATCHING)
        await eventually(lambda: len(b1.shards.hubs) == SHARDS and all(h.view.ready for h in b1.shards.hubs.values()))
        fh.sched.fail_job(jobs[1].job_id, exit_code=1)  # a delta after the digest: the replay must carry it too
        await until(handles[1], lambda s: s.state is RecoveryState.VERIFYING, timeout=30)
        await eventually(lambda: not any(h.changed for h in b1.shards.hubs.values()))
        await asyncio.sleep(5)  # the members reach the shards' heartbeat details
        await fh.kill(b1)
        async with b2.watch_worker(fh.watch_queue):
            await eventually(lambda: len(b2.shards.hubs) == SHARDS, timeout=30)
            started = asyncio.get_running_loop().time()
            await eventually(lambda: all(h.view.ready for h in b2.shards.hubs.values()), timeout=15)
            print(f"taken-over views ready {asyncio.get_running_loop().time() - started:.2f} s after the hubs started")
            view = b2.shards.hubs[shard_of(jobs[1].job_id, SHARDS)].view
            # The changes since the digest (failed, then requeued by its recovery) were replayed too.
            assert view.jobs[jobs[1].job_id] == fh.sched.jobs[jobs[1].job_id]
            assert view.jobs[jobs[1].job_id].state is not JobState.RUNNING
            polls = b2.reads.snapshots
            await asyncio.sleep(1)
            assert b2.reads.snapshots == polls  # b2 reads views, not the scheduler
            fh.sched.fail_job(jobs[0].job_id, exit_code=1)
            st = await until(handles[0], lambda s: s.state is RecoveryState.VERIFYING, timeout=30)
            assert len(st.incidents) == 1
        for h in handles:
            with contextlib.suppress(Exception):
                await h.terminate("test over")
