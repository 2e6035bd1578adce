"""WatchShard: one tiny long-lived workflow per watch shard (id ``rebound/{cluster}/watch-shard/{k}``, ADR 015).

It only keeps the shard's ``watch_shard`` activity (the hub, ``activities.logs.watch_shard``) running on the watch
task queue: heartbeating, retried without end, so when the worker running it dies Temporal starts it again on
another worker polling that queue within the heartbeat timeout. No code of ours decides the takeover. The history
stays a handful of events (heartbeats are not recorded); it continues as new when the server suggests it.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.logs.watch_shard import WatchShardActivities
    from workflows.constants import WATCH_SHARD_WORKFLOW
    from workflows.domain.watch_hub import WatchShardInput
    from workflows.options import RETRY_WITHOUT_END

#: After an attempt that failed for good (it never should): wait, then run the hub again.
BACKOFF = timedelta(seconds=10)


@workflow.defn(name=WATCH_SHARD_WORKFLOW)
class WatchShardWorkflow:
    """Keeps one watch shard's hub running somewhere."""

    @workflow.run
    async def run(self, inp: WatchShardInput) -> None:
        """Run the hub; on the rare return or final failure, run it again (never returns)."""
        while True:
            try:
                await workflow.execute_activity_method(
                    WatchShardActivities.watch_shard,
                    inp,
                    task_queue=inp.watch_task_queue,
                    start_to_close_timeout=timedelta(days=365),
                    heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_s),
                    retry_policy=RETRY_WITHOUT_END,  # short, so a takeover costs the heartbeat timeout and little more
                    summary=f"Watch shard {inp.shard}: poll its jobs' scheduler state and logs",
                )
            except ActivityError:
                await workflow.sleep(BACKOFF)
            if workflow.info().is_continue_as_new_suggested():
                workflow.continue_as_new(inp)
