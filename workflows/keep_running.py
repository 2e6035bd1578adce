"""The loop of a workflow whose whole job is to keep one activity running somewhere (ADR 015): ``WatchShard``
keeps its shard's hub, ``SchedulerFeed`` the cluster's one scheduler poll.

The activity heartbeats and is retried without end on whichever worker polls its queue, so when the worker
running it dies Temporal starts it again elsewhere within the heartbeat timeout; no code of ours decides the
takeover. Should an attempt ever end (a return, or a failure for good), the loop waits and runs it again. The
history stays a handful of events (heartbeats are not recorded); it continues as new when the server suggests it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows.options import KEEP_RUNNING, KEEP_RUNNING_BACKOFF

__all__ = ["keep_running"]

InputT = TypeVar("InputT")


async def keep_running(
    activity: Callable[[Any, InputT], Awaitable[None]],
    inp: InputT,
    *,
    task_queue: str,
    heartbeat_timeout_s: float,
    summary: str,
) -> NoReturn:
    """Run ``activity(inp)`` on ``task_queue`` forever; continue as new with ``inp`` when the server suggests it.

    Args:
        activity: An activity method (its class's, unbound: the worker's instance runs it).
        inp: The workflow's input, passed to every attempt and to the next run.
        task_queue: Where the activity runs: every worker that may take it over polls this queue.
        heartbeat_timeout_s: Without a heartbeat for this long the activity is retried elsewhere (the takeover time).
        summary: Shown on each attempt in the UI.
    """
    while True:
        try:
            await workflow.execute_activity_method(
                activity,
                inp,
                task_queue=task_queue,
                heartbeat_timeout=timedelta(seconds=heartbeat_timeout_s),
                summary=summary,
                **KEEP_RUNNING,
            )
        except ActivityError:
            await workflow.sleep(KEEP_RUNNING_BACKOFF)
        if workflow.info().is_continue_as_new_suggested():
            workflow.continue_as_new(inp)
