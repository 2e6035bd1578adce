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

The parts: ``audit_incidents`` (incidents and jobs), ``audit_approvals``, ``goodput``, ``audit_measures``; this
module defines the numbers and folds them into the summary.
"""

from __future__ import annotations

import math
from collections import Counter

from workflows.domain.audit import AuditCollection, AuditSummary, JobGoodput, NodeRow
from workflows.policy.audit_approvals import approval_summary
from workflows.policy.audit_measures import count_rows, latency_stats, seconds_between, utc
from workflows.policy.fleet import MAX_DECIDED_APPROVALS
from workflows.policy.goodput import downtime_s, observed_window

__all__ = ["DEFINITIONS", "TOP_NODES", "UNATTRIBUTED", "summarise"]

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


def summarise(collection: AuditCollection) -> AuditSummary:
    """The report's numbers from what the collect activity read (definitions: the module docstring)."""
    since, until = utc(collection.since), utc(collection.until)
    jobs = sorted(collection.jobs, key=lambda j: (j.job_id, j.workflow_id))
    in_period = [(job, d) for job in jobs for d in job.incidents if since <= d.detected_at < until]

    detection = [seconds_between(d.onset_at, d.detected_at) if d.onset_at is not None else None for _, d in in_period]
    action = [
        seconds_between(d.detected_at, d.restarted_at) if d.restarted_at is not None else None for _, d in in_period
    ]
    resume = [seconds_between(d.detected_at, d.resumed_at) if d.resumed_at is not None else None for _, d in in_period]

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
        observed = seconds_between(start, end)
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
        by_anomaly=count_rows(d.anomaly for _, d in in_period),
        by_cause=count_rows(d.cause or UNATTRIBUTED for _, d in in_period),
        by_failure_class=count_rows(d.failure_class or UNATTRIBUTED for _, d in in_period),
        top_nodes=tuple(NodeRow(node=n, incidents=node_incidents[n], drains=node_drains[n]) for n in top),
        goodput=tuple(goodput),
        cluster_goodput=round(1 - total_down / total_observed, 6) if total_observed > 0 else None,
        approvals=approval_summary(collection.fleet, since, until),
        failures=collection.failures,
        runs_listed=collection.runs_listed,
        runs_skipped=collection.runs_skipped,
        incidents_dropped=collection.incidents_dropped,
    )
