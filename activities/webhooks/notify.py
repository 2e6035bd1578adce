"""The ``notify_webhook`` activity: one notification -> one POST of Slack-compatible JSON to the configured webhook.

The body is ``{"text": ..., "blocks": [...]}``: Slack renders the blocks (header, section, fields, context) and
uses ``text`` for the push notification; Mattermost, Teams workflows and generic webhooks read ``text`` alone, so
``text`` carries the whole message in markdown too.

Retries happen here, bounded (``max_attempts`` requests with exponential backoff) for what may pass: 5xx, 408, 429,
timeouts and connection errors. Any other 4xx is permanent: a non-retryable ``WEBHOOK_REJECTED``. The webhook URL
is a secret (Slack's carries its token in the path): it is never logged, never put into an error message, and
httpx's own request log lines have it redacted.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Collection
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import SecretStr
from temporalio import activity
from temporalio.exceptions import ApplicationError

from workflows.domain.notify import (
    DEFAULT_KINDS,
    Notification,
    NotificationKind,
    NotifyFailure,
    NotifyResult,
    NotifyStatus,
    Severity,
)

__all__ = ["DEFAULT_KINDS", "NotifyActivities", "slack_payload", "temporal_ui_link"]

# Slack's limits (block kit): header text 150, section text 3000, 10 fields of 2000; a message of at most 50 blocks.
_HEADER_MAX = 150
_SECTION_MAX = 3000
_FIELDS_MAX = 10
_FIELD_MAX = 2000
_TEXT_MAX = 4000
_BODY_SNIPPET = 200
_RETRY_AFTER_MAX_S = 10.0
_EMOJI = {Severity.INFO: ":information_source:", Severity.WARNING: ":warning:", Severity.CRITICAL: ":rotating_light:"}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def temporal_ui_link(base_url: str, namespace: str, workflow_id: str) -> str:
    """The Temporal Web UI page of a workflow (the id is percent-encoded: Rebound's ids contain slashes)."""
    return f"{base_url.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows/{quote(workflow_id, safe='')}"


def slack_payload(n: Notification, link: str = "") -> dict[str, Any]:
    """The JSON body for ``n``: Slack blocks plus a complete markdown ``text`` for other webhooks."""
    headline = f"{_EMOJI[n.severity]} {n.title}"
    where = f"{n.cluster} · job {n.job_id} · {n.kind.value} · {n.severity.value}"
    lines = [f"*{n.title}*", n.text] if n.text else [f"*{n.title}*"]
    lines += [f"*{f.key}:* {f.value}" for f in n.fields]
    lines.append(where + (f" · {link}" if link else ""))
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(headline, _HEADER_MAX), "emoji": True}}
    ]
    if n.text:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _cut(n.text, _SECTION_MAX)}})
    if n.fields:
        shown = n.fields[:_FIELDS_MAX]
        blocks.append(
            {
                "type": "section",
                "fields": [{"type": "mrkdwn", "text": _cut(f"*{f.key}*\n{f.value}", _FIELD_MAX)} for f in shown],
            }
        )
    context = [{"type": "mrkdwn", "text": where}]
    if link:
        context.append({"type": "mrkdwn", "text": f"<{link}|Open in Temporal UI>"})
    blocks.append({"type": "context", "elements": context})
    return {"text": _cut("\n".join(lines), _TEXT_MAX), "blocks": blocks}


class _RedactUrl(logging.Filter):
    """Replaces the webhook URL in httpx's ``HTTP Request: POST <url> ...`` log lines."""

    def __init__(self, secrets: Collection[str]) -> None:
        super().__init__()
        self._secrets = tuple(s for s in secrets if s)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(s in message for s in self._secrets):
            for secret in self._secrets:
                message = message.replace(secret, "<webhook url>")
            record.msg, record.args = message, None
        return True


class NotifyActivities:
    """Webhook notifications for the central worker. Holds the secret URL; remembers recently sent keys."""

    def __init__(
        self,
        webhook_url: SecretStr | None,
        *,
        timeout_s: float = 5.0,
        max_attempts: int = 3,
        kinds: Collection[NotificationKind | str] = DEFAULT_KINDS,
        ui_base_url: str | None = None,
        backoff_s: float = 0.5,
        remember: int = 1024,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Bind the settings.

        Args:
            webhook_url: ``notify.webhook_url``; None disables sending (the activity answers ``disabled``).
            timeout_s: Limit for one request, connect to last byte.
            max_attempts: Requests per activity attempt for transient failures (at least 1).
            kinds: The kinds to send; others answer ``filtered``.
            ui_base_url: Temporal Web UI base URL, to link the sending workflow; None: no link unless given.
            backoff_s: First pause between requests; doubles each time.
            remember: How many sent idempotency keys to remember (a repeat is not resent).
            transport: For tests.
        """
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        self._url = webhook_url
        self._timeout_s = timeout_s
        self._max_attempts = max_attempts
        self._kinds = frozenset(NotificationKind(k) for k in kinds)
        self._ui_base_url = ui_base_url
        self._backoff_s = backoff_s
        self._remember = remember
        self._sent: OrderedDict[str, None] = OrderedDict()
        self._transport = transport
        if webhook_url is not None:
            raw = webhook_url.get_secret_value()
            self._redact = _RedactUrl({raw, str(httpx.URL(raw))})
            httpx_log = logging.getLogger("httpx")
            if not any(isinstance(f, _RedactUrl) and f._secrets == self._redact._secrets for f in httpx_log.filters):
                httpx_log.addFilter(self._redact)

    @property
    def enabled(self) -> bool:
        return self._url is not None

    @activity.defn(name="notify_webhook")
    async def notify_webhook(self, n: Notification) -> NotifyResult:
        """Send ``n`` unless disabled, filtered out or already sent by this worker.

        Raises:
            ApplicationError: ``WEBHOOK_REJECTED`` (non-retryable) on a 4xx other than 408/429;
                ``WEBHOOK_UNAVAILABLE`` (retryable) when every request failed transiently.
        """
        if self._url is None:
            return NotifyResult(status=NotifyStatus.DISABLED)
        if n.kind not in self._kinds:
            return NotifyResult(status=NotifyStatus.FILTERED)
        if n.idempotency_key and n.idempotency_key in self._sent:
            return NotifyResult(status=NotifyStatus.DUPLICATE)
        link = n.link
        if not link and self._ui_base_url and n.workflow_id:
            link = temporal_ui_link(self._ui_base_url, activity.info().workflow_namespace or "default", n.workflow_id)
        headers = {"Idempotency-Key": n.idempotency_key} if n.idempotency_key else {}
        status, attempts = await self._post(self._url.get_secret_value(), slack_payload(n, link), headers, n)
        if n.idempotency_key:
            self._sent[n.idempotency_key] = None
            while len(self._sent) > self._remember:
                self._sent.popitem(last=False)
        return NotifyResult(status=NotifyStatus.SENT, attempts=attempts, http_status=status)

    async def _post(
        self, url: str, payload: dict[str, Any], headers: dict[str, str], n: Notification
    ) -> tuple[int, int]:
        """POST until a 2xx (returns its status and the number of requests made), a permanent refusal, or the
        last try."""
        problem = ""
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(self._timeout_s), transport=self._transport, follow_redirects=False
        ) as client:
            for attempt in range(1, self._max_attempts + 1):
                pause = self._backoff_s * 2 ** (attempt - 1)
                try:
                    # httpx's timeout is per phase (a server dribbling bytes resets it): bound the whole request.
                    async with asyncio.timeout(self._timeout_s):
                        response = await client.post(url, json=payload, headers=headers)
                except TimeoutError:
                    problem = f"no answer within {self._timeout_s:g} s"
                except httpx.TransportError as e:
                    problem = f"{type(e).__name__}: {self._redacted(str(e)) or 'connection failed'}"
                else:
                    code = response.status_code
                    if 200 <= code < 300:
                        return code, attempt
                    snippet = self._redacted(response.text[:_BODY_SNIPPET]).strip()
                    if code < 500 and code not in (408, 429):
                        raise ApplicationError(
                            f"webhook refused the {n.kind.value} notification for job {n.job_id}: HTTP {code}"
                            + (f" {snippet!r}" if snippet else "")
                            + " (check notify.webhook_url; not retried)",
                            type=NotifyFailure.WEBHOOK_REJECTED.value,
                            non_retryable=True,
                        )
                    problem = f"HTTP {code}" + (f" {snippet!r}" if snippet else "")
                    pause = max(pause, _retry_after_s(response))
                activity.logger.warning(
                    "webhook notification %s (job %s) try %d/%d failed: %s",
                    n.kind.value,
                    n.job_id,
                    attempt,
                    self._max_attempts,
                    problem,
                )
                if attempt < self._max_attempts:
                    await asyncio.sleep(pause)
        raise ApplicationError(
            f"webhook unavailable for the {n.kind.value} notification for job {n.job_id} after "
            f"{self._max_attempts} {'try' if self._max_attempts == 1 else 'tries'}: {problem}",
            type=NotifyFailure.WEBHOOK_UNAVAILABLE.value,
        )

    def _redacted(self, text: str) -> str:
        if self._url is None:
            return text
        raw = self._url.get_secret_value()
        for secret in (raw, str(httpx.URL(raw))):
            text = text.replace(secret, "<webhook url>")
        return text


def _retry_after_s(response: httpx.Response) -> float:
    """A 429/503's Retry-After in seconds (capped: the activity's own timeout bounds the wait), else 0."""
    value = response.headers.get("retry-after", "")
    try:
        return min(max(float(value), 0.0), _RETRY_AFTER_MAX_S)
    except ValueError:
        return 0.0
