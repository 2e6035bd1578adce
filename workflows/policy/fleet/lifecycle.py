"""Each node's lifecycle in the Fleet: incidents noted (HEALTHY -> SUSPECT), drains recorded (DRAINED, or HELD
for a lemon), health checks due and their results (back to HEALTHY, or HELD), and the records kept in line with
what the scheduler shows (an operator's resume, someone else's drain). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from workflows.domain.fleet import (
    ApprovalOutcome,
    DrainEvent,
    FleetPolicy,
    FleetState,
    IsolationRequest,
    NodeIncident,
    NodeLifecycle,
    NodeRecord,
)
from workflows.domain.fleet_view import FleetView
from workflows.domain.incident import ActionRung
from workflows.domain.names import is_rebound_drain
from workflows.domain.progress import aware
from workflows.domain.slurm import ClusterSnapshot
from workflows.policy.fleet.common import age_s, span, unique, within
from workflows.policy.fleet.view import as_fleet_view

__all__ = [
    "DRAIN_HISTORY_WINDOWS",
    "MAX_CHECKS_PER_NODE",
    "MAX_DRAIN_EVENTS",
    "MAX_INCIDENTS_PER_NODE",
    "after_drain",
    "after_health_check",
    "clear_stale_suspects",
    "health_checks_due",
    "is_lemon",
    "next_wake_s",
    "note_incident",
    "sync_with_view",
]

MAX_INCIDENTS_PER_NODE = 50
MAX_CHECKS_PER_NODE = 10
#: Drain events are kept for this many breaker windows (so a window that grows at run time still sees its
#: history), and at most this many in all: far above any sane cap, so the bound never hides a drain in the window.
DRAIN_HISTORY_WINDOWS = 2.0
MAX_DRAIN_EVENTS = 1000

#: Where a node stands while Rebound holds its drain (an operator's resume shows as "no longer drained").
_OURS_DRAINED = (NodeLifecycle.DRAINED, NodeLifecycle.HELD, NodeLifecycle.CHECKING)


def note_incident(state: FleetState, req: IsolationRequest, now: datetime, policy: FleetPolicy) -> FleetState:
    """Record the request against each implicated node (a HEALTHY one becomes SUSPECT).

    Idempotent per (request id, node): a repeated request adds nothing. Each node keeps at most
    ``MAX_INCIDENTS_PER_NODE`` incidents, none older than the lemon window.
    """
    nodes = dict(state.nodes)
    changed = False
    for name in unique(req.nodes):
        record = nodes.get(name) or NodeRecord(node=name)
        if any(i.request_id == req.request_id for i in record.incidents):
            continue
        incident = NodeIncident(
            at=req.requested_at,
            job_id=req.job_id,
            incident=req.incident,
            cause=req.cause,
            confidence=req.confidence,
            request_id=req.request_id,
            suspicion=req.rung is ActionRung.EXCLUDE,
            evidence=req.evidence,
            user=req.user,
        )
        recent = tuple(i for i in record.incidents if within(i.at, now, policy.lemon_window_s))
        update: dict[str, object] = {"incidents": (*recent, incident)[-MAX_INCIDENTS_PER_NODE:]}
        if record.state is NodeLifecycle.HEALTHY:
            how = "suspected (excluded, not drained)" if incident.suspicion else "implicated"
            update |= {
                "state": NodeLifecycle.SUSPECT,
                "since": now,
                "reason": f"{how} by job {req.job_id} ({req.incident}: {req.cause})",
            }
        nodes[name] = record.model_copy(update=update)
        changed = True
    return state.model_copy(update={"nodes": nodes}) if changed else state


def clear_stale_suspects(state: FleetState, policy: FleetPolicy, now: datetime) -> FleetState:
    """SUSPECT nodes implicated by nothing within ``suspicion_window_s`` (nor ``correlation_window_s``), with no
    pending approval naming them, are HEALTHY again: a suspicion is windowed, and ``rebound nodes`` would otherwise
    list every node a job ever suspected. Their incidents stay (the lemon count reads them)."""
    window = max(policy.suspicion_window_s, policy.correlation_window_s)
    waiting = {n for a in state.approvals if a.outcome is ApprovalOutcome.PENDING for n in a.nodes}
    nodes = dict(state.nodes)
    changed = False
    for name, record in state.nodes.items():
        if record.state is not NodeLifecycle.SUSPECT or name in waiting:
            continue
        if any(within(i.at, now, window) for i in record.incidents):
            continue
        nodes[name] = record.model_copy(
            update=_moved(NodeLifecycle.HEALTHY, f"no incident within {span(window)}: no longer suspect", now)
        )
        changed = True
    return state.model_copy(update={"nodes": nodes}) if changed else state


def _lemon_count(record: NodeRecord, policy: FleetPolicy, now: datetime) -> int:
    return sum(1 for i in record.incidents if within(i.at, now, policy.lemon_window_s))


def is_lemon(record: NodeRecord, policy: FleetPolicy, now: datetime) -> bool:
    """Implicated in ``lemon_incidents`` or more incidents within ``lemon_window_s``: held for repair."""
    return _lemon_count(record, policy, now) >= policy.lemon_incidents


def _lemon_reason(record: NodeRecord, policy: FleetPolicy, now: datetime) -> str:
    return f"lemon: {_lemon_count(record, policy, now)} incidents in {span(policy.lemon_window_s)}"


def after_drain(
    state: FleetState,
    node: str,
    drain_reason: str,
    req: IsolationRequest,
    partitions: Sequence[str],
    now: datetime,
    policy: FleetPolicy,
) -> FleetState:
    """Record a verified drain: DRAINED, or HELD for repair when the node is a lemon; the breaker counts it.

    The request's incident is noted first (idempotently), so a lemon is recognised whichever order the workflow
    calls these in. Recording the same drain twice counts it once.
    """
    state = note_incident(state, req.model_copy(update={"nodes": (node,)}), now, policy)
    record = state.nodes[node]
    if (
        record.state in _OURS_DRAINED
        and record.drain_reason == drain_reason
        and any(d.node == node and d.incident == req.incident for d in state.drains)
    ):
        return state
    parts = tuple(partitions) or record.partitions
    lemon = is_lemon(record, policy, now)
    record = record.model_copy(
        update={
            "state": NodeLifecycle.HELD if lemon else NodeLifecycle.DRAINED,
            "since": now,
            "reason": _lemon_reason(record, policy, now)
            if lemon
            else f"drained for job {req.job_id} ({req.incident}: {req.cause})",
            "partitions": parts,
            "drained_at": now,
            "drain_reason": drain_reason,
        }
    )
    event = DrainEvent(at=now, node=node, partitions=parts, incident=req.incident)
    keep_s = policy.breaker_window_s * DRAIN_HISTORY_WINDOWS
    drains = tuple(d for d in (*state.drains, event) if within(d.at, now, keep_s))[-MAX_DRAIN_EVENTS:]
    return state.model_copy(update={"nodes": {**state.nodes, node: record}, "drains": drains})


def health_checks_due(state: FleetState, policy: FleetPolicy, now: datetime) -> list[str]:
    """DRAINED nodes (not HELD, not someone else's) drained at least ``health_check_after_s`` ago, oldest first."""
    due = [
        r
        for r in state.nodes.values()
        if r.state is NodeLifecycle.DRAINED
        and r.drained_at is not None
        and age_s(now, r.drained_at) >= policy.health_check_after_s
    ]
    return [r.node for r in sorted(due, key=lambda r: (aware(r.drained_at or now), r.node))]


def after_health_check(
    state: FleetState,
    node: str,
    healthy: bool,
    detail: str,
    policy: FleetPolicy,
    now: datetime,
    view: FleetView | ClusterSnapshot,
) -> tuple[FleetState, bool]:
    """Record a health check; True when the workflow should resume the node now.

    Only a node that still carries exactly Rebound's drain reason is ever resumed: if an operator resumed it
    meanwhile it is HEALTHY already; if anyone changed the reason it is theirs now (EXTERNAL).
    """
    record = state.nodes.get(node)
    if record is None:
        return state, False
    verdict = "pass" if healthy else "fail"
    checks = (*record.checks, f"{aware(now).isoformat()} {verdict}: {detail}")[-MAX_CHECKS_PER_NODE:]
    update: dict[str, object] = {"checks": checks}
    resume = False
    current = as_fleet_view(view, state).node(node)
    if record.state not in (NodeLifecycle.DRAINED, NodeLifecycle.CHECKING):
        pass  # Held, resumed or taken over meanwhile: the result is recorded, the state is not ours to change.
    elif current is None:
        update |= _moved(
            NodeLifecycle.HELD, f"no longer listed by the scheduler (health check {verdict}: {detail})", now
        )
    elif not current.is_drained:
        update |= _returned("resumed by an operator", now)
    elif current.reason != record.drain_reason:
        update |= _moved(NodeLifecycle.EXTERNAL, f"drain reason changed by someone else: {current.reason!r}", now)
    elif not healthy:
        update |= _moved(NodeLifecycle.HELD, f"failed health check: {detail}", now)
    elif is_lemon(record, policy, now):
        update |= _moved(NodeLifecycle.HELD, _lemon_reason(record, policy, now), now)
    elif not policy.return_healthy_nodes:
        update |= _moved(
            NodeLifecycle.HELD, f"passed health check ({detail}); return_healthy_nodes is off: an operator resumes", now
        )
    else:
        update |= _returned(f"returned to service: {detail}", now)
        resume = True
    return state.model_copy(update={"nodes": {**state.nodes, node: record.model_copy(update=update)}}), resume


def _moved(to: NodeLifecycle, reason: str, now: datetime) -> dict[str, object]:
    return {"state": to, "since": now, "reason": reason}


def _returned(reason: str, now: datetime) -> dict[str, object]:
    """A node Rebound drained is back in service: healthy, and a clean slate for the repeat rule."""
    return {**_moved(NodeLifecycle.HEALTHY, reason, now), "returned_at": now}


def sync_with_view(state: FleetState, view: FleetView | ClusterSnapshot, now: datetime) -> FleetState:
    """Bring Rebound's node records in line with what the scheduler shows; changes nothing in the scheduler.

    Only nodes Rebound has a record of are followed: the view itself shows everyone else's drains whenever a
    decision needs them, and the carried state stays as small as the set of nodes Rebound ever dealt with.
    """
    by_name = {n.name: n for n in as_fleet_view(view, state).nodes}
    nodes = dict(state.nodes)
    changed = False
    for name, record in state.nodes.items():
        current = by_name.get(name)
        if current is None:
            continue
        update: dict[str, object] | None = None
        if record.state in _OURS_DRAINED:
            if not current.is_drained:
                update = _returned("resumed by an operator", now)
            elif record.drain_reason and current.reason != record.drain_reason:
                update = _moved(
                    NodeLifecycle.EXTERNAL, f"drain reason changed by someone else: {current.reason!r}", now
                )
        elif record.state in (NodeLifecycle.HEALTHY, NodeLifecycle.SUSPECT):
            if current.is_drained and not is_rebound_drain(current.reason):
                update = _moved(NodeLifecycle.EXTERNAL, f"drained by someone else: {current.reason!r}", now)
        elif record.state is NodeLifecycle.DRAINING:
            # Mid-drain: an undrained node may only not show it yet, and our own reason is after_drain's to
            # record; but a drain someone else set first makes it theirs (the drain activity then backs off).
            if current.is_drained and not is_rebound_drain(current.reason):
                update = _moved(NodeLifecycle.EXTERNAL, f"drained by someone else: {current.reason!r}", now)
        elif record.state is NodeLifecycle.EXTERNAL and not current.is_drained:
            update = _moved(NodeLifecycle.HEALTHY, "no longer drained by anyone", now)
        if update is not None:
            if not record.partitions and current.partitions:
                update["partitions"] = current.partitions
            nodes[name] = record.model_copy(update=update)
            changed = True
    return state.model_copy(update={"nodes": nodes}) if changed else state


def next_wake_s(state: FleetState, policy: FleetPolicy, now: datetime, max_s: float) -> float:
    """Seconds until the Fleet must look again: the next approval deadline or health check, at most ``max_s``
    (at least half a second)."""
    waits = [(a.deadline - now).total_seconds() for a in state.approvals if a.outcome is ApprovalOutcome.PENDING]
    for record in state.nodes.values():
        if record.state is NodeLifecycle.DRAINED and record.drained_at is not None:
            due = record.drained_at + timedelta(seconds=policy.health_check_after_s)
            waits.append((due - now).total_seconds())
    return max(0.5, min([max_s, *waits]))
