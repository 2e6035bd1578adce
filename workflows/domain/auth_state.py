"""What a workflow keeps to authenticate operators (``workflows.policy.operators``): its own record of used
credentials, recent refusals, and the audit of operator actions."""

from __future__ import annotations

from datetime import datetime

from workflows.domain.base import Frozen

__all__ = ["AuthEvent", "AuthState"]


class AuthEvent(Frozen):
    """One operator action or refusal, for the audit (bounded in ``AuthState.events``)."""

    at: datetime
    user: str
    """The verified user, or ``claimed:<name>`` when verification failed."""
    action: str
    allowed: bool
    detail: str = ""


class AuthState(Frozen):
    """What a workflow keeps to authenticate operators: used credentials, recent refusals, the audit."""

    used: dict[str, datetime] = {}
    """Digest of every credential presented (verified or not) -> its claimed encode time: never accepted again.
    Pruned once older than the maximum age (older ones are refused by age anyway)."""
    refusals: tuple[tuple[str, datetime], ...] = ()
    """(claimed user, when) of recent failed verifications: the rate limit of forged attempts."""
    events: tuple[AuthEvent, ...] = ()
    operators_seen: tuple[str, ...] | None = None
    """The operator list at the last verification: a change is recorded once, as an event."""
