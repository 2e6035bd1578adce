"""The audit's numbers, from JobRecovery statuses to the report's summary. Pure: no I/O, no clocks, no Temporal.

Definitions (the report repeats them):

- **Incidents of the period**: incidents whose ``detected_at`` lies in ``[since, until)``. Counts, categories,
  latencies and implicated nodes are over these.
- **Detection latency** = ``detected_at - onset``, where onset is the earliest timestamp of the failure itself that
  is not after detection: a hang's last progress (``detected_at - silent_for_s``), else the earliest ``at`` of the
  anomaly's or attribution's evidence and of its GPU events. Evidence lines without their own timestamp carry the
  time Rebound read them, so the latency is a lower bound for those. No onset: counted as unknown.
- **Recovery-action latency** = ``restarted_at - detected_at`` (the last recovery action verified by Slurm).
- **Resume latency** = ``resumed_at - detected_at`` (the restarted job logged a training step).
- **Goodput** of a job = ``1 - downtime / observed``. *Observed* is the part of the period the job's JobRecovery
  workflow ran (first run's start to last run's close, clipped to the period): queue time counts as up. *Downtime*
  is the union, clipped to the observed window, of one interval per incident: from ``detected_at`` to its
  ``resumed_at``; an incident that never resumed lasts until the job's next incident is detected, else to the
  end of the observed window (the job gave up, was cancelled, or is still down). Straggler incidents with no
  requeue add nothing: the job kept training, only slower. The cluster figure weights jobs by observed time.
- **Actions that waited for approval**: the Fleet's approvals (drains and restarts held for an operator) that were
  requested, decided or still waiting during the period: ``requested_at < until`` and not decided before
  ``since``. Each is taken as it stood at ``until``: one decided later counts as pending at the end. Wait =
  ``decided_at - requested_at`` over the approvals decided in the period (an expiry is a decision: the deadline
  answered). The Fleet is the approvals' only record and keeps its ``MAX_DECIDED_APPROVALS`` most recent decided
  ones: older decisions are gone, and the report says when that may cut into the period.

Percentiles interpolate linearly between closest ranks (numpy's default), as ``rebound bench`` does.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from workflows.domain.audit import (
    MAX_AUDIT_APPROVALS,
    MAX_SUMMARY_CHARS,
    ApprovalDigest,
    ApprovalKindRow,
    ApprovalRow,
    ApprovalSummary,
    AuditCollection,
    AuditSummary,
    CountRow,
    FleetApprovals,
    FleetRead,
    IncidentDigest,
    JobAudit,
    JobGoodput,
    LatencyStats,
    NodeRow,
)
from workflows.domain.base import Frozen
from workflows.domain.fleet import Approval, ApprovalKind, ApprovalOutcome
from workflows.domain.incident import ActionKind, AnomalyKind, Incident
from workflows.domain.recovery import JobRecoveryStatus
from workflows.policy.fleet import MAX_DECIDED_APPROVALS
from workflows.policy.stats import percentile

__all__ = [
    "DEFINITIONS",
    "EXPIRED_DECIDER",
    "RunRead",
    "approval_summary",
    "cap_incidents",
    "digest_incident",
    "downtime_s",
    "fleet_approvals",
    "histogram",
    "incident_onset",
    "job_audit",
    "latency_stats",
    "percentile",
    "summarise",
    "utc",
]

#: Nodes listed in "top implicated nodes".
TOP_NODES = 10
#: The report's definitions of its numbers, printed in every report (keep in step with the module docstring).
DEFINITIONS: dict[str, str] = {
    "incidents of the period": "incidents whose detection time lies in the period; counts, categories, "
    "latencies and nodes are over these.",
    "detection latency": "detection time minus the failure's onset: a hang's last progress, else the earliest "
    "timestamp of the incident's evidence or GPU events. Evidence lines without a timestamp carry the time "
    "Rebound read them, so this is a lower bound for them; no onset known: counted as unknown.",
    "recovery-action latency": "time from detection until the last recovery action (drain, requeue) was "
    "verified by Slurm.",
    "resume latency": "time from detection until the restarted job logged a training step.",
    "goodput": "per job, 1 - downtime / monitored time. Monitored time: the part of the period its JobRecovery "
    "workflow ran (queue time counts as up). Downtime: the union of one interval per incident, from detection to "
    "the job's resume; an incident that never resumed lasts until the job's next incident, else to the end of the "
    "monitored time. Straggler reports without a restart add none. The cluster figure weights jobs by monitored "
    "time.",
    "actions that waited for approval": "the Fleet's approvals (drains and restarts held for an operator) "
    "requested before the end of the period and not decided before its start, each as it stood at the end of the "
    "period (decided later: pending). Waited = requested until approved, rejected or expired, over those decided "
    f"in the period. The Fleet keeps only its {MAX_DECIDED_APPROVALS} most recent decided approvals; without a "
    "Fleet, 0.",
    "percentiles": "linear interpolation between closest ranks (numpy's default).",
}
#: Key of incidents never attributed, in "incidents by cause".
UNATTRIBUTED = "unattributed"
#: Who decided an approval that expired, in "decided by".
EXPIRED_DECIDER = "nobody (expired)"


def utc(t: datetime) -> datetime:
    """``t`` as an aware UTC datetime (naive times are taken as UTC, as everywhere in Rebound)."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _secs(start: datetime, end: datetime) -> float:
    return (utc(end) - utc(start)).total_seconds()


# ----- statistics -----------------------------------------------------------------------------------------------


def latency_stats(values: Sequence[float | None]) -> LatencyStats:
    """Count, p50, p95, mean and max of the known values (rounded to ms); ``None`` values count as unknown."""
    known = sorted(round(v, 3) for v in values if v is not None and math.isfinite(v))
    unknown = len(values) - len(known)
    if not known:
        return LatencyStats(unknown=unknown)
    return LatencyStats(
        count=len(known),
        unknown=unknown,
        p50=round(percentile(known, 50), 3),
        p95=round(percentile(known, 95), 3),
        mean=round(math.fsum(known) / len(known), 3),
        max=known[-1],
        values=tuple(known),
    )


def histogram(values: Sequence[float], bins: int = 12) -> tuple[tuple[float, float, int], ...]:
    """``(low, high, count)`` bins of equal width from 0 to the largest value; the last bin includes its top.

    Latencies are never negative, so bars start at 0 and the charts of two reports compare by eye. Empty input:
    no bins; all zeros: one bin ``(0, 0, n)``.

    Raises:
        ValueError: ``bins`` < 1 or a negative value.
    """
    if bins < 1:
        raise ValueError(f"need at least one bin, not {bins}")
    if not values:
        return ()
    if min(values) < 0:
        raise ValueError(f"latencies cannot be negative: {min(values)}")
    top = max(values)
    if top == 0:
        return ((0.0, 0.0, len(values)),)
    width = top / bins
    counts = [0] * bins
    for v in values:
        counts[min(int(v / width), bins - 1)] += 1
    return tuple((i * width, (i + 1) * width, counts[i]) for i in range(bins))


# ----- one incident ---------------------------------------------------------------------------------------------


def incident_onset(incident: Incident) -> datetime | None:
    """When the failure itself happened, as far as the incident's own records tell; None when they do not."""
    detected = utc(incident.detected_at)
    if incident.hang is not None and incident.hang.silent_for_s is not None:
        return detected - timedelta(seconds=incident.hang.silent_for_s)
    stamps = [ev.at for ev in incident.anomaly.evidence]
    stamps += [ev.observed_at for ev in incident.anomaly.gpu_events]
    if incident.attribution is not None:
        stamps += [ev.at for ev in incident.attribution.evidence]
    known = [utc(t) for t in stamps if t is not None and utc(t) <= detected]
    return min(known, default=None)


def digest_incident(incident: Incident) -> IncidentDigest:
    """The audit's view of one incident: no evidence text, no stacks; times in UTC."""
    att = incident.attribution
    return IncidentDigest(
        id=incident.id,
        number=incident.number,
        anomaly=incident.anomaly.kind.value,
        summary=incident.anomaly.summary[:MAX_SUMMARY_CHARS],
        detected_at=utc(incident.detected_at),
        onset_at=incident_onset(incident),
        failure_class=att.failure_class.value if att is not None else "",
        cause=att.cause if att is not None else "",
        nodes=att.implicated_nodes if att is not None else (),
        drained=tuple(dict.fromkeys(a.target for a in incident.actions if a.kind is ActionKind.DRAIN)),
        requeues=sum(1 for a in incident.actions if a.kind is ActionKind.REQUEUE),
        restarted_at=utc(incident.restarted_at) if incident.restarted_at is not None else None,
        resumed_at=utc(incident.resumed_at) if incident.resumed_at is not None else None,
        outcome=incident.outcome,
    )


# ----- one job: its runs merged ---------------------------------------------------------------------------------


class RunRead(Frozen):
    """One JobRecovery run as listed by visibility, with its ``status`` (None when it could not be read)."""

    workflow_id: str
    run_id: str
    started_at: datetime
    closed_at: datetime | None = None
    status: JobRecoveryStatus | None = None


def job_audit(runs: Sequence[RunRead], since: datetime, until: datetime) -> JobAudit | None:
    """Merge the runs of one workflow id (continue-as-new carries recent incidents into the next run, so the
    same incident appears in several: the latest run's copy wins) and keep the incidents that overlap the period.

    Returns None when no run could be read. Raises ValueError for runs of different workflow ids.
    """
    if len({r.workflow_id for r in runs}) > 1:
        raise ValueError("job_audit merges the runs of one workflow id")
    ordered = sorted(runs, key=lambda r: (utc(r.started_at), r.run_id))
    read = [r for r in ordered if r.status is not None]
    if not read:
        return None
    incidents: dict[str, Incident] = {}
    for run in read:
        assert run.status is not None
        for inc in run.status.incidents:
            incidents[inc.id] = inc
    start, end = utc(since), utc(until)
    kept = [
        digest_incident(inc)
        for inc in incidents.values()
        if utc(inc.detected_at) < end and (inc.resumed_at is None or utc(inc.resumed_at) >= start)
    ]
    kept.sort(key=lambda d: (d.detected_at, d.number))
    latest = read[-1].status
    assert latest is not None
    closed = [r.closed_at for r in ordered]
    return JobAudit(
        workflow_id=ordered[0].workflow_id,
        job_id=latest.job_id,
        job_name=latest.job_name,
        state=latest.state.value,
        started_at=utc(ordered[0].started_at),
        closed_at=None if any(c is None for c in closed) else max(utc(c) for c in closed if c is not None),
        runs=len(ordered),
        incidents=tuple(kept),
    )


def cap_incidents(jobs: Sequence[JobAudit], limit: int) -> tuple[tuple[JobAudit, ...], int]:
    """Keep the ``limit`` newest incidents over all jobs (the payload stays bounded); returns the jobs and how
    many incidents were dropped."""
    everything = sorted(
        ((d.detected_at, job.workflow_id, d.number) for job in jobs for d in job.incidents), reverse=True
    )
    if len(everything) <= limit:
        return tuple(jobs), 0
    keep = {(wf, n) for _, wf, n in everything[:limit]}
    capped = tuple(
        job.model_copy(update={"incidents": tuple(d for d in job.incidents if (job.workflow_id, d.number) in keep)})
        for job in jobs
    )
    return capped, len(everything) - limit


# ----- approvals (read from the Fleet) ----------------------------------------------------------------------------


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
        waited_s=round(_secs(a.requested_at, decided_at), 3) if decided_at is not None else None,
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
        deciders=_counts(
            EXPIRED_DECIDER if r.outcome is ApprovalOutcome.EXPIRED else (r.decided_by or "unknown") for r in decided
        ),
        rows=rows,
        dropped=fleet.dropped,
        history_full=fleet.history_full,
    )


# ----- goodput --------------------------------------------------------------------------------------------------


def _is_report_only(d: IncidentDigest) -> bool:
    return d.anomaly == AnomalyKind.STRAGGLER.value and d.requeues == 0


def observed_window(job: JobAudit, since: datetime, until: datetime) -> tuple[datetime, datetime]:
    """The part of ``[since, until)`` the job was monitored (start may equal end)."""
    start = max(utc(since), job.started_at)
    end = min(utc(until), job.closed_at) if job.closed_at is not None else utc(until)
    return start, max(start, end)


def downtime_s(job: JobAudit, since: datetime, until: datetime) -> float:
    """Seconds of the job's observed window it spent between a detection and the resume (module docstring)."""
    start, end = observed_window(job, since, until)
    down = [d for d in sorted(job.incidents, key=lambda d: (d.detected_at, d.number)) if not _is_report_only(d)]
    intervals: list[tuple[datetime, datetime]] = []
    for i, d in enumerate(down):
        stop = d.resumed_at
        if stop is None:
            stop = down[i + 1].detected_at if i + 1 < len(down) else end
        lo, hi = max(d.detected_at, start), min(stop, end)
        if hi > lo:
            intervals.append((lo, hi))
    total = 0.0
    cur_lo: datetime | None = None
    cur_hi: datetime | None = None
    for lo, hi in sorted(intervals):
        if cur_hi is None or lo > cur_hi:
            if cur_lo is not None and cur_hi is not None:
                total += _secs(cur_lo, cur_hi)
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_lo is not None and cur_hi is not None:
        total += _secs(cur_lo, cur_hi)
    return total


# ----- the summary ----------------------------------------------------------------------------------------------


def _counts(keys: Iterable[str]) -> tuple[CountRow, ...]:
    counted = Counter(keys)
    return tuple(CountRow(key=k, count=n) for k, n in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0])))


def summarise(collection: AuditCollection) -> AuditSummary:
    """The report's numbers from what the collect activity read (definitions: the module docstring)."""
    since, until = utc(collection.since), utc(collection.until)
    jobs = sorted(collection.jobs, key=lambda j: (j.job_id, j.workflow_id))
    in_period = [(job, d) for job in jobs for d in job.incidents if since <= d.detected_at < until]

    detection = [_secs(d.onset_at, d.detected_at) if d.onset_at is not None else None for _, d in in_period]
    action = [_secs(d.detected_at, d.restarted_at) if d.restarted_at is not None else None for _, d in in_period]
    resume = [_secs(d.detected_at, d.resumed_at) if d.resumed_at is not None else None for _, d in in_period]

    node_incidents: Counter[str] = Counter()
    node_drains: Counter[str] = Counter()
    for _, d in in_period:
        node_incidents.update(set(d.nodes))
        node_drains.update(set(d.drained))
    ranked = sorted(set(node_incidents) | set(node_drains), key=lambda n: (-node_incidents[n], -node_drains[n], n))
    top = ranked[:TOP_NODES]

    goodput: list[JobGoodput] = []
    for job in jobs:
        start, end = observed_window(job, since, until)
        observed = _secs(start, end)
        down = downtime_s(job, since, until)
        goodput.append(
            JobGoodput(
                workflow_id=job.workflow_id,
                job_id=job.job_id,
                job_name=job.job_name,
                state=job.state,
                observed_s=round(observed, 3),
                downtime_s=round(down, 3),
                goodput=round(1 - down / observed, 6) if observed > 0 else None,
                incidents=sum(1 for d in job.incidents if since <= d.detected_at < until),
            )
        )
    total_observed = math.fsum(g.observed_s for g in goodput)
    total_down = math.fsum(g.downtime_s for g in goodput)

    return AuditSummary(
        cluster=collection.cluster,
        since=since,
        until=until,
        jobs=len(jobs),
        incidents=len(in_period),
        resumed=sum(1 for _, d in in_period if d.resumed_at is not None),
        unresolved=sum(1 for _, d in in_period if d.resumed_at is None and not d.outcome),
        detection=latency_stats(detection),
        action=latency_stats(action),
        resume=latency_stats(resume),
        by_anomaly=_counts(d.anomaly for _, d in in_period),
        by_cause=_counts(d.cause or UNATTRIBUTED for _, d in in_period),
        by_failure_class=_counts(d.failure_class or UNATTRIBUTED for _, d in in_period),
        top_nodes=tuple(NodeRow(node=n, incidents=node_incidents[n], drains=node_drains[n]) for n in top),
        goodput=tuple(goodput),
        cluster_goodput=round(1 - total_down / total_observed, 6) if total_observed > 0 else None,
        approvals=approval_summary(collection.fleet, since, until),
        failures=collection.failures,
        runs_listed=collection.runs_listed,
        runs_skipped=collection.runs_skipped,
        incidents_dropped=collection.incidents_dropped,
    )
