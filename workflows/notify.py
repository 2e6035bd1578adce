"""``notify()``: how a workflow tells people something, without ever being stopped or slowed by it.

Fire and forget. ``notify`` schedules the ``notify_webhook`` activity and returns at once; the caller does not wait
for the webhook, and a failure (endpoint down, 4xx, timeout) only produces a warning in the worker's log. The
activity's options bound it (one minute a try, two tries, three minutes in all), so a broken webhook costs the
workflow three history events, not time.

Replay safety: ``start_activity`` emits its ScheduleActivityTask command at the same point of the workflow's code
on every execution, and the done callback that logs the outcome runs when the activity's completion event is
applied, also at the same point on every replay; nothing reads a clock, a setting or the network. The log line is
suppressed during replay by ``workflow.logger``. Awaiting the handle is never needed, so the activity's failure can
never propagate into the caller.

One caveat, and the reason for ``wait``: an activity still pending when its workflow completes (or continues as
new) is abandoned. For the last message of a run (``gave_up``), pass ``wait`` to give it up to that long (a durable
timer, so also replay-safe) before returning; the wait never raises either.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.webhooks.notify import NotifyActivities
    from workflows.domain.notify import (
        Notification,
        NotificationKind,
        NotifyFailure,
        NotifyField,
        NotifyResult,
        Severity,
    )

__all__ = ["NOTIFY", "job_notification", "notify"]

#: One try runs at most ``notify.max_attempts`` requests of ``notify.timeout_s`` (<= 30 s) plus short backoffs;
#: Temporal adds one retry (another worker, if this one died), never a third: a notification is worth minutes at most.
NOTIFY: dict[str, Any] = {
    "start_to_close_timeout": timedelta(seconds=60),
    "schedule_to_close_timeout": timedelta(minutes=3),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=5),
        maximum_attempts=2,
        non_retryable_error_types=[NotifyFailure.WEBHOOK_REJECTED.value],
    ),
}


def job_notification(
    kind: NotificationKind, *, job_id: int, cluster: str, title: str, text: str, severity: Severity, **fields: str
) -> Notification:
    """A notification about one job, cut to what the model takes (the title, each field) and a readable length."""
    return Notification(
        kind=kind,
        job_id=job_id,
        cluster=cluster,
        title=title[:300],
        text=text[:2000],
        severity=severity,
        fields=tuple(NotifyField(key=k, value=v[:2000]) for k, v in fields.items()),
    )


async def notify(n: Notification, *, wait: timedelta | None = None) -> None:
    """Send ``n`` through the webhook without waiting for it (or at most ``wait``); never raises.

    Fills ``workflow_id`` (for the Temporal UI link) and, when empty, a deterministic ``idempotency_key``.
    """
    info = workflow.info()
    update: dict[str, str] = {"workflow_id": n.workflow_id or info.workflow_id}
    if not n.idempotency_key:
        update["idempotency_key"] = f"{info.workflow_id}/{info.run_id}/{n.kind.value}/{workflow.uuid4().hex[:12]}"
    n = n.model_copy(update=update)
    handle = workflow.start_activity_method(
        NotifyActivities.notify_webhook,
        n,
        summary=f"Notify {n.kind.value}: {n.title}"[:200],
        **NOTIFY,
    )
    handle.add_done_callback(lambda done: _log_outcome(n, done))
    if wait is None or wait <= timedelta(0):
        return
    try:
        await workflow.wait_condition(handle.done, timeout=wait, timeout_summary=f"notify {n.kind.value} (bounded)")
    except TimeoutError:
        workflow.logger.warning("notification %s for job %s still pending after %s", n.kind.value, n.job_id, wait)


def _log_outcome(n: Notification, done: asyncio.Task[NotifyResult]) -> None:
    """Retrieve the activity's result or error (so asyncio never reports it unretrieved) and log a failure."""
    if done.cancelled():
        workflow.logger.info("notification %s for job %s cancelled", n.kind.value, n.job_id)
        return
    error = done.exception()
    if error is not None:
        cause = error.__cause__ or error
        workflow.logger.warning("notification %s for job %s failed: %s", n.kind.value, n.job_id, cause)
