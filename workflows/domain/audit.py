"""The Audit workflow's input, what its activities collect and write, and what it answers.

Payloads stay bounded: the collect activity reduces each JobRecovery ``status`` to ``IncidentDigest`` records
(no evidence text, stacks or timelines), at most ``MAX_AUDIT_INCIDENTS`` in all, and the Fleet's approvals to
``ApprovalDigest`` records, at most ``MAX_AUDIT_APPROVALS``, and says how many it left out.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import AwareDatetime, Field, model_validator

from workflows.domain.base import Frozen
from workflows.domain.fleet import ApprovalKind, ApprovalOutcome

#: The longest period one audit covers (older workflows have usually left visibility's retention anyway).
MAX_AUDIT_PERIOD_S = 90 * 24 * 3600.0
#: Incidents carried from the collect activity to the report, newest kept: under 700 bytes each keeps the payload
#: below 1 MB, far from Temporal's 2 MB limit (tests/unit/audit measure it).
MAX_AUDIT_INCIDENTS = 1000
#: JobRecovery runs listed per audit; more are counted and the report says it is truncated.
MAX_AUDIT_WORKFLOWS = 1000
#: Characters of an incident's summary kept in a digest.
MAX_SUMMARY_CHARS = 160
#: Fleet approvals carried to the report, newest kept. The Fleet holds at most 100 decided ones, but every pending
#: one: this bounds the payload however many pile up.
MAX_AUDIT_APPROVALS = 500


class AuditInput(Frozen):
    """One audit: of ``cluster``, over the last ``period_s`` before ``until``, or from ``since`` to ``until``.

    ``until`` defaults to the scheduled start time (a Schedule's runs tile the timeline without gaps) or, on
    demand, the workflow's start. Datetimes must carry a time zone.
    """

    cluster: str = Field(min_length=1)
    period_s: float | None = Field(None, gt=0, le=MAX_AUDIT_PERIOD_S)
    since: AwareDatetime | None = None
    until: AwareDatetime | None = None
    out_dir: str = ""
    """Absolute directory on the worker for the report; empty: the worker's ``audit.report_dir``."""

    @model_validator(mode="after")
    def _one_period(self) -> AuditInput:
        if (self.period_s is None) == (self.since is None):
            raise ValueError("give exactly one of period_s and since")
        if self.since is not None and self.until is not None:
            if self.since >= self.until:
                raise ValueError(f"since ({self.since.isoformat()}) must be before until ({self.until.isoformat()})")
            if (self.until - self.since).total_seconds() > MAX_AUDIT_PERIOD_S:
                raise ValueError(f"an audit covers at most {MAX_AUDIT_PERIOD_S / 86400:.0f} days")
        if self.out_dir and not self.out_dir.startswith("/"):
            raise ValueError(f"out_dir must be an absolute path, not {self.out_dir!r}")
        return self

    def window(self, default_until: datetime) -> tuple[datetime, datetime]:
        """``(since, until)`` of this audit, ``default_until`` standing in for an unset ``until``."""
        until = self.until or default_until
        if self.since is not None:
            return self.since, until
        assert self.period_s is not None  # the validator guarantees one of them
        return until - timedelta(seconds=self.period_s), until


# ----- what the collect activity returns --------------------------------------------------------------------------


class ApprovalDigest(Frozen):
    """One of the Fleet's approvals (``workflows.domain.fleet.Approval``) as it stands when the audit reads it."""

    id: str
    kind: ApprovalKind
    job_id: int
    incident: str = ""
    cause: str = ""
    nodes: tuple[str, ...] = ()
    """Nodes to drain; empty for a restart."""
    requested_at: datetime
    decided_at: datetime | None = None
    """When an operator answered or the deadline expired it; None while pending."""
    outcome: ApprovalOutcome = ApprovalOutcome.PENDING
    decided_by: str = ""
    """The operator; empty when it expired."""
    applied: ApprovalOutcome | None = None
    """What was carried out (an expired approval gets the policy's default)."""


class FleetRead(StrEnum):
    """Whether the audit could read the cluster's Fleet (the approvals' only record)."""

    READ = "read"
    MISSING = "missing"
    """No Fleet workflow with that id: nothing waited for approval on this cluster as far as Temporal knows."""
    UNREADABLE = "unreadable"
    """It exists but its ``status`` did not answer (no worker, a failed replay): its approvals are unknown."""


class FleetApprovals(Frozen):
    """The Fleet's approvals that overlap the period, and how far they can be trusted."""

    workflow_id: str = ""
    read: FleetRead = FleetRead.MISSING
    message: str = ""
    """Why it could not be read."""
    approvals: tuple[ApprovalDigest, ...] = ()
    """Oldest request first."""
    dropped: int = 0
    """Oldest approvals of the period left out past ``MAX_AUDIT_APPROVALS``."""
    history_full: bool = False
    """The Fleet holds as many decided approvals as it keeps, and the oldest of them was decided at or after the
    period's start: decisions of the period it already forgot may be missing."""


class IncidentDigest(Frozen):
    """What the audit needs of one ``Incident``: kinds, blame, the latencies' timestamps. No evidence text."""

    id: str
    number: int
    anomaly: str
    summary: str = ""
    detected_at: datetime
    onset_at: datetime | None = None
    """The earliest timestamp of the failure itself (evidence, GPU event, a hang's last progress), if any."""
    failure_class: str = ""
    cause: str = ""
    """Empty: never attributed."""
    nodes: tuple[str, ...] = ()
    """Nodes the attribution implicated."""
    drained: tuple[str, ...] = ()
    """Nodes Rebound decided to drain for it."""
    action: str = ""
    """The action ladder's rung (``drain``, ``exclude``, ``nothing``); empty: decided before the ladder."""
    action_reason: str = ""
    """Why that rung, naming the evidence."""
    requeues: int = 0
    restarted_at: datetime | None = None
    resumed_at: datetime | None = None
    outcome: str = ""


class JobAudit(Frozen):
    """One monitored job (one JobRecovery workflow id, all its runs) as seen during the period."""

    workflow_id: str
    job_id: int
    job_name: str = ""
    state: str = ""
    """The latest run's recovery state."""
    started_at: datetime
    """Start of its first run listed."""
    closed_at: datetime | None = None
    """Close of its last run; None while it runs."""
    runs: int = 1
    incidents: tuple[IncidentDigest, ...] = ()


class CollectFailure(Frozen):
    """A workflow run the audit could not read; its incidents are missing from the report."""

    workflow_id: str
    run_id: str = ""
    kind: str
    message: str


class AuditCollectInput(Frozen):
    cluster: str
    since: datetime
    until: datetime
    max_workflows: int = Field(MAX_AUDIT_WORKFLOWS, gt=0)
    max_incidents: int = Field(MAX_AUDIT_INCIDENTS, gt=0)


class AuditCollection(Frozen):
    """Every JobRecovery run of the cluster whose lifetime overlaps the period, digested."""

    cluster: str
    since: datetime
    until: datetime
    runs_listed: int = 0
    runs_skipped: int = 0
    """Runs past ``max_workflows``: listed by visibility, never read."""
    incidents_dropped: int = 0
    """Oldest incidents left out past ``max_incidents``."""
    jobs: tuple[JobAudit, ...] = ()
    failures: tuple[CollectFailure, ...] = ()
    fleet: FleetApprovals = FleetApprovals()


# ----- what the pure summary computes -----------------------------------------------------------------------------


class LatencyStats(Frozen):
    """A latency sample: count, p50/p95 (linear interpolation), mean, max, and the values for a histogram."""

    count: int = 0
    unknown: int = 0
    """Incidents for which this latency cannot be computed (a timestamp missing)."""
    p50: float | None = None
    p95: float | None = None
    mean: float | None = None
    max: float | None = None
    values: tuple[float, ...] = ()
    """Sorted, seconds."""


class CountRow(Frozen):
    key: str
    count: int


class NodeRow(Frozen):
    node: str
    incidents: int
    """Incidents in the period that implicated this node."""
    drains: int
    """Incidents in the period for which Rebound drained it."""


class JobGoodput(Frozen):
    """Training time vs. downtime of one job over the part of the period it was monitored."""

    workflow_id: str
    job_id: int
    job_name: str = ""
    state: str = ""
    observed_s: float
    downtime_s: float
    goodput: float | None
    """``1 - downtime_s / observed_s``; None when it was not monitored during the period."""
    incidents: int
    """Incidents detected in the period."""


class ApprovalRow(Frozen):
    """One approval of the period as it stood at the period's end (a later decision is not known yet)."""

    id: str
    kind: ApprovalKind
    job_id: int
    incident: str = ""
    nodes: tuple[str, ...] = ()
    requested_at: datetime
    decided_at: datetime | None = None
    """None: still pending at the end of the period."""
    outcome: ApprovalOutcome
    decided_by: str = ""
    applied: ApprovalOutcome | None = None
    waited_s: float | None = None
    """Requested -> decided; None while pending."""


class ApprovalKindRow(Frozen):
    """Approvals of one kind by their outcome at the end of the period."""

    kind: ApprovalKind
    total: int = 0
    approved: int = 0
    rejected: int = 0
    expired: int = 0
    pending: int = 0


class ApprovalSummary(Frozen):
    """Actions that waited for an operator during the period (definitions: ``workflows.policy.audit``)."""

    fleet_workflow_id: str = ""
    fleet: FleetRead = FleetRead.MISSING
    fleet_message: str = ""
    total: int = 0
    """Approvals requested, decided, or waiting during the period."""
    pending_at_end: int = 0
    by_kind: tuple[ApprovalKindRow, ...] = ()
    wait: LatencyStats = LatencyStats()
    """Requested -> decided, over the approvals decided in the period."""
    deciders: tuple[CountRow, ...] = ()
    """Who decided the approvals decided in the period (``EXPIRED_DECIDER`` for the deadline)."""
    rows: tuple[ApprovalRow, ...] = ()
    dropped: int = 0
    history_full: bool = False


class AuditSummary(Frozen):
    """The report's numbers; every one is defined in ``workflows.policy.audit``."""

    cluster: str
    since: datetime
    until: datetime
    jobs: int = 0
    incidents: int = 0
    """Incidents detected in the period."""
    resumed: int = 0
    unresolved: int = 0
    """Incidents of the period with neither a resume nor an outcome."""
    detection: LatencyStats = LatencyStats()
    action: LatencyStats = LatencyStats()
    resume: LatencyStats = LatencyStats()
    by_anomaly: tuple[CountRow, ...] = ()
    by_cause: tuple[CountRow, ...] = ()
    by_failure_class: tuple[CountRow, ...] = ()
    top_nodes: tuple[NodeRow, ...] = ()
    goodput: tuple[JobGoodput, ...] = ()
    cluster_goodput: float | None = None
    """Time-weighted over all jobs: ``1 - sum(downtime) / sum(observed)``."""
    approvals: ApprovalSummary = ApprovalSummary()
    failures: tuple[CollectFailure, ...] = ()
    runs_listed: int = 0
    runs_skipped: int = 0
    incidents_dropped: int = 0


class AuditWriteInput(Frozen):
    summary: AuditSummary
    out_dir: str = ""


class AuditPaths(Frozen):
    json_path: str
    markdown_path: str
    html_path: str


class AuditResult(Frozen):
    """What the Audit workflow returns: where the report is, and its headline numbers."""

    cluster: str
    since: datetime
    until: datetime
    paths: AuditPaths
    jobs: int
    incidents: int
    cluster_goodput: float | None = None
    detection_p50_s: float | None = None
    detection_p95_s: float | None = None
    action_p50_s: float | None = None
    action_p95_s: float | None = None
    approvals_waited: int = 0
    approvals_pending: int = 0
    """Still waiting for an operator at the end of the period."""
    unreadable_runs: int = 0

    def headline(self) -> str:
        """One line for a terminal or a workflow summary."""

        def secs(p50: float | None, p95: float | None) -> str:
            return "-" if p50 is None or p95 is None else f"p50 {p50:.1f} s / p95 {p95:.1f} s"

        goodput = "-" if self.cluster_goodput is None else f"{100 * self.cluster_goodput:.1f} %"
        text = (
            f"{self.cluster} {self.since:%Y-%m-%d %H:%M} .. {self.until:%Y-%m-%d %H:%M} UTC: {self.jobs} job(s), "
            f"{self.incidents} incident(s), goodput {goodput}, detection "
            f"{secs(self.detection_p50_s, self.detection_p95_s)}, recovery action "
            f"{secs(self.action_p50_s, self.action_p95_s)}, {self.approvals_waited} action(s) waited for approval"
        )
        if self.approvals_pending:
            text += f" ({self.approvals_pending} still pending)"
        if self.unreadable_runs:
            text += f"; {self.unreadable_runs} workflow run(s) unreadable"
        return text
