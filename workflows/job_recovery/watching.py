"""JobRecovery's side of the watch hub (ADR 015): subscribe the job with its shard, wait for the hub's event (or a
GPU signal, or a pause), renew the lease meanwhile.

The event's ``JobWatchResult`` is what the per-job ``job_watch`` activity returns, so the workflow handles both the
same way. Each subscription of a run gets the next ``seq``; an event counts only for the run and ``seq`` it
answers (a duplicate after a worker crash, or a predecessor's after continue-as-new, is ignored).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.logs.watch_hub import ShardHub
    from workflows.domain.loop import JobWatchInput, JobWatchResult
    from workflows.domain.watch_hub import WatchEvent, WatchSubscription, WatchUnsubscribe
    from workflows.domain.watch_routing import WatchRouting, shard_of, shard_task_queue
    from workflows.options import WATCH_SUBSCRIBE, WATCH_UNSUBSCRIBE

#: Patch id (docs/adr/012): the per-job ``job_watch`` activity replaced by a subscription with the watch hub.
HUB_PATCH = "12-watch-hub"
#: The first renewal of a subscription comes this soon (then every lease): a shard taken over before its heartbeat
#: held the new member learns it again within a minute, not a lease (the SDK sends a heartbeat every ~24 s).
FIRST_RENEWAL_S = 60.0


class HubWatch:
    """The run's subscriptions: their counter, the event for the current one, the shard last named."""

    def __init__(self) -> None:
        self.seq = 0
        self.event: WatchEvent | None = None
        self.shard: int | None = None
        # Unsubscribes are not awaited (a GPU fault must not wait on a moving shard); kept so none is collected.
        self._leaving: list[workflow.ActivityHandle[Any]] = []

    def take(self, event: WatchEvent) -> None:
        """The ``watch_returned`` signal: keep the event if it answers the current subscription of this run."""
        if event.run_id == workflow.info().run_id and event.seq == self.seq and self.event is None:
            self.event = event

    async def watch(
        self, watch: JobWatchInput, routing: WatchRouting, stop: Callable[[], bool]
    ) -> JobWatchResult | None:
        """Subscribe and wait: the hub's result, or None when ``stop()`` came true first (then unsubscribed)."""
        self.seq += 1
        self.event = None
        info = workflow.info()
        sub = WatchSubscription(watch=watch, workflow_id=info.workflow_id, run_id=info.run_id, seq=self.seq)
        self.shard = shard_of(watch.job_id, routing.shards)
        queue = shard_task_queue(routing.shard_queue_prefix, self.shard)
        subscribing = self._subscribe(sub, queue)
        while True:
            try:
                await workflow.wait_condition(
                    lambda: self.event is not None or stop(), timeout=timedelta(seconds=routing.lease_s)
                )
            except TimeoutError:
                if subscribing.done():  # renew the lease (a stuck or restarted shard learns the job again)
                    subscribing = self._subscribe(sub, queue)
                continue
            if self.event is not None:
                return self.event.result
            if not subscribing.done():
                subscribing.cancel()
            self._leaving = [h for h in self._leaving if not h.done()]
            self._leaving.append(
                workflow.start_activity_method(
                    ShardHub.unsubscribe_activity,
                    WatchUnsubscribe(workflow_id=info.workflow_id, run_id=info.run_id, seq=self.seq),
                    task_queue=queue,
                    summary=f"Stop shard {self.shard}'s watch of job {watch.job_id}",
                    **WATCH_UNSUBSCRIBE,
                )
            )
            return None

    def _subscribe(self, sub: WatchSubscription, queue: str) -> workflow.ActivityHandle[str]:
        return workflow.start_activity_method(
            ShardHub.subscribe_activity,
            sub,
            task_queue=queue,
            summary=f"Watch job {sub.watch.job_id} in shard {self.shard} (subscription {sub.seq})",
            **WATCH_SUBSCRIBE,
        )
