"""The Fleet's isolation decision: which implicated nodes Rebound drains now, which wait for an operator, and
what the job's next placement excludes; and the memory of decisions, so a repeated request gets the same answer.
Pure. The rules are listed in ``workflows.policy.fleet``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from workflows.domain.fleet import FleetMode, FleetPolicy, FleetState, FleetVerdict, IsolationDecision, IsolationRequest
from workflows.domain.fleet_view import FleetView
from workflows.domain.incident import ActionRung
from workflows.domain.names import is_rebound_drain
from workflows.domain.progress import aware
from workflows.domain.slurm import ClusterSnapshot, SlurmNode
from workflows.policy.fleet.breaker import apply_breaker
from workflows.policy.fleet.common import age_s, span, unique
from workflows.policy.fleet.suspicion import earlier_implications, fit_exclusion, repeat_reason, standing_exclusion
from workflows.policy.fleet.view import as_fleet_view

__all__ = ["MAX_DECISIONS", "decide_isolation", "find_decision", "remember_decision"]

MAX_DECISIONS = 200


def _job_partition(req: IsolationRequest) -> str:
    """The job's partition; a job pending in several lists them comma-separated, and the first one decides."""
    return req.partition.split(",")[0].strip()


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
            if inc.job_id != req.job_id and abs(age_s(req.requested_at, inc.at)) <= window_s:
                out.setdefault(name, set()).add(inc.job_id)
    return out


def _jobs_text(jobs: Iterable[int]) -> str:
    return ", ".join(str(j) for j in sorted(jobs))


def decide_isolation(
    state: FleetState, req: IsolationRequest, policy: FleetPolicy, view: FleetView | ClusterSnapshot, now: datetime
) -> FleetVerdict:
    """What Rebound would drain now, what waits for an operator, and what the job's next placement excludes.

    See the module docstring for the rules. The order of ``req.nodes`` is kept (first implicated = most likely),
    so when the breaker allows only some drains it is the likeliest culprits that go first.
    """
    view = as_fleet_view(view, state, req)
    reasons: list[str] = []
    act = _acts(state, req, reasons)

    # 2. Ownership: never touch a drain someone else set; never drain twice.
    external: list[str] = []
    already: list[str] = []
    unknown: list[str] = []
    candidates: list[SlurmNode] = []
    for name in unique(req.nodes):
        node = view.node(name)
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

    # 2b. The exclude rung: a suspicion, unless the node was implicated before within the suspicion window.
    suspects: list[str] = []
    repeats: set[str] = set()
    if req.rung is ActionRung.EXCLUDE:
        earlier = earlier_implications(state, req, policy.suspicion_window_s)
        for node in candidates:
            if node.name in earlier:
                repeats.add(node.name)
                reasons.append(repeat_reason(node.name, earlier[node.name], req, policy.suspicion_window_s))
            else:
                suspects.append(node.name)
                reasons.append(
                    f"{node.name}: suspicion recorded, not drained ({req.evidence or 'only the job implicates it'})"
                )
        candidates = [n for n in candidates if n.name in repeats]

    # 3. Cross-job correlation.
    window = span(policy.correlation_window_s)
    others = _other_jobs_within(state, req, policy.correlation_window_s)
    jobs = {req.job_id}.union(*others.values())
    implicated = unique([*req.nodes, *others])
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
            strong = node.name in others or node.name in repeats
            if node.name in others:
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
    drain = apply_breaker(state, policy, view, now, to_drain, hold, reasons)
    for name in drain:
        reasons.append(f"{name}: {'drain' if act else 'would drain'} (confidence {req.confidence:.2f})")

    # 6. The Nth restart.
    restart_needs_approval = (
        req.restart and policy.approve_restart_from > 0 and req.restart_number >= policy.approve_restart_from
    )
    if restart_needs_approval:
        reasons.append(
            f"restart {req.restart_number} of job {req.job_id} waits for an operator "
            f"(approve_restart_from = {policy.approve_restart_from})"
        )

    # 7. Keep all of them out of the next placement (a suspect only if the job can still be placed without it).
    unavailable = unique([*drain, *hold, *external, *already, *unknown])
    kept, fit_reasons = fit_exclusion(view, req, unavailable, suspects)
    reasons += fit_reasons
    for name in kept:
        reasons.append(f"{name}: excluded from job {req.job_id}'s next placement")
    exclude = unique([*unavailable, *kept])
    return FleetVerdict(
        act=act,
        drain=tuple(drain),
        hold=tuple(hold),
        exclude=tuple(exclude),
        external=tuple(external),
        restart_needs_approval=restart_needs_approval,
        reasons=tuple(reasons),
        suspected=tuple(suspects),
        job_exclusion=standing_exclusion(req, kept),
    )


def remember_decision(state: FleetState, decision: IsolationDecision) -> FleetState:
    """Keep the decision (replacing an earlier one for the same request); the last ``MAX_DECISIONS`` are kept."""
    kept = tuple(d for d in state.decisions if d.request_id != decision.request_id)
    return state.model_copy(update={"decisions": (*kept, decision)[-MAX_DECISIONS:]})


def find_decision(state: FleetState, request_id: str) -> IsolationDecision | None:
    """The decision already made for this request, so a repeated request is answered the same way."""
    return next((d for d in reversed(state.decisions) if d.request_id == request_id), None)
