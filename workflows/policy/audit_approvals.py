"""The audit's view of the Fleet's approvals: those of a period, each as it stood at the period's end, and their
summary (counts by kind and outcome, wait, deciders). Pure. Definitions: ``workflows.policy.audit``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from workflows.domain.audit import (
    MAX_AUDIT_APPROVALS,
    ApprovalDigest,
    ApprovalKindRow,
    ApprovalRow,
    ApprovalSummary,
    FleetApprovals,
    FleetRead,
)
from workflows.domain.fleet import Approval, ApprovalKind, ApprovalOutcome
from workflows.policy.audit_measures import count_rows, latency_stats, seconds_between, utc
from workflows.policy.fleet import MAX_DECIDED_APPROVALS

__all__ = ["EXPIRED_DECIDER", "approval_summary", "fleet_approvals"]

#: Who decided an approval that expired, in "decided by".
EXPIRED_DECIDER = "nobody (expired)"


def _digest_approval(a: Approval) -> ApprovalDigest:
    return ApprovalDigest(
        id=a.id,
        kind=a.kind,
        job_id=a.request.job_id,
        incident=a.request.incident,
        cause=a.request.cause,
        nodes=a.nodes,
        requested_at=utc(a.requested_at),
        decided_at=utc(a.decided_at) if a.decided_at is not None else None,
        outcome=a.outcome,
        decided_by=a.decided_by,
        applied=a.applied,
    )


def fleet_approvals(
    workflow_id: str,
    approvals: Sequence[Approval],
    since: datetime,
    until: datetime,
    limit: int = MAX_AUDIT_APPROVALS,
) -> FleetApprovals:
    """The approvals of a Fleet's state that overlap ``[since, until)``, newest ``limit`` kept (module docstring).

    Raises:
        ValueError: ``limit`` < 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be positive, not {limit}")
    start, end = utc(since), utc(until)
    decided = [
        utc(a.decided_at) for a in approvals if a.outcome is not ApprovalOutcome.PENDING and a.decided_at is not None
    ]
    # The Fleet forgets its oldest decided approvals past its bound: only then can a decision of the period be gone.
    full = len(decided) >= MAX_DECIDED_APPROVALS and min(decided) >= start
    kept = sorted(
        (
            _digest_approval(a)
            for a in approvals
            if utc(a.requested_at) < end and (a.decided_at is None or utc(a.decided_at) >= start)
        ),
        key=lambda d: (d.requested_at, d.id),
    )
    dropped = max(len(kept) - limit, 0)
    return FleetApprovals(
        workflow_id=workflow_id,
        read=FleetRead.READ,
        approvals=tuple(kept[dropped:]),
        dropped=dropped,
        history_full=full,
    )


def _row_at_end(a: ApprovalDigest, until: datetime) -> ApprovalRow:
    """``a`` as it stood at ``until``: a decision after it is not known yet."""
    decided_at = utc(a.decided_at) if a.decided_at is not None and a.outcome is not ApprovalOutcome.PENDING else None
    if decided_at is not None and decided_at >= until:
        decided_at = None  # decided after the period: pending as far as this report goes
    done = decided_at is not None
    return ApprovalRow(
        id=a.id,
        kind=a.kind,
        job_id=a.job_id,
        incident=a.incident,
        nodes=a.nodes,
        requested_at=utc(a.requested_at),
        decided_at=decided_at,
        outcome=a.outcome if done else ApprovalOutcome.PENDING,
        decided_by=a.decided_by if done else "",
        applied=a.applied if done else None,
        waited_s=round(seconds_between(a.requested_at, decided_at), 3) if decided_at is not None else None,
    )


def approval_summary(fleet: FleetApprovals, since: datetime, until: datetime) -> ApprovalSummary:
    """Counts by kind and outcome, wait, deciders and pending of the period's approvals (module docstring)."""
    start, end = utc(since), utc(until)
    rows = tuple(
        _row_at_end(a, end)
        for a in sorted(fleet.approvals, key=lambda a: (utc(a.requested_at), a.id))
        if utc(a.requested_at) < end and (a.decided_at is None or utc(a.decided_at) >= start)
    )
    decided = [r for r in rows if r.decided_at is not None]
    by_kind: list[ApprovalKindRow] = []
    for kind in ApprovalKind:
        outcomes = Counter(r.outcome for r in rows if r.kind is kind)
        if outcomes:
            by_kind.append(
                ApprovalKindRow(
                    kind=kind,
                    total=outcomes.total(),
                    approved=outcomes[ApprovalOutcome.APPROVED],
                    rejected=outcomes[ApprovalOutcome.REJECTED],
                    expired=outcomes[ApprovalOutcome.EXPIRED],
                    pending=outcomes[ApprovalOutcome.PENDING],
                )
            )
    return ApprovalSummary(
        fleet_workflow_id=fleet.workflow_id,
        fleet=fleet.read,
        fleet_message=fleet.message,
        total=len(rows),
        pending_at_end=sum(1 for r in rows if r.outcome is ApprovalOutcome.PENDING),
        by_kind=tuple(by_kind),
        wait=latency_stats([r.waited_s for r in decided]),
        deciders=count_rows(
            EXPIRED_DECIDER if r.outcome is ApprovalOutcome.EXPIRED else (r.decided_by or "unknown") for r in decided
        ),
        rows=rows,
        dropped=fleet.dropped,
        history_full=fleet.history_full,
    )
