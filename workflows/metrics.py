"""Rebound's own metrics, recorded from workflows through ``workflow.metric_meter()``.

Replay safety: the workflow meter records only while the workflow executes for the first time; replays (cache
eviction, worker restart) record nothing, so a counter counts each incident once however often its history is
replayed. The values go out through the worker's Temporal runtime, the same exporter as the Temporal SDK metrics
(Prometheus endpoint or OTLP, see ``workers/telemetry.py``), with ``namespace``, ``task_queue`` and
``workflow_type`` added by the meter.

Label values are kept bounded on purpose (kinds, causes, nodes): never a job id, which would make one series per job.
"""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow

from workflows.domain.incident import Anomaly, Incident

DETECTION_LATENCY = "rebound_detection_latency_seconds"
RECOVERY_ACTION_LATENCY = "rebound_recovery_action_latency_seconds"
INCIDENTS = "rebound_incidents_total"
DRAINS = "rebound_drains_total"
RESTARTS = "rebound_restarts_total"
BREAKER_OPEN = "rebound_breaker_open"
APPROVALS_PENDING = "rebound_approvals_pending"

#: Every metric name Rebound emits itself (the dashboard test checks its queries against these).
REBOUND_METRICS = (
    DETECTION_LATENCY,
    RECOVERY_ACTION_LATENCY,
    INCIDENTS,
    DRAINS,
    RESTARTS,
    BREAKER_OPEN,
    APPROVALS_PENDING,
)

#: Bucket bounds in seconds. Temporal's default buckets are for milliseconds-scale SDK latencies; detection takes
#: seconds to minutes (a hang window), a recovery action seconds to tens of minutes (drain, requeue, backoff).
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    DETECTION_LATENCY: (0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1200, 3600),
    RECOVERY_ACTION_LATENCY: (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600),
}


def detection_latency_s(anomaly: Anomaly, detected_at: datetime) -> float:
    """Seconds from the earliest moment the evidence dates the failure to ``detected_at`` (never negative).

    The earliest of the anomaly's observation, its evidence's and its GPU events' timestamps: a log line or an XID
    that says when the failure happened dates it better than when the watch noticed it.
    """
    candidates = [anomaly.observed_at, *(e.at for e in anomaly.evidence), *(g.observed_at for g in anomaly.gpu_events)]
    # A naive timestamp cannot be compared with an aware one: it is skipped rather than failing the workflow task.
    aware = detected_at.tzinfo is not None
    times = [t for t in candidates if t is not None and (t.tzinfo is not None) == aware]
    if not times:
        return 0.0
    return max(0.0, (detected_at - min(times)).total_seconds())


def record_detection(anomaly: Anomaly, detected_at: datetime | None = None) -> float:
    """Record one detection's latency (``detected_at`` defaults to ``workflow.now()``); returns the seconds."""
    seconds = detection_latency_s(anomaly, detected_at or workflow.now())
    workflow.metric_meter().create_histogram_float(
        DETECTION_LATENCY, "Failure (as dated by its evidence) to detection by Rebound.", "s"
    ).record(seconds, {"kind": anomaly.kind.value})
    return seconds


def record_incident(incident: Incident) -> None:
    """Count one incident by anomaly kind, cause and failure class (call once its attribution is known).

    An incident without attribution yet counts with cause and class ``unknown``.
    """
    attribution = incident.attribution
    workflow.metric_meter().create_counter(INCIDENTS, "Incidents by kind, cause and failure class.").add(
        1,
        {
            "kind": incident.anomaly.kind.value,
            "cause": attribution.cause if attribution else "unknown",
            "failure_class": attribution.failure_class.value if attribution else "unknown",
        },
    )


def record_recovery_action(incident: Incident) -> float | None:
    """Record detection -> last recovery action verified (``Incident.recovery_action_s``), if it was restarted."""
    seconds = incident.recovery_action_s
    if seconds is None:
        return None
    workflow.metric_meter().create_histogram_float(
        RECOVERY_ACTION_LATENCY, "Detection to the last recovery action verified (drain, requeue).", "s"
    ).record(max(0.0, seconds), {"kind": incident.anomaly.kind.value})
    return seconds


def record_drain(node: str, cause: str) -> None:
    """Count one node drained by Rebound."""
    workflow.metric_meter().create_counter(DRAINS, "Nodes drained by Rebound.").add(1, {"node": node, "cause": cause})


def record_restart(cause: str) -> None:
    """Count one job restart (requeue) by Rebound."""
    workflow.metric_meter().create_counter(RESTARTS, "Jobs requeued by Rebound.").add(1, {"cause": cause})


def set_breaker_open(is_open: bool, *, scope: str = "cluster") -> None:
    """The drain breaker's state: 1 open (drains refused), 0 closed."""
    workflow.metric_meter().create_gauge(BREAKER_OPEN, "1 while the drain breaker is open.").set(
        1 if is_open else 0, {"scope": scope}
    )


def set_approvals_pending(count: int) -> None:
    """How many actions wait for an operator's approval now."""
    if count < 0:
        # A bug in the caller's bookkeeping must not fail the workflow task (it would retry forever): clamp, say so.
        workflow.logger.warning("approvals pending cannot be negative (%d); recording 0", count)
        count = 0
    workflow.metric_meter().create_gauge(APPROVALS_PENDING, "Actions waiting for an operator's approval.").set(count)
