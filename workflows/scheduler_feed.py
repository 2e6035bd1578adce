"""The cluster's one scheduler poll, shared by every worker (ADR 015, "One scheduler poll per cluster").

``SchedulerFeed`` (id ``rebound/{cluster}/scheduler-feed``, started idempotently by every worker) keeps one
heartbeating ``scheduler_feed`` activity running on the watch queue, exactly like a ``WatchShard`` keeps its hub
(one loop, ``workflows.keep_running``): when the worker running it dies, Temporal retries it on another worker
within the heartbeat timeout.

``ShardFeed`` (id ``rebound/{cluster}/scheduler-feed/{k}``, one per watch shard, started by the feed's first
update to it) is the shard's mailbox: it takes the feed's signals and hands them, in order and batched, to the
shard's hub through a short activity on the shard's own task queue (where subscriptions go), so they reach
whichever process runs the shard now. It keeps the last digest and the deltas since, and sends them again when a
hub starts on the shard (``feed_resend``, from the hub: a takeover starts with an empty view). It is separate from
``WatchShard`` on purpose: its history grows with every update and it continues as new freely, while a
``WatchShard`` cannot without restarting its hub's activity.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.slurm.scheduler_feed import SchedulerFeedActivities
    from workflows.constants import (
        FEED_RESEND_SIGNAL,
        FEED_UPDATE_SIGNAL,
        SCHEDULER_FEED_WORKFLOW,
        SHARD_FEED_WORKFLOW,
        WATCH_FEED_APPLY_ACTIVITY,
    )
    from workflows.domain.scheduler_feed import MAX_UPDATE_ITEMS, FeedUpdate, SchedulerFeedInput, ShardFeedInput
    from workflows.keep_running import keep_running
    from workflows.options import RETRY_WITHOUT_END

#: Items a mailbox keeps to replay to a hub that just started (its last digest and the deltas since): ~8 MB of
#: workflow memory at most; the digest of 10,000 jobs in 32 shards is ~600 items.
RESEND_MAX_ITEMS = 5000


@workflow.defn(name=SCHEDULER_FEED_WORKFLOW)
class SchedulerFeedWorkflow:
    """Keeps the cluster's scheduler feed running somewhere."""

    @workflow.run
    async def run(self, inp: SchedulerFeedInput) -> None:
        """Run the feed; on the rare return or final failure, run it again (never returns)."""
        await keep_running(
            SchedulerFeedActivities.scheduler_feed,
            inp,
            task_queue=inp.watch_task_queue,
            heartbeat_timeout_s=inp.heartbeat_timeout_s,
            summary="Scheduler feed: poll the scheduler once for the cluster, publish each shard's changes",
        )


@workflow.defn(name=SHARD_FEED_WORKFLOW)
class ShardFeedWorkflow:
    """One shard's mailbox (see the module docstring)."""

    def __init__(self) -> None:
        self._inbox: list[FeedUpdate] = []
        self._digest: list[FeedUpdate] = []
        """The last whole digest's parts and every delta since: what a hub that just started needs."""
        self._parts: list[FeedUpdate] = []

    @workflow.signal(name=FEED_UPDATE_SIGNAL)
    def feed_update(self, update: FeedUpdate) -> None:
        self._inbox.append(update)
        if update.digest:
            self._parts = [update] if update.part == 0 else [*self._parts, update]
            if len(self._parts) == update.parts:
                self._digest, self._parts = self._parts, []
        elif self._digest:
            self._digest.append(update)
            if sum(u.items for u in self._digest) > RESEND_MAX_ITEMS:
                self._digest = []  # too many changes to replay: the hub waits for the feed's next digest

    @workflow.signal(name=FEED_RESEND_SIGNAL)
    def feed_resend(self) -> None:
        """A hub just started on the shard (a takeover: its view is empty): the last digest and the changes since,
        before anything else in the inbox (which they include)."""
        if self._digest:
            self._inbox = [*self._digest, *self._parts]  # the parts of a digest still arriving too

    @workflow.run
    async def run(self, inp: ShardFeedInput) -> None:
        """Hand the inbox to the hub in order, a batch at a time; continue as new when the history grows."""
        while True:
            await workflow.wait_condition(lambda: bool(self._inbox) or workflow.info().is_continue_as_new_suggested())
            if not self._inbox:
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._inbox:
                    workflow.continue_as_new(inp)
                continue
            batch = self._take()
            try:
                await workflow.execute_activity(
                    WATCH_FEED_APPLY_ACTIVITY,
                    batch,
                    task_queue=inp.shard_queue,
                    schedule_to_close_timeout=timedelta(seconds=inp.deliver_within_s),
                    start_to_close_timeout=timedelta(seconds=10),
                    retry_policy=RETRY_WITHOUT_END,  # while the shard moves, within deliver_within_s
                    result_type=int,
                    summary=f"Shard {inp.shard}: {len(batch)} scheduler update(s) to its hub",
                )
            except ActivityError:
                # Nobody runs the shard (it is moving, or no worker has the hub): the view will see the gap and
                # read the scheduler itself until the feed's next digest. Nothing waits here meanwhile.
                workflow.logger.warning("shard %s: %d feed updates given up undelivered", inp.shard, len(batch))

    def _take(self) -> list[FeedUpdate]:
        """The oldest updates, up to ``MAX_UPDATE_ITEMS`` items (at least one): one payload under 2 MB."""
        taken, items = 0, 0
        for update in self._inbox:
            if taken and items + update.items > MAX_UPDATE_ITEMS:
                break
            taken += 1
            items += update.items
        batch, self._inbox = self._inbox[:taken], self._inbox[taken:]
        return batch
