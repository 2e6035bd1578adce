"""Which watch shard watches a job and how a JobRecovery reaches it (ADR 015); the hub's payloads are in
``workflows.domain.watch_hub``."""

from __future__ import annotations

from pydantic import Field

from workflows.domain.base import Frozen

__all__ = ["DEFAULT_SHARDS", "MAX_SHARDS", "WatchRouting", "shard_of", "shard_task_queue"]

#: Shards per cluster by default: 10,000 jobs are ~313 per shard (heartbeat details ~1 MB, ADR 015), and the
#: fixed cost (one heartbeat per shard every ~10 s) stays under 10 actions per job-hour from ~1,200 jobs.
DEFAULT_SHARDS = 32
#: More shards than this buys nothing: each costs a workflow, an activity slot and a task queue poller.
MAX_SHARDS = 1024


def shard_of(job_id: int, shards: int) -> int:
    """The watch shard of ``job_id``: ``job_id % shards`` (job ids are dense, so shards fill evenly)."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    return job_id % shards


def shard_task_queue(prefix: str, shard: int) -> str:
    """The task queue a shard's hub serves subscriptions on (``rebound-watch-shard-7``)."""
    return f"{prefix}{shard}"


class WatchRouting(Frozen):
    """How a JobRecovery reaches the watch hub; in its input, from the worker's ``watch`` settings.

    None in the input (histories and runs started before the hub, and tests of the per-job watch): the job keeps
    the per-job ``job_watch`` activity.
    """

    shards: int = Field(DEFAULT_SHARDS, ge=1, le=MAX_SHARDS)
    shard_queue_prefix: str = Field("rebound-watch-shard-", min_length=1)
    lease_s: float = Field(3600.0, ge=10, le=7 * 24 * 3600)
    """A subscription is renewed this often (a safety net should a shard lose it); the hub forgets a member not
    renewed for twice this long (its workflow is gone)."""
    resume_task_queue: str = ""
    """Where ``job_wait_resume`` runs (its own slots, never the acting queue's); empty: the workflow's queue."""
