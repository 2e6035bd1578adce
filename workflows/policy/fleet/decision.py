"""The Fleet's isolation decision: which implicated nodes Rebound drains now, which wait for an operator, and
what the job's next placement excludes; and the memory of decisions, so a repeated request gets the same answer.
Pure. The rules are listed in ``workflows.policy.fleet``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from workflows.domain.fleet import (
    ApprovalKind,
    ApprovalOutcome,
    FleetMode,
    FleetPolicy,
    FleetState,
    FleetVerdict,
    IsolationDecision,
    IsolationRequest,
    NodeIncident,
)
from workflows.domain.fleet_view import FleetView
from workflows.domain.incident import ActionRung
from workflows.domain.names import is_rebound_drain
from workflows.domain.progress import aware
from workflows.domain.slurm import ClusterSnapshot, SlurmNode
from workflows.policy.fleet.breaker import apply_breaker
from workflows.policy.fleet.common import age_s, span, unique
from workflows.policy.fleet.suspicion import (
    claim_reason,
    earlier_implications,
    fit_exclusion,
    implicating_users,
    repeat_reason,
    standing_exclusion,
    users_text,
)
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


def _other_jobs_within(state: FleetState, req: IsolationRequest, window_s: float) -> dict[str, list[NodeIncident]]:
    """Node -> the other jobs' incidents that implicated it within ``window_s`` of this request's failure.

    Failures are compared by when they were reported (``requested_at``), not when Fleet got to them: a backlog
    worked off late must not look like one burst. An operator's breaker reset acknowledges what came before it:
    those incidents no longer count toward a correlated burst (they stay in the nodes' history, for lemons).
    """
    out: dict[str, list[NodeIncident]] = {}
    reset = state.breaker_reset_at
    for name, record in state.nodes.items():
        for inc in record.incidents:
            if reset is not None and aware(inc.at) < aware(reset):
                continue
            if inc.job_id != req.job_id and abs(age_s(req.requested_at, inc.at)) <= window_s:
                out.setdefault(name, []).append(inc)
    return out


def _jobs_text(jobs: Iterable[int]) -> str:
    return ", ".join(str(j) for j in sorted(jobs))


def _correlated(
    req: IsolationRequest, others: dict[str, list[NodeIncident]], policy: FleetPolicy, claims: bool
) -> tuple[bool, str]:
    """Whether this request and the other jobs' incidents in the window point at shared infrastructure, and why
    (or why not, when only one user's jobs would have made it).

    Counted: jobs of at least two distinct KNOWN users, implicating ``correlation_min_nodes`` distinct nodes. A
    freeze holds every drain in the cluster until an operator decides, and a user controls what their own jobs
    print and how many they submit: if two jobs of one user were enough, any user could freeze the cluster's drains
    on purpose (two jobs printing fake errors over three nodes). An unknown owner (a request from before owners
    were sent, or a forged one) counts for no user, so its incidents are left out.

    Exclude-rung incidents (only the job's word) DO count: shared infrastructure (a switch, a file system) shows
    almost only as jobs' words (NCCL timeouts, ranks gone silent, I/O errors), never as a GPU read, so without
    them correlation would miss the very failures it exists for, and two users' repeats on one node during such a
    failure would drain it. Counting them costs nothing a claim could abuse: a freeze never drains a node, it only
    makes drains wait for an operator, and it takes the jobs of two different users.

    ``claims`` False: the rule before job output was a claim (any two jobs), for histories recorded then.
    """
    window = span(policy.correlation_window_s)
    if not claims:
        jobs = {req.job_id}.union(*({i.job_id for i in incs} for incs in others.values()))
        implicated = unique([*req.nodes, *others])
        if len(jobs) >= 2 and len(implicated) >= policy.correlation_min_nodes:
            why = (
                f"shared infrastructure suspected: jobs {_jobs_text(jobs)} implicate {len(implicated)} nodes "
                f"({', '.join(sorted(implicated))}) within {window}: nothing is drained until an operator decides"
            )
            return True, why
        return False, ""
    counted = {n: [i for i in incs if i.user] for n, incs in others.items()}
    counted = {n: incs for n, incs in counted.items() if incs}
    mine = list(req.nodes) if req.user else []
    jobs = ({req.job_id} if req.user else set()).union(*({i.job_id for i in incs} for incs in counted.values()))
    users = sorted({u for u in (req.user, *(i.user for incs in counted.values() for i in incs)) if u})
    implicated = unique([*mine, *counted])
    if len(implicated) < policy.correlation_min_nodes or len(jobs) < 2:
        return False, ""
    if len(users) < 2:
        return False, (
            f"not shared infrastructure: jobs {_jobs_text(jobs)} implicate {len(implicated)} nodes within {window}, "
            f"but all are jobs of user {users[0]}: one user's jobs cannot freeze the cluster's drains"
        )
    return True, (
        f"shared infrastructure suspected: jobs {_jobs_text(jobs)} of users {users_text(users)} implicate "
        f"{len(implicated)} nodes ({', '.join(sorted(implicated))}) within {window}: nothing is drained until an "
        "operator decides"
    )


def _pending_drain(state: FleetState, node: str) -> str:
    """The id of a pending drain approval that names ``node`` (empty: none)."""
    return next(
        (
            a.id
            for a in state.approvals
            if a.outcome is ApprovalOutcome.PENDING and a.kind is ApprovalKind.DRAIN and node in a.nodes
        ),
        "",
    )


def _strong_because(req: IsolationRequest, incs: list[NodeIncident], claims: bool) -> list[NodeIncident]:
    """The other jobs' incidents on a node that make it a strong suspect: any other job's before job output was a
    claim; now only a job of another known user (one user's jobs corroborate nothing)."""
    if not claims:
        return incs
    if not req.user:
        return []
    return [i for i in incs if i.user and i.user != req.user]


def decide_isolation(
    state: FleetState,
    req: IsolationRequest,
    policy: FleetPolicy,
    view: FleetView | ClusterSnapshot,
    now: datetime,
    *,
    claims: bool = True,
) -> FleetVerdict:
    """What Rebound would drain now, what waits for an operator, and what the job's next placement excludes.

    See the module docstring for the rules. The order of ``req.nodes`` is kept (first implicated = most likely),
    so when the breaker allows only some drains it is the likeliest culprits that go first. ``claims``: a job's
    output is a claim (the owners' rule of ``suspicion`` and ``_correlated``); False decides as before that rule,
    for workflow histories recorded then.
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

    # 2b. The exclude rung: a suspicion, unless the node was implicated before within the suspicion window; then
    # jobs of different users make it a drain candidate, one user's jobs only an operator's question.
    suspects: list[str] = []
    repeats: set[str] = set()
    claimed: list[str] = []
    support: dict[str, str] = {}  # node -> the evidence that supports its drain, for people
    if req.rung is ActionRung.EXCLUDE:
        earlier = earlier_implications(state, req, policy.suspicion_window_s)
        for node in candidates:
            found = earlier.get(node.name)
            users = implicating_users(found or (), req)
            if not found:
                suspects.append(node.name)
                reasons.append(
                    f"{node.name}: suspicion recorded, not drained ({req.evidence or 'only the job implicates it'})"
                )
            elif not claims or len(users) >= 2:
                repeats.add(node.name)
                reasons.append(repeat_reason(node.name, found, req, policy.suspicion_window_s, users if claims else ()))
                support[node.name] = (
                    f"implicated by jobs of users {users_text(users)}" if claims else "implicated again"
                )
            else:
                suspects.append(node.name)
                reasons.append(claim_reason(node.name, found, req, policy.suspicion_window_s, users))
                asked = _pending_drain(state, node.name)
                if asked:  # one question per node: a user crashing job after job must not flood the operators
                    reasons.append(f"{node.name}: its drain already waits for an operator ({asked}): not asked again")
                else:
                    claimed.append(node.name)
        candidates = [n for n in candidates if n.name in repeats]
    else:
        for node in candidates:
            support[node.name] = f"node-level evidence: {req.evidence or req.cause}"

    # 3. Cross-job correlation.
    window = span(policy.correlation_window_s)
    others = _other_jobs_within(state, req, policy.correlation_window_s)
    shared, why = _correlated(req, others, policy, claims)
    if why:
        reasons.append(why)

    hold: list[str] = []
    to_drain: list[SlurmNode] = []
    if shared:
        hold = [n.name for n in candidates]
        if hold:
            reasons.append(f"{', '.join(hold)}: wait for an operator (shared infrastructure suspected)")
    else:
        # 4. Low confidence and protected partitions.
        protected = set(policy.protected_partitions)
        for node in candidates:
            also = _strong_because(req, others.get(node.name, []), claims)
            strong = bool(also) or node.name in repeats
            if also:
                by = sorted({i.user for i in also if i.user})
                of = f" of user{'s' if len(by) > 1 else ''} {users_text(by)}" if claims and by else ""
                reasons.append(
                    f"{node.name}: strong suspect: also implicated by job {_jobs_text({i.job_id for i in also})}"
                    f"{of} within {window}"
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
        evidence = f": {support[name]}" if claims and name in support else ""
        reasons.append(f"{name}: {'drain' if act else 'would drain'} (confidence {req.confidence:.2f}){evidence}")

    # 6. The Nth restart.
    restart_needs_approval = (
        req.restart and policy.approve_restart_from > 0 and req.restart_number >= policy.approve_restart_from
    )
    if restart_needs_approval:
        reasons.append(
            f"restart {req.restart_number} of job {req.job_id} waits for an operator "
            f"(approve_restart_from = {policy.approve_restart_from})"
        )

    # 7. Keep all of them out of the next placement (a suspect only if the job can still be placed without it;
    # a node implicated again by one user's jobs is a suspect, its drain the operator's question).
    unavailable = unique([*drain, *hold, *external, *already, *unknown])
    kept, fit_reasons = fit_exclusion(view, req, unavailable, suspects)
    reasons += fit_reasons
    for name in kept:
        reasons.append(f"{name}: excluded from job {req.job_id}'s next placement")
    exclude = unique([*unavailable, *kept])
    return FleetVerdict(
        act=act,
        drain=tuple(drain),
        hold=tuple(unique([*hold, *claimed])),
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
