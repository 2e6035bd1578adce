"""The audit's view of incidents: one incident's digest and onset, one job's runs merged, the payload's cap. Pure.

Definitions of the numbers: ``workflows.policy.audit``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from workflows.domain.audit import MAX_SUMMARY_CHARS, IncidentDigest, JobAudit
from workflows.domain.base import Frozen
from workflows.domain.incident import ActionKind, Incident
from workflows.domain.recovery import JobRecoveryStatus
from workflows.policy.audit_measures import utc

__all__ = ["RunRead", "cap_incidents", "digest_incident", "incident_onset", "job_audit"]


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
        action=att.action.value if att is not None and att.action is not None else "",
        action_reason=att.action_reason[:MAX_SUMMARY_CHARS] if att is not None else "",
        requeues=sum(1 for a in incident.actions if a.kind is ActionKind.REQUEUE),
        restarted_at=utc(incident.restarted_at) if incident.restarted_at is not None else None,
        resumed_at=utc(incident.resumed_at) if incident.resumed_at is not None else None,
        outcome=incident.outcome,
    )


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
