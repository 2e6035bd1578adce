"""The ``watch_shard`` activity (ADR 015): one shard's hub, run by whichever worker holds the shard now.

It restores the shard's members from its last heartbeat, serves the shard's own task queue (subscriptions and
unsubscriptions reach this process there), and every ``poll_interval_s`` polls every member once against the
worker's one shared scheduler snapshot. A member's result is signalled to its JobRecovery (``WatchEvent``); a
signal that fails is tried again next poll. It never returns: when this worker dies the heartbeat stops, and
Temporal retries the activity on another worker polling the watch queue, which restores the members.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.service import RPCError, RPCStatusCode

from activities.logs.job_logs import LogPolicy
from activities.logs.shard_view import view_says_changed
from activities.logs.watch_hub import ShardHub
from activities.slurm.port import SchedulerReads
from activities.slurm.snapshots import SnapshotCache
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import ClusterSnapshot
from workflows.domain.watch_hub import WatchEvent, WatchShardInput
from workflows.domain.watch_routing import shard_task_queue
from workflows.policy.watch import WatchAction

__all__ = ["DeliverEvent", "ServeQueue", "WantDigest", "WatchShardActivities"]

log = logging.getLogger("rebound.watch_shard")

#: Signal ``WatchEvent`` to the JobRecovery of this workflow id (``rebound_workflows.signal_watch_event``).
DeliverEvent = Callable[[str, WatchEvent], Awaitable[None]]
#: Ask shard k's feed mailbox of this cluster for its last digest (``rebound_workflows.request_feed_resend``).
WantDigest = Callable[[str, int], Awaitable[None]]
#: Poll this task queue for these activities while the context is open (an in-process ``Worker``, one poller).
ServeQueue = Callable[[str, Sequence[Callable[..., Any]]], AbstractAsyncContextManager[None]]

#: Heartbeat details are rebuilt at most this often: every poll's heartbeat reuses the last ones (the SDK sends one
#: every 0.8 x heartbeat timeout at most, 24 s at 30 s). Building them for ~300 jobs takes ~0.1 s, so not at every
#: send. Lines read since are re-read after a takeover (at most a minute's): never lost, never counted twice.
DETAILS_EVERY_S = 60.0
#: ... and this often while members come and go: a new member is in the next heartbeat the SDK sends.
CHANGED_DETAILS_EVERY_S = 5.0
#: One signal's limit: a hung server must not stall the shard's polls.
DELIVER_TIMEOUT_S = 10.0

#: One-job scheduler reads (confirmations) in flight at once per process: a burst of changes stays gentle.
ASK_CONCURRENCY = 8

MEMBERS_GAUGE = "rebound_watch_shard_members"
POLL_HISTOGRAM = "rebound_watch_shard_poll_seconds"


class WatchShardActivities:
    """The shard activity, sharing the worker's snapshot cache and log policy."""

    def __init__(
        self,
        snapshots: SnapshotCache,
        logs: LogPolicy,
        deliver: DeliverEvent,
        serve: ServeQueue,
        *,
        shared_feed: SchedulerReads | None = None,
        want_digest: WantDigest | None = None,
        full_poll_every_s: float = 0.0,
    ) -> None:
        """``shared_feed``: with the shared scheduler feed (``watch.scheduler_feed = shared``), the scheduler for the
        one-job reads that confirm a state change; the hub then reads its shard's view, not ``snapshots``, and asks for
        its mailbox's last digest when it starts (``want_digest``). ``full_poll_every_s``: its hubs' members read
        their lines in full this often, quiet polls between (``activities.logs.peek``)."""
        self._full_poll_every_s = full_poll_every_s
        self._snapshots = snapshots
        self._direct = shared_feed
        self._want_digest = want_digest
        self._asking = asyncio.Semaphore(ASK_CONCURRENCY)
        self._logs = logs
        self._deliver = deliver
        self._serve = serve
        self.hubs: dict[int, ShardHub] = {}
        """The shards this process runs now (what ``rebound`` tests and the bench look at)."""

    @activity.defn(name="watch_shard")
    async def watch_shard(self, inp: WatchShardInput) -> None:
        """Run the shard's hub until cancelled (worker shutdown) or this worker dies (see the module docstring)."""
        details = activity.info().heartbeat_details
        now = datetime.now(UTC)
        hub = ShardHub.restore(
            details[-1] if details else None,
            inp.shard,
            self._logs,
            inp.lease_s,
            now,
            full_poll_every_s=self._full_poll_every_s,
        )
        attempt = activity.info().attempt
        log.info("shard %s: running (attempt %s, %d members restored)", inp.shard, attempt, len(hub.members))
        self.hubs[inp.shard] = hub
        queue = shard_task_queue(inp.shard_queue_prefix, inp.shard)
        try:
            async with self._serve(queue, [hub.subscribe_activity, hub.unsubscribe_activity, hub.feed_apply_activity]):
                if self._direct is not None and self._want_digest is not None:
                    try:  # best effort: without it the view is ready at the feed's next digest
                        await asyncio.wait_for(self._want_digest(inp.cluster, inp.shard), timeout=DELIVER_TIMEOUT_S)
                    except Exception as e:
                        log.warning("shard %s: could not ask the feed for a digest: %s", inp.shard, e)
                await self._run(hub, inp)
        finally:
            if self.hubs.get(inp.shard) is hub:
                del self.hubs[inp.shard]

    async def _run(self, hub: ShardHub, inp: WatchShardInput) -> None:
        meter = activity.metric_meter()
        members_gauge = meter.create_gauge(MEMBERS_GAUGE, "Jobs a watch shard's hub polls.")
        poll_seconds = meter.create_histogram_float(POLL_HISTOGRAM, "One poll of all a shard's jobs.", "s")
        attrs = {"shard": str(inp.shard)}
        details: dict[str, Any] = hub.details()
        built_at = time.monotonic()
        poll_s = 0.0
        while True:
            began = time.monotonic()
            try:
                await self.poll_once(hub)
            except ReboundError as e:
                # A scheduler outage or refused credentials: the members wait (their offsets hold, nothing is read
                # as a state); the heartbeat goes on, the shard stays. Refused credentials are logged as errors.
                level = logging.ERROR if e.kind is FailureKind.SCHEDULER_AUTH else logging.WARNING
                log.log(level, "shard %s: no scheduler snapshot this poll: %s: %s", hub.shard, e.kind.value, e.message)
            await self.deliver_pending(hub)
            poll_s = time.monotonic() - began
            members_gauge.set(len(hub.members), attrs)
            poll_seconds.record(poll_s, attrs)
            since = time.monotonic() - built_at
            if since >= DETAILS_EVERY_S or (hub.changed and since >= CHANGED_DETAILS_EVERY_S):
                details = hub.details({"poll_s": round(poll_s, 4), "at": datetime.now(UTC).isoformat()})
                built_at = time.monotonic()
            activity.heartbeat(details)
            await asyncio.sleep(max(0.0, inp.poll_interval_s - poll_s))

    async def poll_once(self, hub: ShardHub) -> None:
        """Poll every member once against the shared snapshot (a fresh one only when a member's policy asks)."""
        now = datetime.now(UTC)
        for key in hub.expire(now):
            log.info("shard %s: %s not renewed for two leases, dropped", hub.shard, key)
        if not hub.members:
            return
        if self._direct is not None and hub.view.ready:
            await self._poll_from_view(hub, self._direct)
            return
        snap = await self._snapshots.get()
        steps = await asyncio.to_thread(hub.read_all, snap)  # each member stamped at its read
        fresh: ClusterSnapshot | None = None
        for key, step in steps:
            if step.decision.action is WatchAction.REFRESH_SCHEDULER and fresh is None:
                fresh = await self._snapshots.get(max_age_s=0)
            hub.settle(key, step, fresh)

    async def _poll_from_view(self, hub: ShardHub, direct: SchedulerReads) -> None:
        """Poll every member against the shard's feed view; a job the view says changed or gone is confirmed with
        the scheduler first (one job, ``get_job``), and so is a ``REFRESH_SCHEDULER``: the feed may lag the logs or
        a requeue by a poll and a hand-over, and a lagging view must not be read as a state."""
        views: dict[str, ClusterSnapshot] = {}
        confirm: list[str] = []
        for key, m in hub.members.items():
            view = hub.view.snapshot_of(m.sub.watch.job_id, m.watcher.state.nodes)
            if m.pending is not None or view is None:
                continue
            views[key] = view
            if view_says_changed(view, m.sub.watch):
                confirm.append(key)
        jobs = {key: m.sub.watch.job_id for key, m in hub.members.items()}
        asked = await self._ask(hub, direct, [(jobs[k], views[k]) for k in confirm])
        for key, word in zip(confirm, asked, strict=True):
            if word is None:
                del views[key]  # the scheduler could not say: the member waits a poll, as in an outage
            else:
                views[key] = word
        steps = await asyncio.to_thread(hub.read_all, views)
        refresh = [(k, s) for k, s in steps if s.decision.action is WatchAction.REFRESH_SCHEDULER]
        again = await self._ask(hub, direct, [(jobs[k], views[k]) for k, _ in refresh])
        fresh = dict(zip([k for k, _ in refresh], again, strict=True))
        for key, step in steps:
            hub.settle(key, step, fresh.get(key))

    async def _ask(
        self, hub: ShardHub, direct: SchedulerReads, views: list[tuple[int, ClusterSnapshot]]
    ) -> list[ClusterSnapshot | None]:
        """Each job's view with the job as the scheduler says now (None where it could not say)."""

        async def one(job_id: int, view: ClusterSnapshot) -> ClusterSnapshot | None:
            async with self._asking:
                taken = datetime.now(UTC)
                try:
                    job = await direct.get_job(job_id)
                except ReboundError as e:
                    log.warning("shard %s: job %s could not be confirmed: %s", hub.shard, job_id, e.message)
                    return None
                return ClusterSnapshot.model_construct(
                    observed_at=taken, jobs=(job,) if job is not None else (), nodes=view.nodes
                )

        return list(await asyncio.gather(*(one(j, v) for j, v in views)))

    async def deliver_pending(self, hub: ShardHub) -> None:
        """Signal every pending event; a delivered one (or one whose workflow is gone) drops its member."""
        pending = hub.pending()
        if not pending:
            return
        outcomes = await asyncio.gather(
            *(self._deliver_one(key, m.pending) for key, m in pending if m.pending is not None),
            return_exceptions=True,
        )
        for (key, _), outcome in zip(pending, outcomes, strict=True):
            if outcome is True:
                hub.delivered(key)
            elif isinstance(outcome, BaseException):
                log.warning("shard %s: signalling %s failed, tried again next poll: %s", hub.shard, key, outcome)

    async def _deliver_one(self, workflow_id: str, event: WatchEvent) -> bool:
        try:
            await asyncio.wait_for(self._deliver(workflow_id, event), timeout=DELIVER_TIMEOUT_S)
        except RPCError as e:
            if e.status is RPCStatusCode.NOT_FOUND:
                log.info("%s is gone: its watch event is dropped", workflow_id)
                return True
            raise
        return True
