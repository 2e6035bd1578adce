"""The audit report's values and sentences that the Markdown and the HTML renderings share (plain text: each
renderer escapes it). Pure."""

from __future__ import annotations

from datetime import datetime

from workflows.domain.audit import ApprovalRow, ApprovalSummary, AuditSummary, FleetRead
from workflows.domain.fleet import ApprovalOutcome
from workflows.policy.audit_measures import utc
from workflows.policy.fleet import MAX_DECIDED_APPROVALS

__all__ = ["approval_nodes", "approval_outcome", "approvals_line", "coverage_lines", "percent", "secs", "when"]


def when(t: datetime) -> str:
    """A time for people, in UTC to the second."""
    return f"{utc(t):%Y-%m-%d %H:%M:%S}"


def percent(value: float | None) -> str:
    """A fraction as a percentage; ``-`` when unknown."""
    return "-" if value is None else f"{100 * value:.2f} %"


def secs(value: float | None) -> str:
    """Seconds to a tenth; ``-`` when unknown."""
    return "-" if value is None else f"{value:.1f} s"


def approval_nodes(r: ApprovalRow) -> str:
    """What an approval is about: its nodes, or the job's restart."""
    return ", ".join(r.nodes) if r.nodes else f"restart of job {r.job_id}"


def approval_outcome(r: ApprovalRow) -> str:
    """The outcome at the end of the period; an expired one with what its default did."""
    if r.outcome is ApprovalOutcome.EXPIRED and r.applied is not None:
        return f"expired ({r.applied.value})"
    return r.outcome.value


def approvals_line(a: ApprovalSummary) -> str:
    """The approvals' headline sentence."""
    text = f"{a.total} action(s) waited for approval, {a.pending_at_end} still pending at the end of the period."
    if a.wait.count:
        text += f" Wait of the {a.wait.count} decided in the period: p50 {secs(a.wait.p50)}, max {secs(a.wait.max)}."
    if a.fleet is not FleetRead.READ:
        text += " Approvals were not read (see Coverage)."
    return text


def coverage_lines(s: AuditSummary) -> list[str]:
    """What the report may be missing, as plain lines (each renderer escapes them)."""
    out = [f"{s.runs_listed} JobRecovery run(s) listed, {len(s.failures)} unreadable, {s.runs_skipped} not read."]
    if s.incidents_dropped:
        out.append(f"{s.incidents_dropped} older incident(s) left out to keep the report bounded.")
    out += [f"unreadable: {f.workflow_id} run {f.run_id}: {f.kind}: {f.message}" for f in s.failures]
    a = s.approvals
    if a.fleet is FleetRead.MISSING:
        where = f" ({a.fleet_workflow_id} not found)" if a.fleet_workflow_id else ""
        out.append(f"no Fleet{where}: approvals not read, 0 reported.")
    elif a.fleet is FleetRead.UNREADABLE:
        out.append(f"Fleet {a.fleet_workflow_id} unreadable: {a.fleet_message}: approvals not read, 0 reported.")
    else:
        out.append(f"Fleet {a.fleet_workflow_id} read: {a.total} approval(s) of the period.")
    if a.dropped:
        out.append(f"{a.dropped} older approval(s) left out to keep the report bounded.")
    if a.history_full:
        out.append(
            f"The Fleet keeps only its {MAX_DECIDED_APPROVALS} most recent decided approvals, and the oldest it "
            "still holds was decided in or after this period: earlier decisions of the period may be missing."
        )
    return out
