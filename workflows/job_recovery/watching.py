"""JobRecovery's side of the watch hub (ADR 015): subscribe the job with its shard, wait for the hub's event (or a
GPU signal, or a pause), renew the lease meanwhile.

The event's ``JobWatchResult`` is what the per-job ``job_watch`` activity returns, so the workflow handles both the
same way. Each subscription of a run gets the next ``seq``; an event counts only for the run and ``seq`` it
answers (a duplicate after a worker crash, or a predecessor's after continue-as-new, is ignored).

An answer to an *older* subscription of this run means the shard held a stale member: a shard taken over restores
its members from its last heartbeat, which may predate the current subscription (the SDK sends a heartbeat every
~24 s). The shard drops the member once it has answered, so the run sends its current subscription again at once:
the shard reads from that subscription's offsets, finds the same lines again and answers with the current ``seq``
(nothing lost, nothing counted twice). A shard that restored no member at all learns the job at the first renewal,
60 s after subscribing, then every lease.
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
#: Patch id: the first renewal after ``FIRST_RENEWAL_S``, and a renewal at once on an answer to an older
#: subscription (runs recorded before it renewed every lease only, and ignored such answers).
RENEWAL_PATCH = "13-hub-renewal"
#: The first renewal of a subscription comes this soon (then every lease): a shard taken over before its heartbeat
#: held the new member learns it again within a minute, not a lease (the SDK sends a heartbeat every ~24 s).
FIRST_RENEWAL_S = 60.0


class HubWatch:
    """The run's subscriptions: their counter, the event for the current one, the shard last named."""

    def __init__(self) -> None:
        self.seq = 0
        self.event: WatchEvent | None = None
        self.shard: int | None = None
        #: Answers to older subscriptions of this run (a shard restored a stale member): each asks a renewal.
        self.stale_answers = 0
        # Unsubscribes are not awaited (a GPU fault must not wait on a moving shard); kept so none is collected.
        self._leaving: list[workflow.ActivityHandle[Any]] = []

    def take(self, event: WatchEvent) -> None:
        """The ``watch_returned`` signal: keep the event if it answers the current subscription of this run."""
        if event.run_id != workflow.info().run_id:
            return
        if event.seq == self.seq and self.event is None:
            self.event = event
        elif event.seq < self.seq:
            self.stale_answers += 1

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
        renew_early = workflow.patched(RENEWAL_PATCH)
        renewal_s = min(FIRST_RENEWAL_S, routing.lease_s) if renew_early else routing.lease_s
        stale_seen = self.stale_answers

        def stale_answer() -> bool:
            return renew_early and self.stale_answers != stale_seen

        while True:
            try:
                await workflow.wait_condition(
                    lambda: self.event is not None or stop() or stale_answer(), timeout=timedelta(seconds=renewal_s)
                )
            except TimeoutError:
                renewal_s = routing.lease_s
                if subscribing.done():  # renew the lease (a stuck or restarted shard learns the job again)
                    subscribing = self._subscribe(sub, queue)
                continue
            if self.event is not None:
                return self.event.result
            if stale_answer() and not stop():
                stale_seen = self.stale_answers
                if subscribing.done():  # else the subscription in flight carries the current seq already
                    subscribing = self._subscribe(sub, queue)
                continue
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
