"""The shared scheduler feed's payloads (ADR 015, "One scheduler poll per cluster").

One worker polls the scheduler for the whole cluster (the ``scheduler_feed`` activity of the singleton
``SchedulerFeed`` workflow) and publishes to each watch shard only that shard's part: the jobs that changed, came or
went, and the nodes those jobs run on that changed (a *delta*), or, at the start of a feed attempt and every
``digest_interval_s``, all the shard's jobs and their nodes (a *digest*). Never the whole listing: a shard's part
is ~1/S of it, and a digest larger than ``MAX_UPDATE_ITEMS`` travels in parts.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from workflows.domain.base import Frozen
from workflows.domain.slurm import SlurmJob, SlurmNode
from workflows.domain.watch_routing import MAX_SHARDS

__all__ = ["MAX_UPDATE_ITEMS", "FeedUpdate", "SchedulerFeedInput", "ShardFeedInput"]

#: Jobs plus nodes in one update (~1-2 KB each as JSON): a payload stays well under Temporal's 2 MB. A larger
#: digest is split into parts; a shard feed's batch of updates stays under it too.
MAX_UPDATE_ITEMS = 600


class FeedUpdate(Frozen):
    """One watch shard's part of one scheduler poll.

    ``epoch`` names the feed attempt that published it and ``seq`` counts that attempt's updates to this shard
    (1, 2, ...): the shard's view applies a delta only right after the one before it, and any digest; a gap (an
    update lost with a dead feed, or given up undelivered) leaves the view stale until the next digest, and
    meanwhile the hub reads the scheduler itself.
    """

    shard: int = Field(ge=0)
    epoch: str = Field(min_length=1)
    seq: int = Field(ge=1)
    observed_at: datetime
    digest: bool = False
    """All the shard's jobs and their nodes (replaces the view), else changes only."""
    part: int = Field(0, ge=0)
    parts: int = Field(1, ge=1)
    """A digest over ``MAX_UPDATE_ITEMS`` comes in ``parts`` consecutive updates; the view applies it whole."""
    jobs: tuple[SlurmJob, ...] = ()
    """Delta: the shard's jobs that are new or changed. Digest: all the shard's jobs."""
    removed: tuple[int, ...] = ()
    """Delta: the shard's jobs the scheduler no longer lists."""
    nodes: tuple[SlurmNode, ...] = ()
    """Delta: changed nodes that the shard's jobs run on. Digest: all of them."""

    @property
    def items(self) -> int:
        return len(self.jobs) + len(self.nodes) + len(self.removed)


class SchedulerFeedInput(Frozen):
    """The cluster's one scheduler feed: poll, diff, publish per shard."""

    cluster: str
    shards: int = Field(ge=1, le=MAX_SHARDS)
    watch_task_queue: str = Field(min_length=1)
    """Where the ``scheduler_feed`` activity runs (the shards' queue: any worker running shards can take it)."""
    shard_queue_prefix: str = Field(min_length=1)
    poll_interval_s: float = Field(1.0, gt=0, le=300)
    digest_interval_s: float = Field(300.0, ge=5, le=86_400)
    heartbeat_timeout_s: float = Field(30.0, ge=5, le=600)


class ShardFeedInput(Frozen):
    """One shard's feed mailbox: hands the feed's updates to whichever process runs the shard's hub now."""

    cluster: str
    shard: int = Field(ge=0)
    shard_queue: str = Field(min_length=1)
    deliver_within_s: float = Field(300.0, ge=5)
    """An update not taken by the hub within this long is given up (the shard is moving, or gone): the view sees
    the gap and reads the scheduler itself until the next digest."""
