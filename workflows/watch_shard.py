"""WatchShard: one tiny long-lived workflow per watch shard (id ``rebound/{cluster}/watch-shard/{k}``, ADR 015).

It only keeps the shard's ``watch_shard`` activity (the hub, ``activities.logs.watch_shard``) running on the watch
task queue: heartbeating, retried without end, so when the worker running it dies Temporal starts it again on
another worker polling that queue within the heartbeat timeout. No code of ours decides the takeover. The history
stays a handful of events (heartbeats are not recorded); it continues as new when the server suggests it (the loop
is ``workflows.keep_running``, shared with the ``SchedulerFeed``).
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.logs.watch_shard import WatchShardActivities
    from workflows.constants import WATCH_SHARD_WORKFLOW
    from workflows.domain.watch_hub import WatchShardInput
    from workflows.keep_running import keep_running


@workflow.defn(name=WATCH_SHARD_WORKFLOW)
class WatchShardWorkflow:
    """Keeps one watch shard's hub running somewhere."""

    @workflow.run
    async def run(self, inp: WatchShardInput) -> None:
        """Run the hub; on the rare return or final failure, run it again (never returns)."""
        await keep_running(
            WatchShardActivities.watch_shard,
            inp,
            task_queue=inp.watch_task_queue,
            heartbeat_timeout_s=inp.heartbeat_timeout_s,
            summary=f"Watch shard {inp.shard}: poll its jobs' scheduler state and logs",
        )
