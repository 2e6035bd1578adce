"""``workflows.notify.notify`` on a real (in-memory) Temporal dev server, with a real webhook on loopback.

What matters: a notification never fails the calling workflow and never makes it wait (beyond an explicit,
bounded ``wait``), and the helper replays deterministically.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from pydantic import SecretStr
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer, Worker

# workflows.notify is imported the way a workflow module would: inside the sandbox, to prove it sandbox-safe.
from workflows.notify import notify

with workflow.unsafe.imports_passed_through():
    from activities.webhooks.notify import NotifyActivities
    from tests.unit.notify.webhook_server import Answer, webhook_server
    from workflows.domain.notify import Notification, NotificationKind, Severity


@workflow.defn(name="NotifyProbe", sandboxed=True)
class NotifyProbe:
    """Stands in for JobRecovery: notifies, then goes on with its work (a short timer) and completes."""

    @workflow.run
    async def run(self, wait_s: float) -> str:
        await notify(
            Notification(
                kind=NotificationKind.GAVE_UP,
                job_id=7,
                cluster="lab",
                title="Job 7: gave up",
                text="restart budget spent",
                severity=Severity.CRITICAL,
            ),
            wait=timedelta(seconds=wait_s) if wait_s else None,
        )
        await workflow.sleep(timedelta(seconds=1), summary="the recovery's own work")
        return "recovered"


def _worker(client: Client, task_queue: str, url: str, **kw: object) -> Worker:
    acts = NotifyActivities(SecretStr(url), timeout_s=kw.pop("timeout_s", 2.0), backoff_s=0.05, **kw)  # type: ignore[arg-type]
    return Worker(client, task_queue=task_queue, workflows=[NotifyProbe], activities=[acts.notify_webhook])


async def _run(
    client: Client, task_queue: str, wait_s: float = 0
) -> tuple[str, float, WorkflowHandle[NotifyProbe, str]]:
    started = time.monotonic()
    handle = await client.start_workflow(
        NotifyProbe.run, wait_s, id=f"notify-probe-{task_queue}", task_queue=task_queue
    )
    result = await handle.result()
    return result, time.monotonic() - started, handle


async def _event_types(handle: WorkflowHandle[NotifyProbe, str]) -> list[int]:
    return [e.event_type async for e in handle.fetch_history_events()]


async def test_rejected_webhook_does_not_fail_the_workflow(
    temporal_client: Client, task_queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="temporalio.workflow")
    with webhook_server(Answer(403, "invalid_token")) as server:
        async with _worker(temporal_client, task_queue, server.url()):
            result, _, handle = await _run(temporal_client, task_queue)
    assert result == "recovered"
    assert len(server.received) == 1  # 4xx: one request, no retry by the activity or by Temporal
    events = await _event_types(handle)
    assert events.count(EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED) == 1
    assert events[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    assert any("notification gave_up for job 7 failed" in r.getMessage() for r in caplog.records)
    # The helper filled the link target and a deterministic idempotency key.
    sent = server.received[0]
    assert sent.headers["idempotency-key"].startswith(f"notify-probe-{task_queue}/")
    assert "/gave_up/" in sent.headers["idempotency-key"]


async def test_hanging_webhook_does_not_block_the_workflow(temporal_client: Client, task_queue: str) -> None:
    with webhook_server(Answer(200, delay_s=6.0)) as server:
        async with _worker(temporal_client, task_queue, server.url(), timeout_s=5.0, max_attempts=1):
            result, elapsed, handle = await _run(temporal_client, task_queue)
    assert result == "recovered"
    # The workflow's own work is a 1 s timer; the webhook would take 6 s. Never waited for.
    assert elapsed < 3.0, elapsed
    assert len(server.received) == 1
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED not in await _event_types(handle)


async def test_bounded_wait_delivers_before_completion_or_gives_up(temporal_client: Client, task_queue: str) -> None:
    with webhook_server(Answer(200)) as server:
        async with _worker(temporal_client, task_queue, server.url()):
            result, _, handle = await _run(temporal_client, task_queue, wait_s=10)
            delivered = len(server.received)
    assert result == "recovered" and delivered == 1
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED in await _event_types(handle)

    slow_queue = f"{task_queue}-slow"
    with webhook_server(Answer(200, delay_s=8.0)) as server:
        async with _worker(temporal_client, slow_queue, server.url(), timeout_s=10.0, max_attempts=1):
            result, elapsed, _ = await _run(temporal_client, slow_queue, wait_s=1)
    assert result == "recovered"
    assert 2.0 <= elapsed < 5.0, elapsed  # 1 s bounded wait + 1 s of work, not the webhook's 8 s


async def test_history_replays_deterministically(temporal_client: Client, task_queue: str) -> None:
    with webhook_server(Answer(500), Answer(200)) as server:
        async with _worker(temporal_client, task_queue, server.url()):
            _, _, handle = await _run(temporal_client, task_queue, wait_s=5)
    assert len(server.received) == 2  # a 500, then the in-activity retry succeeded
    history = await handle.fetch_history()
    await Replayer(workflows=[NotifyProbe], data_converter=temporal_client.data_converter).replay_workflow(history)
