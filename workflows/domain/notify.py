"""Notifications: what a workflow tells people (incidents, approvals needed, give-ups) through a webhook.

The workflow builds a ``Notification``; the ``notify_webhook`` activity renders it (Slack-compatible JSON) and sends
it. A notification is best effort by design: its failure is logged, never a reason to stop or slow a recovery.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from workflows.domain.base import Frozen


class NotificationKind(StrEnum):
    """What happened; ``notify.kinds`` chooses which kinds are sent."""

    INCIDENT = "incident"
    """A job failed (or hung) and Rebound is recovering it."""
    APPROVAL_NEEDED = "approval_needed"
    """An action waits for an operator's approval."""
    GAVE_UP = "gave_up"
    """Rebound stopped recovering a job (not retryable, budget spent, job gone)."""
    RESUMED = "resumed"
    """The job trains again after a recovery."""
    STRAGGLER = "straggler"
    """A rank (and its node) is persistently slower than its peers."""
    SCHEDULER_AUTH = "scheduler_auth"
    """The scheduler refused Rebound's credentials (slurmrestd JWT, munge, TLS): Rebound cannot see the cluster
    until an operator fixes the token or setting the message names."""


#: The kinds sent unless ``notify.kinds`` says otherwise: what needs a person's attention.
DEFAULT_KINDS = (
    NotificationKind.INCIDENT,
    NotificationKind.APPROVAL_NEEDED,
    NotificationKind.GAVE_UP,
    NotificationKind.SCHEDULER_AUTH,
)


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class NotifyField(Frozen):
    """One key/value line of a notification (rendered as a Slack section field)."""

    key: str = Field(min_length=1, max_length=100)
    value: str = Field(max_length=2000)


class Notification(Frozen):
    """One message to people about one job."""

    kind: NotificationKind
    job_id: int | str
    cluster: str
    title: str = Field(min_length=1, max_length=300)
    text: str = ""
    """Markdown (Slack mrkdwn subset: *bold*, `code`, links); long text is cut at send time, never rejected."""
    fields: tuple[NotifyField, ...] = ()
    severity: Severity = Severity.WARNING
    link: str = ""
    """Where to read more; empty: the activity links the workflow in the Temporal UI when ``notify.ui_base_url``
    is set."""
    workflow_id: str = ""
    """The sending workflow (filled by ``workflows.notify.notify``): the target of the Temporal UI link."""
    idempotency_key: str = ""
    """Same key, same message: sent as the ``Idempotency-Key`` header; a repeat the worker remembers is not resent.
    Filled by ``workflows.notify.notify`` when empty."""


class NotifyStatus(StrEnum):
    SENT = "sent"
    DISABLED = "disabled"
    """No ``notify.webhook_url``: nothing sent, at once."""
    FILTERED = "filtered"
    """The kind is not in ``notify.kinds``."""
    DUPLICATE = "duplicate"
    """This worker already sent a notification with this idempotency key."""


class NotifyResult(Frozen):
    status: NotifyStatus
    attempts: int = 0
    """HTTP requests made by this activity attempt (0 when nothing was sent)."""
    http_status: int | None = None


class NotifyFailure(StrEnum):
    """``ApplicationError.type`` of a failed ``notify_webhook``."""

    WEBHOOK_REJECTED = "WEBHOOK_REJECTED"
    """The endpoint answered 4xx (bad URL, revoked token, malformed payload): permanent, never retried."""
    WEBHOOK_UNAVAILABLE = "WEBHOOK_UNAVAILABLE"
    """5xx, 429, a timeout or a connection error on every try: transient."""
