"""Who may steer Rebound, decided from a verified MUNGE credential. Pure.

The path of an operator's action (``docs/security.md``):

1. The CLI signs the action's canonical payload (``action_payload``) with ``munge``: the credential carries the
   encoding user's UID and GID, the time, and the payload, sealed with the cluster's MUNGE key.
2. The update's validator (``precheck``) refuses synchronously what it can see without decoding: a malformed
   credential, a claimed encode time outside ``MAX_CREDENTIAL_AGE_S``, a credential presented before, a caller
   (or everyone together) past the refusal rate limit. A validator's refusal writes nothing to the history, so a
   flood of forged updates costs the history nothing.
3. The handler records the credential as used (before it waits for anything, so two concurrent copies of one
   credential cannot both pass), verifies it once in an activity (``unmunge``: STATUS must be success, the
   payload must be exactly this action's), and ``authorize`` decides from the verified user and groups against
   the operator list read at that moment. A retry of the verification would be a replay, so there is none.

Rebound keeps its own set of used credentials because munged's replay cache is per host: a credential used on
one worker's host would decode again on another's.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta

from workflows.domain.auth_state import AuthEvent, AuthState
from workflows.domain.operators import OperatorAction, OperatorRequest, VerifiedCaller

__all__ = [
    "MAX_CREDENTIAL_AGE_S",
    "action_payload",
    "authorize",
    "credential_digest",
    "is_operator",
    "note_outcome",
    "note_presented",
    "precheck",
]

#: A credential older than this (by its ENCODE_TIME, whatever TTL its encoder chose) is refused: long enough for a
#: CLI round trip to a busy Temporal, short enough that a captured credential is soon worthless.
MAX_CREDENTIAL_AGE_S = 120.0
#: Clocks of the CLI's host, the worker's host and Temporal's may disagree by this much.
CLOCK_SKEW_S = 30.0
#: Failed verifications within the window: per claimed caller, and for all callers together. Past either, the
#: validator refuses without running anything (an attacker who cycles claimed names meets the total).
REFUSAL_WINDOW_S = 600.0
REFUSALS_PER_CALLER = 5
REFUSALS_TOTAL = 30
#: Audit events kept in the workflow's state (the newest).
EVENTS_KEPT = 100

_PAYLOAD_PREFIX = "rebound-operator-action/v1\n"


def action_payload(action: OperatorAction) -> str:
    """The exact text a credential must carry for this action: every field, in a canonical order."""
    body = json.dumps(action.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return _PAYLOAD_PREFIX + body


def credential_digest(munge: str) -> str:
    """What Rebound remembers of a credential (not the credential itself, which the history already holds)."""
    return hashlib.sha256(munge.strip().encode()).hexdigest()[:32]


def is_operator(user: str, groups: tuple[str, ...], operators: tuple[str, ...]) -> bool:
    """``user`` is listed, or one of its groups is (``%group``). An empty list: nobody is an operator."""
    names = {o.strip() for o in operators if o.strip()}
    return bool(user) and (user in names or any(f"%{g}" in names for g in groups))


def _recent_refusals(auth: AuthState, now: datetime) -> list[tuple[str, datetime]]:
    since = now - timedelta(seconds=REFUSAL_WINDOW_S)
    return [(who, at) for who, at in auth.refusals if at >= since]


def precheck(auth: AuthState, req: OperatorRequest, now: datetime) -> str | None:
    """Why the validator refuses this request before anything runs, or None. Synchronous, no I/O."""
    cred = req.credential
    if not cred.munge.strip().startswith("MUNGE:"):
        return "the credential is not a MUNGE credential (the CLI signs every action with `munge`)"
    age = (now - cred.encoded_at).total_seconds()
    if age > MAX_CREDENTIAL_AGE_S:
        return f"the credential is {age:.0f} s old (at most {MAX_CREDENTIAL_AGE_S:.0f} s): run the command again"
    if age < -CLOCK_SKEW_S:
        return f"the credential claims to be from {-age:.0f} s in the future: check this host's clock"
    if credential_digest(cred.munge) in auth.used:
        return "this credential was presented before (a replay): every action needs a new one"
    recent = _recent_refusals(auth, now)
    if len(recent) >= REFUSALS_TOTAL:
        return (
            f"{len(recent)} failed verifications in the last {REFUSAL_WINDOW_S / 60:.0f} min: operator actions "
            "are refused for a while (see the workflow's audit events)"
        )
    mine = sum(1 for who, _ in recent if who == cred.claimed_user)
    if mine >= REFUSALS_PER_CALLER:
        return f"{cred.claimed_user}: {mine} failed verifications in the last {REFUSAL_WINDOW_S / 60:.0f} min"
    return None


def note_presented(auth: AuthState, req: OperatorRequest, now: datetime) -> AuthState:
    """Remember the credential as used (verified or not) and forget those too old to matter."""
    oldest = now - timedelta(seconds=MAX_CREDENTIAL_AGE_S + 2 * CLOCK_SKEW_S)
    used = {d: at for d, at in auth.used.items() if at >= oldest}
    used[credential_digest(req.credential.munge)] = req.credential.encoded_at
    return auth.model_copy(update={"used": used})


def authorize(verified: VerifiedCaller, req: OperatorRequest, now: datetime) -> str | None:
    """Why the verified caller may not do this, or None when they may."""
    if not verified.ok:
        return f"the credential did not verify: {verified.reason}"
    if verified.encoded_at is None:
        return "the credential carries no encode time"
    age = (now - verified.encoded_at).total_seconds()
    if age > MAX_CREDENTIAL_AGE_S + CLOCK_SKEW_S or age < -CLOCK_SKEW_S:
        return f"the credential was encoded {age:.0f} s ago (at most {MAX_CREDENTIAL_AGE_S:.0f} s)"
    claimed_gap = abs((verified.encoded_at - req.credential.encoded_at).total_seconds())
    if claimed_gap > CLOCK_SKEW_S:
        return "the request's claimed encode time does not match the credential's"
    if not is_operator(verified.user, verified.groups, verified.operators):
        listed = ", ".join(verified.operators) or "nobody (fleet.operators is empty)"
        return f"{verified.user} is not an operator of this cluster (operators: {listed})"
    return None


def _is_verified_operator(verified: VerifiedCaller | None) -> bool:
    return verified is not None and verified.ok and is_operator(verified.user, verified.groups, verified.operators)


def note_outcome(
    auth: AuthState, req: OperatorRequest, verified: VerifiedCaller | None, refusal: str | None, now: datetime
) -> AuthState:
    """Record the outcome for the audit; a refusal counts toward the rate limit; a changed operator list is noted."""
    events = list(auth.events)
    seen = auth.operators_seen
    if verified is not None and verified.ok and verified.operators != seen:
        if seen is not None:
            added = sorted(set(verified.operators) - set(seen))
            removed = sorted(set(seen) - set(verified.operators))
            events.append(
                AuthEvent(
                    at=now,
                    user="-",
                    action="operators-changed",
                    allowed=True,
                    detail=f"added: {', '.join(added) or '-'}; removed: {', '.join(removed) or '-'}",
                )
            )
        seen = verified.operators
    who = verified.user if verified is not None and verified.ok else f"claimed:{req.credential.claimed_user}"
    what = req.action.kind.value + (f" {req.action.approval_id}" if req.action.approval_id else "")
    what += f" job {req.action.job_id}" if req.action.job_id else ""
    what += f" {req.action.mode.value}" if req.action.mode is not None else ""
    events.append(AuthEvent(at=now, user=who, action=what, allowed=refusal is None, detail=refusal or ""))
    refusals = _recent_refusals(auth, now)
    if refusal is not None and not _is_verified_operator(verified):
        # Forgery-like (a credential that failed) or a non-operator trying: counted. An operator refused for a
        # stale approval id is not.
        refusals.append((req.credential.claimed_user, now))
    return auth.model_copy(
        update={
            "events": tuple(events[-EVENTS_KEPT:]),
            "refusals": tuple(refusals[-(REFUSALS_TOTAL + 1) :]),
            "operators_seen": seen,
        }
    )
