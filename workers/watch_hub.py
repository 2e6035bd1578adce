"""The worker's watch hub (ADR 015): the shard activities' queue, the resume checks' queue, the in-process worker a
shard's hub serves subscriptions on, the start of every shard's WatchShard workflow, and, with
``watch.scheduler_feed = shared``, the cluster's one scheduler feed.

Each queue has its own explicit slots, so the central queue's acting activities (attribute, drain, requeue,
notify, the Fleet's) never wait behind watching or resume checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.logs.job_logs import LogPolicy
from activities.logs.watch import WatchActivities
from activities.logs.watch_shard import ServeQueue, WatchShardActivities
from activities.slurm.port import SchedulerReads
from activities.slurm.scheduler_feed import SchedulerFeedActivities
from activities.slurm.snapshots import SnapshotCache
from activities.temporal import rebound_workflows
from workers.settings import Settings
from workflows.domain.scheduler_feed import FeedUpdate, SchedulerFeedInput, ShardFeedInput
from workflows.domain.watch_hub import WatchEvent, WatchShardInput
from workflows.domain.watch_routing import shard_task_queue

log = logging.getLogger("rebound.worker")

#: Subscriptions a shard's hub serves at once: each is a dictionary update, done in microseconds.
SHARD_QUEUE_SLOTS = 16


def shard_queue_server(client: Client) -> ServeQueue:
    """Serve a shard's subscription queue from this process while its hub runs (one poller: the queue is quiet)."""

    @contextlib.asynccontextmanager
    async def serve(task_queue: str, activities: Sequence[Callable[..., Any]]) -> AsyncIterator[None]:
        worker = Worker(
            client,
            task_queue=task_queue,
            activities=list(activities),
            max_concurrent_activities=SHARD_QUEUE_SLOTS,
            max_concurrent_activity_task_polls=1,
            graceful_shutdown_timeout=timedelta(seconds=2),
        )
        async with worker:
            yield

    return serve


def build_watch_shards(
    client: Client,
    snapshots: SnapshotCache,
    logs: LogPolicy,
    *,
    shared_feed: SchedulerReads | None = None,
    full_poll_every_s: float = 0.0,
) -> WatchShardActivities:
    """The shard activity over the worker's one shared snapshot cache, signalling through the worker's client;
    with ``shared_feed`` (the scheduler, for one-job confirmations) its hubs read the shared feed's views;
    ``full_poll_every_s``: ``watch.full_poll_every_s``."""

    async def deliver(workflow_id: str, event: WatchEvent) -> None:
        await rebound_workflows.signal_watch_event(client, workflow_id, event)

    async def want_digest(cluster: str, shard: int) -> None:
        await rebound_workflows.request_feed_resend(client, cluster, shard)

    return WatchShardActivities(
        snapshots,
        logs,
        deliver,
        shard_queue_server(client),
        shared_feed=shared_feed,
        want_digest=want_digest,
        full_poll_every_s=full_poll_every_s,
    )


def build_scheduler_feed(client: Client, snapshots: SnapshotCache, *, task_queue: str) -> SchedulerFeedActivities:
    """The feed activity over the worker's shared snapshot cache, publishing to the shards' mailboxes, which run
    on ``task_queue`` (the workflows' queue)."""

    async def publish(inp: SchedulerFeedInput, update: FeedUpdate) -> None:
        mailbox = ShardFeedInput(
            cluster=inp.cluster,
            shard=update.shard,
            shard_queue=shard_task_queue(inp.shard_queue_prefix, update.shard),
            deliver_within_s=inp.digest_interval_s,
        )
        await rebound_workflows.publish_feed_update(client, mailbox, update, task_queue=task_queue)

    return SchedulerFeedActivities(snapshots, publish)


def watch_workers(
    client: Client,
    settings: Settings,
    shards: WatchShardActivities,
    watch: WatchActivities,
    feed: SchedulerFeedActivities | None = None,
) -> list[Worker]:
    """The watch queue's worker (shard activities, and the shared scheduler feed's) and the resume queue's
    (``job_wait_resume``), slots explicit."""
    if not settings.watch.hub:
        return []
    return [
        Worker(
            client,
            task_queue=settings.watch.watch_task_queue,
            activities=[shards.watch_shard, *([feed.scheduler_feed] if feed is not None else [])],
            max_concurrent_activities=settings.watch.effective_shard_slots,
            graceful_shutdown_timeout=timedelta(seconds=5),
        ),
        Worker(
            client,
            task_queue=settings.watch.resume_task_queue,
            activities=[watch.wait_resume],
            max_concurrent_activities=settings.watch.resume_slots,
            graceful_shutdown_timeout=timedelta(seconds=5),
        ),
    ]


async def start_watch_shards(client: Client, settings: Settings) -> None:
    """Start every shard's WatchShard workflow, or attach to the running ones (every worker calls this)."""
    if not settings.watch.hub:
        return
    watch = settings.watch
    inputs = [
        WatchShardInput(
            cluster=settings.cluster_name,
            shard=k,
            shards=watch.shards,
            watch_task_queue=watch.watch_task_queue,
            shard_queue_prefix=watch.shard_queue_prefix,
            poll_interval_s=watch.poll_interval_s,
            heartbeat_timeout_s=watch.shard_heartbeat_timeout_s,
            lease_s=watch.lease_s,
        )
        for k in range(watch.shards)
    ]
    await asyncio.gather(
        *(rebound_workflows.start_watch_shard(client, inp, task_queue=settings.temporal.task_queue) for inp in inputs)
    )
    log.info("%d watch shards running (activities on %s)", watch.shards, watch.watch_task_queue)
    if watch.scheduler_feed == "shared":
        feed = SchedulerFeedInput(
            cluster=settings.cluster_name,
            shards=watch.shards,
            watch_task_queue=watch.watch_task_queue,
            shard_queue_prefix=watch.shard_queue_prefix,
            poll_interval_s=watch.poll_interval_s,
            digest_interval_s=watch.feed_digest_s,
            heartbeat_timeout_s=watch.shard_heartbeat_timeout_s,
        )
        await rebound_workflows.start_scheduler_feed(client, feed, task_queue=settings.temporal.task_queue)
        log.info("shared scheduler feed running: one scheduler poll per interval for the cluster")
