"""Goodput of one job over a period: the part of the period it was monitored, and its downtime in it. Pure.

Definitions: ``workflows.policy.audit`` (goodput).
"""

from __future__ import annotations

from datetime import datetime

from workflows.domain.audit import IncidentDigest, JobAudit
from workflows.domain.incident import AnomalyKind
from workflows.policy.audit_measures import seconds_between, utc

__all__ = ["downtime_s", "observed_window"]


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
                total += seconds_between(cur_lo, cur_hi)
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_lo is not None and cur_hi is not None:
        total += seconds_between(cur_lo, cur_hi)
    return total
