"""``notify_webhook`` against a real HTTP server on loopback: payload, retries, permanent refusals, timeouts."""

from __future__ import annotations

import logging
import time

import pytest
from pydantic import SecretStr
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.webhooks.notify import NotifyActivities, slack_payload, temporal_ui_link
from tests.unit.notify.webhook_server import Answer, webhook_server
from workflows.domain.notify import (
    Notification,
    NotificationKind,
    NotifyFailure,
    NotifyField,
    NotifyStatus,
    Severity,
)

SECRET_PATH = "/services/T000/B000/s3cr3t-token"


def _incident(**kw: object) -> Notification:
    base: dict[str, object] = {
        "kind": NotificationKind.INCIDENT,
        "job_id": 42,
        "cluster": "lab",
        "title": "Job 42: XID 79 on n2",
        "text": "GPU 3 of *n2* fell off the bus; draining `n2` and requeueing.",
        "fields": (NotifyField(key="cause", value="xid-79"), NotifyField(key="nodes", value="n2")),
        "severity": Severity.CRITICAL,
        "workflow_id": "rebound/lab/job/42",
        "idempotency_key": "rebound/lab/job/42/run/incident/1",
    }
    return Notification.model_validate(base | kw)


def _acts(url: str | None, **kw: object) -> NotifyActivities:
    options: dict[str, object] = {"timeout_s": 2.0, "backoff_s": 0.05} | kw
    return NotifyActivities(SecretStr(url) if url else None, **options)  # type: ignore[arg-type]


async def _run(acts: NotifyActivities, n: Notification):  # type: ignore[no-untyped-def]
    return await ActivityEnvironment().run(acts.notify_webhook, n)


async def test_posts_slack_compatible_json_with_fields_context_and_ui_link() -> None:
    with webhook_server(Answer(200)) as server:
        acts = _acts(server.url(SECRET_PATH), ui_base_url="http://127.0.0.1:8233/")
        result = await _run(acts, _incident())
    assert (result.status, result.attempts, result.http_status) == (NotifyStatus.SENT, 1, 200)
    [req] = server.received
    assert req.path == SECRET_PATH
    assert req.headers["content-type"] == "application/json"
    assert req.headers["idempotency-key"] == "rebound/lab/job/42/run/incident/1"
    body = req.json()
    assert set(body) == {"text", "blocks"}
    assert [b["type"] for b in body["blocks"]] == ["header", "section", "section", "context"]
    header, text, fields, context = body["blocks"]
    assert header["text"] == {"type": "plain_text", "text": ":rotating_light: Job 42: XID 79 on n2", "emoji": True}
    assert text["text"]["type"] == "mrkdwn" and "draining `n2`" in text["text"]["text"]
    assert fields["fields"] == [
        {"type": "mrkdwn", "text": "*cause*\nxid-79"},
        {"type": "mrkdwn", "text": "*nodes*\nn2"},
    ]
    link = "http://127.0.0.1:8233/namespaces/default/workflows/rebound%2Flab%2Fjob%2F42"
    assert context["elements"] == [
        {"type": "mrkdwn", "text": "lab · job 42 · incident · critical"},
        {"type": "mrkdwn", "text": f"<{link}|Open in Temporal UI>"},
    ]
    # Generic webhooks (Mattermost, Teams) read only "text": it must carry the whole message.
    assert body["text"].startswith("*Job 42: XID 79 on n2*\nGPU 3 of *n2*")
    assert "*cause:* xid-79" in body["text"] and link in body["text"]


def test_payload_respects_slack_limits_and_minimal_messages() -> None:
    many = tuple(NotifyField(key=f"k{i}", value="v" * 2000) for i in range(14))
    body = slack_payload(_incident(title="t" * 300, text="x" * 5000, fields=many))
    header, text, fields, _ = body["blocks"]
    assert len(header["text"]["text"]) == 150 and header["text"]["text"].endswith("…")
    assert len(text["text"]["text"]) == 3000
    assert len(fields["fields"]) == 10 and all(len(f["text"]) <= 2000 for f in fields["fields"])
    assert len(body["text"]) == 4000
    bare = slack_payload(_incident(text="", fields=(), severity=Severity.INFO))
    assert [b["type"] for b in bare["blocks"]] == ["header", "context"]
    assert bare["text"] == "*Job 42: XID 79 on n2*\nlab · job 42 · incident · info"


def test_ui_link_encodes_namespace_and_id() -> None:
    assert temporal_ui_link("https://ui.example/", "prod ns", "rebound/c/job/1") == (
        "https://ui.example/namespaces/prod%20ns/workflows/rebound%2Fc%2Fjob%2F1"
    )


async def test_retries_500_then_succeeds_with_backoff() -> None:
    with webhook_server(Answer(500, "boom"), Answer(502), Answer(200)) as server:
        result = await _run(_acts(server.url(), max_attempts=3, backoff_s=0.1), _incident())
    assert (result.status, result.attempts, result.http_status) == (NotifyStatus.SENT, 3, 200)
    gaps = [b.at - a.at for a, b in zip(server.received, server.received[1:], strict=False)]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19  # 0.1 s, then doubled


async def test_429_honours_retry_after() -> None:
    with webhook_server(Answer(429, "rate_limited", headers=(("Retry-After", "1"),)), Answer(200)) as server:
        result = await _run(_acts(server.url(), backoff_s=0.01), _incident())
    assert result.attempts == 2
    assert server.received[1].at - server.received[0].at >= 0.95


async def test_5xx_every_time_is_a_retryable_failure_after_max_attempts() -> None:
    with webhook_server(Answer(503, "maintenance")) as server, pytest.raises(ApplicationError) as err:
        await _run(_acts(server.url(), max_attempts=3), _incident())
    assert len(server.received) == 3
    assert err.value.type == NotifyFailure.WEBHOOK_UNAVAILABLE.value and not err.value.non_retryable
    assert "after 3 tries: HTTP 503 'maintenance'" in str(err.value)
    assert "s3cr3t" not in str(err.value)


@pytest.mark.parametrize("status", [400, 403, 404, 410])
async def test_4xx_is_permanent_and_not_retried(status: int) -> None:
    with webhook_server(Answer(status, "invalid_token")) as server, pytest.raises(ApplicationError) as err:
        await _run(_acts(server.url(SECRET_PATH), max_attempts=3), _incident())
    assert len(server.received) == 1
    assert err.value.type == "WEBHOOK_REJECTED" and err.value.non_retryable
    assert f"HTTP {status} 'invalid_token'" in str(err.value)
    assert "s3cr3t" not in str(err.value)


async def test_slow_server_times_out_per_request() -> None:
    with webhook_server(Answer(200, delay_s=3.0)) as server:
        started = time.monotonic()
        with pytest.raises(ApplicationError) as err:
            await _run(_acts(server.url(), timeout_s=0.3, max_attempts=2, backoff_s=0.05), _incident())
        elapsed = time.monotonic() - started
    assert len(server.received) == 2
    assert err.value.type == "WEBHOOK_UNAVAILABLE"
    assert "no answer within 0.3 s" in str(err.value)
    # Two 0.3 s tries plus a 0.05 s pause (0.65 s); a try that waited for the server would alone take 3 s. The
    # margin between is for a loaded CI machine.
    assert 0.6 <= elapsed < 2.5, elapsed


async def test_connection_refused_is_transient() -> None:
    with webhook_server() as server:
        url = server.url()
    # The server is gone: nothing listens on the port any more.
    with pytest.raises(ApplicationError) as err:
        await _run(_acts(url, max_attempts=2), _incident())
    assert err.value.type == "WEBHOOK_UNAVAILABLE" and "ConnectError" in str(err.value)


async def test_disabled_without_url_returns_at_once() -> None:
    started = time.monotonic()
    result = await _run(_acts(None), _incident())
    assert result.status is NotifyStatus.DISABLED and result.attempts == 0
    assert time.monotonic() - started < 1.0  # no request is made, so nothing to wait for


async def test_kinds_filter_and_duplicate_keys_send_nothing() -> None:
    with webhook_server() as server:
        acts = _acts(server.url(), kinds=["gave_up"])
        assert (await _run(acts, _incident())).status is NotifyStatus.FILTERED
        gave_up = _incident(kind=NotificationKind.GAVE_UP, idempotency_key="k1")
        assert (await _run(acts, gave_up)).status is NotifyStatus.SENT
        assert (await _run(acts, gave_up)).status is NotifyStatus.DUPLICATE
        assert (await _run(acts, gave_up.model_copy(update={"idempotency_key": "k2"}))).status is NotifyStatus.SENT
    assert len(server.received) == 2


async def test_webhook_url_never_reaches_the_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with webhook_server(Answer(500), Answer(200)) as server:
        await _run(_acts(server.url(SECRET_PATH)), _incident())
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "HTTP Request: POST <webhook url>" in text  # httpx's own line, redacted
    assert "s3cr3t" not in text


def test_bad_construction_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        NotifyActivities(None, max_attempts=0)
    with pytest.raises(ValueError, match="'pager'"):
        NotifyActivities(None, kinds=["pager"])
