"""The ``scheduler_feed`` activity (ADR 015, "One scheduler poll per cluster"): the cluster's one scheduler poll.

Run by whichever worker holds the ``SchedulerFeed`` workflow's activity now (the watch queue: heartbeating, retried
without end, so Temporal moves it when that worker dies, exactly like a watch shard). Every ``poll_interval_s`` it
takes the worker's shared snapshot, diffs it against the previous one (``workflows.policy.scheduler_feed``) and
signals each watch shard's ``ShardFeed`` mailbox only that shard's changes; at the start of each attempt and every
``digest_interval_s``, each shard's digest. A shard whose publish failed gets a digest at the next poll. A
scheduler outage publishes nothing: the views keep the last word, and the hubs' own fresh reads (a job's state
change is confirmed with the scheduler before it is reported) fail as they would without a feed.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime

from temporalio import activity

from activities.slurm.snapshots import SnapshotCache
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.scheduler_feed import FeedUpdate, SchedulerFeedInput
from workflows.domain.slurm import ClusterSnapshot
from workflows.policy.scheduler_feed import ShardPart, diff, digest, route, updates

__all__ = ["FeedState", "Publish", "SchedulerFeedActivities"]

log = logging.getLogger("rebound.scheduler_feed")

#: Signal one shard's mailbox one update (``rebound_workflows.publish_feed_update``).
Publish = Callable[[SchedulerFeedInput, FeedUpdate], Awaitable[None]]
#: One publish's limit: a hung server must not stall the feed's polls.
PUBLISH_TIMEOUT_S = 10.0


class SchedulerFeedActivities:
    """The feed activity over the worker's shared snapshot cache."""

    def __init__(self, snapshots: SnapshotCache, publish: Publish) -> None:
        self._snapshots = snapshots
        self._publish = publish
        self.published = 0
        """Updates signalled by this process (tests, the bench)."""
        self.running = False
        """This process runs the cluster's feed now."""

    @activity.defn(name="scheduler_feed")
    async def scheduler_feed(self, inp: SchedulerFeedInput) -> None:
        """Poll, diff, publish until cancelled or this worker dies (see the module docstring)."""
        feed = FeedState(inp, epoch=uuid.uuid4().hex[:12])
        log.info("scheduler feed: running (attempt %s, epoch %s)", activity.info().attempt, feed.epoch)
        self.running = True
        try:
            while True:
                began = time.monotonic()
                try:
                    snap = await self._snapshots.get()
                except ReboundError as e:
                    # Refused credentials are an operator's to fix (ClusterWatch notifies): an error, not a blip.
                    level = logging.ERROR if e.kind is FailureKind.SCHEDULER_AUTH else logging.WARNING
                    log.log(level, "scheduler feed: no snapshot this poll: %s: %s", e.kind.value, e.message)
                else:
                    feed.failed = await self._publish_all(inp, feed.next(snap, time.monotonic()))
                activity.heartbeat({"epoch": feed.epoch, "polls": feed.polls, "published": self.published})
                await asyncio.sleep(max(0.0, inp.poll_interval_s - (time.monotonic() - began)))
        finally:
            self.running = False

    async def _publish_all(self, inp: SchedulerFeedInput, batches: dict[int, list[FeedUpdate]]) -> set[int]:
        """Publish each shard's updates; the shards not reached (they get a digest next poll)."""
        failed: set[int] = set()
        shards = list(batches)
        outcomes = await asyncio.gather(*(self._publish_shard(inp, batches[k]) for k in shards), return_exceptions=True)
        for shard, outcome in zip(shards, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("scheduler feed: shard %s not reached, a digest follows: %s", shard, outcome)
                failed.add(shard)
        return failed

    async def _publish_shard(self, inp: SchedulerFeedInput, batch: list[FeedUpdate]) -> None:
        for update in batch:  # in order: the view applies a delta only after its predecessor
            await asyncio.wait_for(self._publish(inp, update), timeout=PUBLISH_TIMEOUT_S)
            self.published += 1


class FeedState:
    """One attempt's state: the previous snapshot, each shard's next ``seq``, when the last digest went."""

    def __init__(self, inp: SchedulerFeedInput, epoch: str) -> None:
        self.inp = inp
        self.epoch = epoch
        self.polls = 0
        self._prev: ClusterSnapshot | None = None
        self._seq = dict.fromkeys(range(inp.shards), 1)
        self._digest_at = -float("inf")
        self.failed: set[int] = set()

    def next(self, snap: ClusterSnapshot, now: float) -> dict[int, list[FeedUpdate]]:
        """Each shard's updates for ``snap``: every shard's digest when one is due, else the changes (and a digest
        for a shard whose last publish failed)."""
        self.polls += 1
        if now - self._digest_at >= self.inp.digest_interval_s:
            parts, digests = digest(snap, self.inp.shards), set(range(self.inp.shards))
            self._digest_at = now
        else:
            parts = route(diff(self._prev, snap), self._prev, snap, self.inp.shards)
            digests = set(self.failed)
            if digests:
                whole = digest(snap, self.inp.shards)
                parts.update({k: whole[k] for k in digests})
        self.failed = set()
        self._prev = snap
        out: dict[int, list[FeedUpdate]] = {}
        for k, part in sorted(parts.items()):
            out[k] = self._number(k, part, snap.observed_at, k in digests)
        return out

    def _number(self, shard: int, part: ShardPart, observed_at: datetime, is_digest: bool) -> list[FeedUpdate]:
        batch = updates(
            shard, part, epoch=self.epoch, first_seq=self._seq[shard], observed_at=observed_at, is_digest=is_digest
        )
        self._seq[shard] += len(batch)
        return batch
