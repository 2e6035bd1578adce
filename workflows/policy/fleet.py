"""The Fleet's policy: which implicated nodes Rebound drains, which wait for an operator, and each node's lifecycle.

Pure and deterministic: ``now`` is passed in, nothing is read or written, and every function returns a new
``FleetState`` (the Fleet workflow is the only caller and the single writer of node quarantine).

``decide_isolation`` applies these rules to one ``IsolationRequest``, in order, each adding a reason for people:

1. Mode: act in ``act`` mode, or in ``canary`` mode for a job of the canary partition; otherwise the verdict is
   computed in full (what WOULD be drained or held) but ``act`` is False.
2. Ownership: a node someone else drained is evidence, excluded and never touched (``external``); a node Rebound
   already drained is excluded, not drained again; a node the scheduler does not list is excluded.
3. Cross-job correlation: when this request and other jobs' incidents within ``correlation_window_s`` implicate
   at least two jobs and ``correlation_min_nodes`` distinct nodes, the cause is more likely shared (a switch, a file
   system): every candidate waits for an operator. A node another job implicated in that window is a strong suspect.
4. Low confidence (unless a strong suspect) and protected partitions wait for an operator.
5. Breaker: at most ``cap`` drains per sliding window for the cluster and for each partition; the rest wait.
6. The job's Nth restart (``approve_restart_from``) waits for an operator.
7. Everything drained, waiting, or drained by others is kept out of the job's next placement.

Windows are closed: an event exactly ``window_s`` old still counts (the safe side of every limit).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from workflows.domain.fleet import (
    Approval,
    ApprovalAnswer,
    ApprovalKind,
    ApprovalOutcome,
    BreakerStatus,
    DrainEvent,
    FleetMode,
    FleetPolicy,
    FleetState,
    FleetVerdict,
    IsolationDecision,
    IsolationRequest,
    NodeIncident,
    NodeLifecycle,
    NodeRecord,
)
from workflows.domain.names import is_rebound_drain
from workflows.domain.progress import aware
from workflows.domain.slurm import ClusterSnapshot, SlurmNode

__all__ = [
    "MAX_CHECKS_PER_NODE",
    "MAX_DECIDED_APPROVALS",
    "MAX_DECISIONS",
    "MAX_DRAIN_EVENTS",
    "MAX_INCIDENTS_PER_NODE",
    "after_drain",
    "after_health_check",
    "answer_approval",
    "breaker_status",
    "decide_isolation",
    "expire_approvals",
    "find_decision",
    "health_checks_due",
    "is_lemon",
    "note_incident",
    "open_approval",
    "remember_decision",
    "sync_with_view",
    "validate_answer",
]

MAX_INCIDENTS_PER_NODE = 50
MAX_CHECKS_PER_NODE = 10
MAX_DECIDED_APPROVALS = 100
MAX_DECISIONS = 200
#: Drain events are kept for this many breaker windows (so a window that grows at run time still sees its
#: history), and at most this many in all: far above any sane cap, so the bound never hides a drain in the window.
DRAIN_HISTORY_WINDOWS = 2.0
MAX_DRAIN_EVENTS = 1000

#: Added before flooring a cap: 0.29 x 100 is 28.999999999999996 in floating point, and must allow 29.
_FLOOR_EPSILON = 1e-9

#: Where a node stands while Rebound holds its drain (an operator's resume shows as "no longer drained").
_OURS_DRAINED = (NodeLifecycle.DRAINED, NodeLifecycle.HELD, NodeLifecycle.CHECKING)


# ----- time and small helpers --------------------------------------------------------------------------------------


def _age_s(now: datetime, at: datetime) -> float:
    """Seconds from ``at`` to ``now`` (negative when ``at`` is later); a naive time is taken as UTC."""
    return (aware(now) - aware(at)).total_seconds()


def _within(at: datetime, now: datetime, window_s: float) -> bool:
    """``at`` is at most ``window_s`` before ``now`` (closed window; a time after ``now`` counts too)."""
    return _age_s(now, at) <= window_s


def _span(seconds: float) -> str:
    """A window for people: ``7d``, ``1h``, ``5m``, ``90s``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _unique(names: Iterable[str]) -> list[str]:
    """Names without blanks and repeats, first occurrence kept (the first implicated node is the likeliest)."""
    seen: dict[str, None] = {}
    for name in names:
        if name and name not in seen:
            seen[name] = None
    return list(seen)


def _job_partition(req: IsolationRequest) -> str:
    """The job's partition; a job pending in several lists them comma-separated, and the first one decides."""
    return req.partition.split(",")[0].strip()


# ----- breaker -----------------------------------------------------------------------------------------------------


def _floor_share(fraction: float, count: int) -> int:
    return math.floor(fraction * max(count, 0) + _FLOOR_EPSILON)


def _cluster_cap(policy: FleetPolicy, cluster_nodes: int) -> int:
    return max(1, min(policy.breaker_max_nodes, _floor_share(policy.breaker_max_fraction, cluster_nodes)))


def _partition_cap(policy: FleetPolicy, partition_nodes: int) -> int:
    return max(1, _floor_share(policy.breaker_max_fraction, partition_nodes))


def _counted_drains(state: FleetState, policy: FleetPolicy, now: datetime) -> list[DrainEvent]:
    """Drains inside the window; once an operator reset the breaker, only those since the reset."""
    reset = state.breaker_reset_at
    return [
        d
        for d in state.drains
        if _within(d.at, now, policy.breaker_window_s) and (reset is None or aware(d.at) >= aware(reset))
    ]


def breaker_status(state: FleetState, policy: FleetPolicy, cluster_nodes: int, now: datetime) -> BreakerStatus:
    """Drains by Rebound in the sliding window against the cluster's cap; open (no more drains) at the cap."""
    drained = len(_counted_drains(state, policy, now))
    cap = _cluster_cap(policy, cluster_nodes)
    return BreakerStatus(drained_in_window=drained, cap=cap, open=drained >= cap, reset_at=state.breaker_reset_at)


# ----- the decision ------------------------------------------------------------------------------------------------


def _acts(state: FleetState, req: IsolationRequest, reasons: list[str]) -> bool:
    if state.mode is FleetMode.ACT:
        return True
    if state.mode is FleetMode.OBSERVE:
        reasons.append("observe mode: decided and recorded; nothing is drained or restarted")
        return False
    partition = _job_partition(req)
    if state.canary_partition and partition == state.canary_partition:
        reasons.append(f"canary mode: job partition {partition!r} is the canary partition: acting")
        return True
    reasons.append(
        f"canary mode: job partition {partition or '(none)'!r} is not the canary partition "
        f"{state.canary_partition or '(none set)'!r}: observe only"
    )
    return False


def _other_jobs_within(state: FleetState, req: IsolationRequest, window_s: float) -> dict[str, set[int]]:
    """Node -> the other jobs whose incidents implicated it within ``window_s`` of this request's failure.

    Failures are compared by when they were reported (``requested_at``), not when Fleet got to them: a backlog
    worked off late must not look like one burst. An operator's breaker reset acknowledges what came before it:
    those incidents no longer count toward a correlated burst (they stay in the nodes' history, for lemons).
    """
    out: dict[str, set[int]] = {}
    reset = state.breaker_reset_at
    for name, record in state.nodes.items():
        for inc in record.incidents:
            if reset is not None and aware(inc.at) < aware(reset):
                continue
            if inc.job_id != req.job_id and abs(_age_s(req.requested_at, inc.at)) <= window_s:
                out.setdefault(name, set()).add(inc.job_id)
    return out


def _jobs_text(jobs: Iterable[int]) -> str:
    return ", ".join(str(j) for j in sorted(jobs))


def decide_isolation(
    state: FleetState, req: IsolationRequest, policy: FleetPolicy, view: ClusterSnapshot, now: datetime
) -> FleetVerdict:
    """What Rebound would drain now, what waits for an operator, and what the job's next placement excludes.

    See the module docstring for the rules. The order of ``req.nodes`` is kept (first implicated = most likely),
    so when the breaker allows only some drains it is the likeliest culprits that go first.
    """
    reasons: list[str] = []
    act = _acts(state, req, reasons)
    by_name = {n.name: n for n in view.nodes}

    # 2. Ownership: never touch a drain someone else set; never drain twice.
    external: list[str] = []
    already: list[str] = []
    unknown: list[str] = []
    candidates: list[SlurmNode] = []
    for name in _unique(req.nodes):
        node = by_name.get(name)
        if node is None:
            unknown.append(name)
            reasons.append(f"{name}: not a node of this cluster: excluded")
        elif node.is_drained and not is_rebound_drain(node.reason):
            external.append(name)
            reasons.append(f"{name}: drained by someone else ({node.reason!r}): excluded, never touched")
        elif node.is_drained:
            already.append(name)
            reasons.append(f"{name}: already drained by Rebound: excluded")
        else:
            candidates.append(node)

    # 3. Cross-job correlation.
    window = _span(policy.correlation_window_s)
    others = _other_jobs_within(state, req, policy.correlation_window_s)
    jobs = {req.job_id}.union(*others.values())
    implicated = _unique([*req.nodes, *others])
    shared = len(jobs) >= 2 and len(implicated) >= policy.correlation_min_nodes

    hold: list[str] = []
    to_drain: list[SlurmNode] = []
    if shared:
        reasons.append(
            f"shared infrastructure suspected: jobs {_jobs_text(jobs)} implicate {len(implicated)} nodes "
            f"({', '.join(sorted(implicated))}) within {window}: nothing is drained until an operator decides"
        )
        hold = [n.name for n in candidates]
        if hold:
            reasons.append(f"{', '.join(hold)}: wait for an operator (shared infrastructure suspected)")
    else:
        # 4. Low confidence and protected partitions.
        protected = set(policy.protected_partitions)
        for node in candidates:
            strong = node.name in others
            if strong:
                reasons.append(
                    f"{node.name}: strong suspect: also implicated by job {_jobs_text(others[node.name])} "
                    f"within {window}"
                )
            waits: list[str] = []
            if req.confidence < policy.approve_below_confidence and not strong:
                waits.append(f"confidence {req.confidence:.2f} below {policy.approve_below_confidence:.2f}")
            in_protected = sorted(protected.intersection(node.partitions))
            if in_protected:
                waits.append(f"protected partition {', '.join(in_protected)}")
            if waits:
                hold.append(node.name)
                reasons.append(f"{node.name}: waits for an operator: {'; '.join(waits)}")
            else:
                to_drain.append(node)

    # 5. Breaker, for the cluster and for each partition.
    drain = _apply_breaker(state, policy, view, now, to_drain, hold, reasons)
    for name in drain:
        reasons.append(f"{name}: {'drain' if act else 'would drain'} (confidence {req.confidence:.2f})")

    # 6. The Nth restart.
    restart_needs_approval = policy.approve_restart_from > 0 and req.restart_number >= policy.approve_restart_from
    if restart_needs_approval:
        reasons.append(
            f"restart {req.restart_number} of job {req.job_id} waits for an operator "
            f"(approve_restart_from = {policy.approve_restart_from})"
        )

    # 7. Keep all of them out of the next placement.
    exclude = _unique([*drain, *hold, *external, *already, *unknown])
    return FleetVerdict(
        act=act,
        drain=tuple(drain),
        hold=tuple(hold),
        exclude=tuple(exclude),
        external=tuple(external),
        restart_needs_approval=restart_needs_approval,
        reasons=tuple(reasons),
    )


def _apply_breaker(
    state: FleetState,
    policy: FleetPolicy,
    view: ClusterSnapshot,
    now: datetime,
    to_drain: Sequence[SlurmNode],
    hold: list[str],
    reasons: list[str],
) -> list[str]:
    """The nodes the breaker lets through, in order; the rest go to ``hold`` with the cap they hit."""
    counted = _counted_drains(state, policy, now)
    cap = _cluster_cap(policy, len(view.nodes))
    used = len(counted)
    part_size = Counter(p for n in view.nodes for p in set(n.partitions))
    part_used = Counter(p for d in counted for p in set(d.partitions))
    window = _span(policy.breaker_window_s)
    drain: list[str] = []
    for node in to_drain:
        if used >= cap:
            hold.append(node.name)
            reasons.append(
                f"{node.name}: breaker: cluster cap {cap} reached ({used} drains in the last {window}; cap = "
                f"max(1, min({policy.breaker_max_nodes}, {policy.breaker_max_fraction:g} x {len(view.nodes)} nodes)))"
            )
            continue
        parts = sorted(set(node.partitions))
        full = [p for p in parts if part_used[p] >= _partition_cap(policy, part_size[p])]
        if full:
            p = full[0]
            hold.append(node.name)
            reasons.append(
                f"{node.name}: breaker: partition {p!r} cap {_partition_cap(policy, part_size[p])} reached "
                f"({part_used[p]} drains in the last {window}; cap = max(1, {policy.breaker_max_fraction:g} x "
                f"{part_size[p]} nodes))"
            )
            continue
        drain.append(node.name)
        used += 1
        part_used.update(parts)
    return drain


# ----- incidents and the node lifecycle ----------------------------------------------------------------------------


def note_incident(state: FleetState, req: IsolationRequest, now: datetime, policy: FleetPolicy) -> FleetState:
    """Record the request against each implicated node (a HEALTHY one becomes SUSPECT).

    Idempotent per (request id, node): a repeated request adds nothing. Each node keeps at most
    ``MAX_INCIDENTS_PER_NODE`` incidents, none older than the lemon window.
    """
    nodes = dict(state.nodes)
    changed = False
    for name in _unique(req.nodes):
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
        )
        recent = tuple(i for i in record.incidents if _within(i.at, now, policy.lemon_window_s))
        update: dict[str, object] = {"incidents": (*recent, incident)[-MAX_INCIDENTS_PER_NODE:]}
        if record.state is NodeLifecycle.HEALTHY:
            update |= {
                "state": NodeLifecycle.SUSPECT,
                "since": now,
                "reason": f"implicated by job {req.job_id} ({req.incident}: {req.cause})",
            }
        nodes[name] = record.model_copy(update=update)
        changed = True
    return state.model_copy(update={"nodes": nodes}) if changed else state


def _lemon_count(record: NodeRecord, policy: FleetPolicy, now: datetime) -> int:
    return sum(1 for i in record.incidents if _within(i.at, now, policy.lemon_window_s))


def is_lemon(record: NodeRecord, policy: FleetPolicy, now: datetime) -> bool:
    """Implicated in ``lemon_incidents`` or more incidents within ``lemon_window_s``: held for repair."""
    return _lemon_count(record, policy, now) >= policy.lemon_incidents


def _lemon_reason(record: NodeRecord, policy: FleetPolicy, now: datetime) -> str:
    return f"lemon: {_lemon_count(record, policy, now)} incidents in {_span(policy.lemon_window_s)}"


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
    drains = tuple(d for d in (*state.drains, event) if _within(d.at, now, keep_s))[-MAX_DRAIN_EVENTS:]
    return state.model_copy(update={"nodes": {**state.nodes, node: record}, "drains": drains})


def health_checks_due(state: FleetState, policy: FleetPolicy, now: datetime) -> list[str]:
    """DRAINED nodes (not HELD, not someone else's) drained at least ``health_check_after_s`` ago, oldest first."""
    due = [
        r
        for r in state.nodes.values()
        if r.state is NodeLifecycle.DRAINED
        and r.drained_at is not None
        and _age_s(now, r.drained_at) >= policy.health_check_after_s
    ]
    return [r.node for r in sorted(due, key=lambda r: (aware(r.drained_at or now), r.node))]


def after_health_check(
    state: FleetState,
    node: str,
    healthy: bool,
    detail: str,
    policy: FleetPolicy,
    now: datetime,
    view: ClusterSnapshot,
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
    current = view.node(node)
    if record.state not in (NodeLifecycle.DRAINED, NodeLifecycle.CHECKING):
        pass  # Held, resumed or taken over meanwhile: the result is recorded, the state is not ours to change.
    elif current is None:
        update |= _moved(
            NodeLifecycle.HELD, f"no longer listed by the scheduler (health check {verdict}: {detail})", now
        )
    elif not current.is_drained:
        update |= _moved(NodeLifecycle.HEALTHY, "resumed by an operator", now)
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
        update |= _moved(NodeLifecycle.HEALTHY, f"returned to service: {detail}", now)
        resume = True
    return state.model_copy(update={"nodes": {**state.nodes, node: record.model_copy(update=update)}}), resume


def _moved(to: NodeLifecycle, reason: str, now: datetime) -> dict[str, object]:
    return {"state": to, "since": now, "reason": reason}


def sync_with_view(state: FleetState, view: ClusterSnapshot, now: datetime) -> FleetState:
    """Bring Rebound's node records in line with what the scheduler shows; changes nothing in the scheduler.

    Only nodes Rebound has a record of are followed: the view itself shows everyone else's drains whenever a
    decision needs them, and the carried state stays as small as the set of nodes Rebound ever dealt with.
    """
    by_name = {n.name: n for n in view.nodes}
    nodes = dict(state.nodes)
    changed = False
    for name, record in state.nodes.items():
        current = by_name.get(name)
        if current is None:
            continue
        update: dict[str, object] | None = None
        if record.state in _OURS_DRAINED:
            if not current.is_drained:
                update = _moved(NodeLifecycle.HEALTHY, "resumed by an operator", now)
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


# ----- approvals ---------------------------------------------------------------------------------------------------


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
        nodes=tuple(_unique(nodes)),
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


def validate_answer(state: FleetState, answer: ApprovalAnswer, policy: FleetPolicy) -> str | None:
    """Why this answer must be refused (for the update's validator), or None when it may be applied."""
    operator = answer.operator.strip()
    if not operator:
        return "the operator is empty: say who answers (--as NAME)"
    approval = _find_approval(state, answer.approval_id.strip())
    if approval is None:
        pending = [a.id for a in state.approvals if a.outcome is ApprovalOutcome.PENDING]
        return f"unknown approval id {answer.approval_id!r} (pending: {', '.join(pending) or 'none'})"
    if approval.outcome is not ApprovalOutcome.PENDING:
        by = f" by {approval.decided_by}" if approval.decided_by else ""
        return f"approval {approval.id} is not pending: already {approval.outcome.value}{by}"
    if not policy.operators:
        return (
            "no operators are configured (fleet.operators): nobody may approve or reject; approvals time out "
            f"to {policy.approval_default.value}"
        )
    if operator not in policy.operators:
        return f"operator {operator!r} may not answer approvals (fleet.operators: {', '.join(policy.operators)})"
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
                    "note": f"no answer within {_span(_age_s(a.deadline, a.requested_at))}: {applied.value} by default",
                }
            )
            expired.append(a)
        approvals.append(a)
    if not expired:
        return state, []
    return state.model_copy(update={"approvals": _bounded_approvals(approvals)}), expired


# ----- decisions ---------------------------------------------------------------------------------------------------


def remember_decision(state: FleetState, decision: IsolationDecision) -> FleetState:
    """Keep the decision (replacing an earlier one for the same request); the last ``MAX_DECISIONS`` are kept."""
    kept = tuple(d for d in state.decisions if d.request_id != decision.request_id)
    return state.model_copy(update={"decisions": (*kept, decision)[-MAX_DECISIONS:]})


def find_decision(state: FleetState, request_id: str) -> IsolationDecision | None:
    """The decision already made for this request, so a repeated request is answered the same way."""
    return next((d for d in reversed(state.decisions) if d.request_id == request_id), None)
