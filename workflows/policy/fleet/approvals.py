"""The Fleet's approvals: actions held for an operator, opened once per (request, kind), answered by an
operator the policy allows, or expired to the policy's default; pending ones are never dropped. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from workflows.domain.fleet import (
    Approval,
    ApprovalAnswer,
    ApprovalKind,
    ApprovalOutcome,
    FleetPolicy,
    FleetState,
    IsolationRequest,
)
from workflows.domain.notify import Notification, NotificationKind, NotifyField, Severity
from workflows.domain.progress import aware
from workflows.policy.fleet.breaker import BREAKER_HOLD
from workflows.policy.fleet.common import age_s, span, unique

__all__ = [
    "approval_refusal",
    "MAX_DECIDED_APPROVALS",
    "answer_approval",
    "approval_notification",
    "expire_approvals",
    "held_by_breaker",
    "open_approval",
    "storm_announced",
]

MAX_DECIDED_APPROVALS = 100


def _bounded_approvals(approvals: Iterable[Approval]) -> tuple[Approval, ...]:
    """Every pending approval, and the most recent ``MAX_DECIDED_APPROVALS`` decided ones, order kept.

    A decided approval the workflow has not carried out yet is never dropped: its answer (a drain, a restart
    reply the job waits for) must still happen, even when a burst of expiries decides more than the bound at once.
    """
    items = list(approvals)
    decided = [i for i, a in enumerate(items) if a.outcome is not ApprovalOutcome.PENDING]
    excess = len(decided) - MAX_DECIDED_APPROVALS
    drop = set([i for i in decided if items[i].carried_out][: max(excess, 0)])
    return tuple(a for i, a in enumerate(items) if i not in drop)


def open_approval(
    state: FleetState,
    kind: ApprovalKind,
    req: IsolationRequest,
    nodes: Sequence[str],
    reasons: Sequence[str],
    policy: FleetPolicy,
    now: datetime,
) -> tuple[FleetState, Approval]:
    """A new pending approval ``a-<n>`` with its deadline; the one already pending for (request, kind) if any,
    so a repeated request never asks the operator twice."""
    for existing in state.approvals:
        if (
            existing.outcome is ApprovalOutcome.PENDING
            and existing.kind is kind
            and existing.request.request_id == req.request_id
        ):
            return state, existing
    approval = Approval(
        id=f"a-{state.next_approval}",
        kind=kind,
        request=req,
        nodes=tuple(unique(nodes)),
        reasons=tuple(reasons),
        requested_at=now,
        deadline=now + timedelta(seconds=policy.approval_timeout_s),
    )
    new = state.model_copy(
        update={
            "approvals": _bounded_approvals((*state.approvals, approval)),
            "next_approval": state.next_approval + 1,
        }
    )
    return new, approval


def _find_approval(state: FleetState, approval_id: str) -> Approval | None:
    return next((a for a in state.approvals if a.id == approval_id), None)


def approval_refusal(state: FleetState, approval_id: str) -> str | None:
    """Why no answer can be given to this approval (unknown, or no longer pending), or None."""
    approval = _find_approval(state, approval_id.strip())
    if approval is None:
        pending = [a.id for a in state.approvals if a.outcome is ApprovalOutcome.PENDING]
        return f"unknown approval id {approval_id!r} (pending: {', '.join(pending) or 'none'})"
    if approval.outcome is not ApprovalOutcome.PENDING:
        by = f" by {approval.decided_by}" if approval.decided_by else ""
        return f"approval {approval.id} is not pending: already {approval.outcome.value}{by}"
    return None


def answer_approval(state: FleetState, answer: ApprovalAnswer, now: datetime) -> FleetState:
    """Apply an operator's answer; an answer to an unknown or decided approval changes nothing (validated first)."""
    approval = _find_approval(state, answer.approval_id.strip())
    if approval is None or approval.outcome is not ApprovalOutcome.PENDING:
        return state
    outcome = ApprovalOutcome.APPROVED if answer.approve else ApprovalOutcome.REJECTED
    decided = approval.model_copy(
        update={
            "outcome": outcome,
            "decided_by": answer.operator.strip(),
            "decided_at": now,
            "note": answer.note,
            "applied": outcome,
        }
    )
    approvals = (decided if a.id == approval.id else a for a in state.approvals)
    return state.model_copy(update={"approvals": _bounded_approvals(approvals)})


def expire_approvals(state: FleetState, policy: FleetPolicy, now: datetime) -> tuple[FleetState, list[Approval]]:
    """Pending approvals past their deadline become EXPIRED with the policy's default applied.

    A default other than ``approved`` applies as ``rejected``: only an explicit choice may let Rebound act alone.
    """
    applied = (
        ApprovalOutcome.APPROVED if policy.approval_default is ApprovalOutcome.APPROVED else ApprovalOutcome.REJECTED
    )
    expired: list[Approval] = []
    approvals: list[Approval] = []
    for a in state.approvals:
        if a.outcome is ApprovalOutcome.PENDING and aware(now) >= aware(a.deadline):
            a = a.model_copy(
                update={
                    "outcome": ApprovalOutcome.EXPIRED,
                    "decided_at": now,
                    "applied": applied,
                    "note": f"no answer within {span(age_s(a.deadline, a.requested_at))}: {applied.value} by default",
                }
            )
            expired.append(a)
        approvals.append(a)
    if not expired:
        return state, []
    return state.model_copy(update={"approvals": _bounded_approvals(approvals)}), expired


def held_by_breaker(approval: Approval) -> bool:
    """A drain approval opened because the breaker's cap was reached (not because a rule wants an operator)."""
    return approval.kind is ApprovalKind.DRAIN and any(BREAKER_HOLD in r for r in approval.reasons)


def storm_announced(state: FleetState, approval: Approval) -> Approval | None:
    """The pending breaker approval that already told people about this drain storm, if ``approval`` is one more
    drain the breaker holds; None when ``approval`` must be announced.

    A storm (a bad rack, a driver push) implicates many nodes through many jobs, each job's request held by the
    breaker in its own approval: one page per job would bury the operator when one decision is needed. The first
    held drain is announced (saying that later ones are not, and where to see them: ``rebound nodes``); the
    others wait in ``rebound nodes`` under the same deadline rule, until that approval is answered or expires.
    """
    if not held_by_breaker(approval):
        return None
    return next(
        (
            a
            for a in state.approvals
            if a.id != approval.id and a.outcome is ApprovalOutcome.PENDING and held_by_breaker(a)
        ),
        None,
    )


def approval_notification(approval: Approval, cluster: str, policy: FleetPolicy, fleet_id: str) -> Notification:
    """What tells people that an action waits for them (``rebound approve|reject`` before the deadline)."""
    what = ", ".join(approval.nodes) or f"restart of job {approval.request.job_id}"
    storm = (
        "\nThe breaker is open: further drains it holds while this approval is pending are not announced one by "
        "one; `rebound nodes` lists them."
        if held_by_breaker(approval)
        else ""
    )
    return Notification(
        kind=NotificationKind.APPROVAL_NEEDED,
        job_id=approval.request.job_id,
        cluster=cluster,
        title=f"Approval {approval.id}: {approval.kind.value} {what}"[:300],
        text="; ".join(approval.reasons)[:1500]
        + f"\n`rebound approve {approval.id}` or `rebound reject {approval.id}` before "
        f"{approval.deadline:%H:%M:%S} UTC (then: {policy.approval_default.value})" + storm,
        severity=Severity.WARNING,
        fields=(NotifyField(key="cause", value=approval.request.cause),),
        idempotency_key=f"{fleet_id}/approval/{approval.id}",
    )
