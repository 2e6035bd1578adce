"""The watch hub's payloads (ADR 015): which shard watches a job, a job's subscription, the event it gets back.

Jobs are split into ``shards`` watch shards by job id. One long-lived ``WatchShard`` workflow per shard keeps one
heartbeating ``watch_shard`` activity running on some worker; that process polls the shard's own task queue
(``watch_routing.shard_task_queue``), where JobRecovery subscribes its job and from where it later hears back by signal.
"""

from __future__ import annotations

from pydantic import Field

from workflows.domain.base import Frozen
from workflows.domain.loop import JobWatchInput, JobWatchResult
from workflows.domain.watch_routing import MAX_SHARDS

__all__ = ["WatchEvent", "WatchShardInput", "WatchSubscription", "WatchUnsubscribe"]


class WatchSubscription(Frozen):
    """Watch this job until it changes or goes wrong, then signal ``workflow_id`` a ``WatchEvent`` (once)."""

    watch: JobWatchInput
    workflow_id: str = Field(min_length=1)
    run_id: str = ""
    """The subscribing run: an event carries it back, so a run after continue-as-new ignores its predecessor's."""
    seq: int = Field(ge=1)
    """The run's subscription counter: the same ``seq`` again renews the lease; a higher one replaces the member."""


class WatchUnsubscribe(Frozen):
    """Stop watching for ``workflow_id`` (a GPU fault or a pause took over); ``seq`` guards a newer subscription."""

    workflow_id: str = Field(min_length=1)
    run_id: str = ""
    seq: int = Field(ge=1)


class WatchEvent(Frozen):
    """What a member's watch found: exactly what the per-job ``job_watch`` activity would have returned."""

    run_id: str = ""
    seq: int = Field(ge=1)
    shard: int = Field(ge=0)
    result: JobWatchResult


class WatchShardInput(Frozen):
    """One shard's long-lived workflow: run the hub on whichever worker polls ``watch_task_queue``."""

    cluster: str
    shard: int = Field(ge=0)
    shards: int = Field(ge=1, le=MAX_SHARDS)
    watch_task_queue: str = Field(min_length=1)
    shard_queue_prefix: str = Field(min_length=1)
    poll_interval_s: float = Field(1.0, gt=0, le=300)
    heartbeat_timeout_s: float = Field(30.0, ge=5, le=600)
    """Without a heartbeat for this long the shard's activity is retried on another worker: the takeover time."""
    lease_s: float = Field(3600.0, ge=10)
