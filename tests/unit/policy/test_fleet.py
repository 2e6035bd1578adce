"""The Fleet's pure policy: breaker, modes, ownership, correlation, approvals, node lifecycle, lemons. No Temporal."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workflows.domain.fleet import (
    Approval,
    ApprovalAnswer,
    ApprovalKind,
    ApprovalOutcome,
    DrainEvent,
    FleetMode,
    FleetPolicy,
    FleetState,
    IsolationDecision,
    IsolationRequest,
    NodeIncident,
    NodeLifecycle,
    NodeRecord,
)
from workflows.domain.names import drain_reason, is_rebound_drain
from workflows.domain.slurm import ClusterSnapshot, NodeBaseState, SlurmNode
from workflows.policy.fleet import (
    MAX_CHECKS_PER_NODE,
    MAX_DECIDED_APPROVALS,
    MAX_DECISIONS,
    MAX_INCIDENTS_PER_NODE,
    after_drain,
    after_health_check,
    answer_approval,
    approval_refusal,
    breaker_status,
    decide_isolation,
    expire_approvals,
    find_decision,
    health_checks_due,
    is_lemon,
    note_incident,
    open_approval,
    remember_decision,
    sync_with_view,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
POLICY = FleetPolicy()
ACT = FleetState(cluster="c", mode=FleetMode.ACT)
OURS = "rebound: 1-1 xid-79"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def node(name: str, *, partitions: Sequence[str] = ("gpu",), drained: str | None = None) -> SlurmNode:
    """A node; ``drained`` is the drain reason (None: not drained)."""
    flags = ("DRAIN",) if drained is not None else ()
    return SlurmNode(
        name=name, state=NodeBaseState.IDLE, flags=flags, reason=drained or "", partitions=tuple(partitions)
    )


def cluster(count: int, *, partitions: Sequence[str] = ("gpu",), extra: Iterable[SlurmNode] = ()) -> ClusterSnapshot:
    """``count`` healthy nodes n1..nN, then ``extra`` (replacing same-named ones)."""
    by_name = {f"n{i}": node(f"n{i}", partitions=partitions) for i in range(1, count + 1)}
    by_name.update({n.name: n for n in extra})
    return ClusterSnapshot(observed_at=T0, nodes=tuple(by_name.values()))


def request(
    *nodes: str,
    job: int = 1,
    number: int = 1,
    confidence: float = 0.9,
    seconds: float = 0.0,
    partition: str = "gpu",
    restart: int = 1,
    user: str | None = None,
) -> IsolationRequest:
    """A drain-rung request (an XID); its job's owner is ``user``, by default one user per job (``u<job>``)."""
    return IsolationRequest(
        request_id=f"rebound/c/job/{job}/incident-{number}",
        reply_to=f"rebound/c/job/{job}",
        job_id=job,
        partition=partition,
        incident=f"{job}-{number}",
        cause="xid-79",
        confidence=confidence,
        nodes=nodes,
        restart_number=restart,
        requested_at=at(seconds),
        user=f"u{job}" if user is None else user,
    )


def drains(*times_and_nodes: tuple[float, str], partitions: Sequence[str] = ("gpu",)) -> tuple[DrainEvent, ...]:
    return tuple(DrainEvent(at=at(t), node=n, partitions=tuple(partitions)) for t, n in times_and_nodes)


def names(count: int) -> tuple[str, ...]:
    return tuple(f"n{i}" for i in range(1, count + 1))


# ----- breaker: cap arithmetic, window, reset ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "fraction", "max_nodes", "cap"),
    [
        (4, 0.10, 4, 1),  # 0.4 floors to 0: at least one is always allowed
        (10, 0.10, 4, 1),
        (100, 0.10, 4, 4),  # 10 % would be 10: the node cap binds
        (1000, 0.10, 4, 4),
        (4, 0.10, 1000, 1),
        (10, 0.10, 1000, 1),
        (100, 0.10, 1000, 10),  # now the share binds
        (1000, 0.10, 1000, 100),
        (100, 0.29, 1000, 29),  # 0.29 x 100 is 28.999999999999996 in floating point
        (19, 0.10, 1000, 1),  # 1.9 floors
        (0, 0.10, 4, 1),
        (4, 1.0, 4, 4),
    ],
)
def test_breaker_cap_arithmetic(nodes: int, fraction: float, max_nodes: int, cap: int) -> None:
    policy = FleetPolicy(breaker_max_fraction=fraction, breaker_max_nodes=max_nodes)
    status = breaker_status(ACT, policy, nodes, T0)
    assert (status.cap, status.drained_in_window, status.open) == (cap, 0, False)


def test_breaker_opens_at_the_cap() -> None:
    state = ACT.model_copy(update={"drains": drains((0, "n1"), (10, "n2"), (20, "n3"))})
    assert breaker_status(state, POLICY, 100, at(30)).open is False  # 3 of 4
    state = state.model_copy(update={"drains": (*state.drains, *drains((25, "n4")))})
    status = breaker_status(state, POLICY, 100, at(30))
    assert (status.drained_in_window, status.cap, status.open) == (4, 4, True)


def test_breaker_window_is_closed_and_slides() -> None:
    state = ACT.model_copy(update={"drains": drains((0, "n1"), (1000, "n2"))})
    assert breaker_status(state, POLICY, 10, at(3600)).drained_in_window == 2  # exactly one window old: counts
    assert breaker_status(state, POLICY, 10, at(3600.001)).drained_in_window == 1
    assert breaker_status(state, POLICY, 10, at(4600.001)).drained_in_window == 0
    assert breaker_status(state, POLICY, 10, at(4600.001)).open is False


def test_breaker_reset_forgets_earlier_drains() -> None:
    state = ACT.model_copy(update={"drains": drains((0, "n1"), (100, "n2"), (200, "n3")), "breaker_reset_at": at(100)})
    status = breaker_status(state, POLICY, 10, at(300))
    assert status.drained_in_window == 2  # the drain at the reset instant still counts (the safe side)
    assert status.reset_at == at(100)
    assert status.open is True  # cap 1 for 10 nodes


# ----- breaker inside decide_isolation ------------------------------------------------------------------------------


def test_breaker_holds_beyond_the_cap_in_request_order() -> None:
    view = cluster(40)  # cap = min(4, 4) = 4
    state = ACT.model_copy(update={"drains": drains((0, "n40"))})
    verdict = decide_isolation(state, request("n5", "n3", "n1", "n2", "n4"), POLICY, view, at(60))
    assert verdict.drain == ("n5", "n3", "n1")  # 1 already used: 3 left, the likeliest first
    assert verdict.hold == ("n2", "n4")
    assert verdict.exclude == ("n5", "n3", "n1", "n2", "n4")
    assert any(r.startswith("n2: breaker: cluster cap 4 reached") for r in verdict.reasons)


def test_breaker_window_expiry_frees_capacity() -> None:
    view = cluster(10)  # cap 1
    state = ACT.model_copy(update={"drains": drains((0, "n9"))})
    assert decide_isolation(state, request("n1"), POLICY, view, at(3600)).hold == ("n1",)
    assert decide_isolation(state, request("n1"), POLICY, view, at(3601)).drain == ("n1",)


def test_breaker_reset_frees_capacity() -> None:
    view = cluster(10)
    state = ACT.model_copy(update={"drains": drains((0, "n9"))})
    assert decide_isolation(state, request("n1"), POLICY, view, at(60)).drain == ()
    reset = state.model_copy(update={"breaker_reset_at": at(30)})
    assert decide_isolation(reset, request("n1"), POLICY, view, at(60)).drain == ("n1",)


def test_partition_cap() -> None:
    small = [node(f"s{i}", partitions=("small",)) for i in range(1, 11)]  # 10 nodes: partition cap 1
    view = cluster(90, extra=small)  # 100 nodes: cluster cap 4
    verdict = decide_isolation(ACT, request("s1", "s2", "n1"), POLICY, view, T0)
    assert verdict.drain == ("s1", "n1")
    assert verdict.hold == ("s2",)
    assert any(r.startswith("s2: breaker: partition 'small' cap 1 reached") for r in verdict.reasons)


def test_partition_cap_counts_earlier_drains_in_that_partition() -> None:
    small = [node(f"s{i}", partitions=("small",)) for i in range(1, 11)]
    view = cluster(90, extra=small)
    state = ACT.model_copy(update={"drains": drains((0, "s9"), partitions=("small",))})
    verdict = decide_isolation(state, request("s1", "n1"), POLICY, view, at(10))
    assert (verdict.drain, verdict.hold) == (("n1",), ("s1",))
    # Another partition's drains do not use this one's capacity.
    other = ACT.model_copy(update={"drains": drains((0, "n9"), partitions=("gpu",))})
    assert decide_isolation(other, request("s1"), POLICY, view, at(10)).drain == ("s1",)


def test_node_in_two_partitions_needs_room_in_both() -> None:
    both = node("b1", partitions=("gpu", "small"))
    small = [node(f"s{i}", partitions=("small",)) for i in range(1, 10)]
    view = cluster(90, extra=[both, *small])
    state = ACT.model_copy(update={"drains": drains((0, "s9"), partitions=("small",))})
    verdict = decide_isolation(state, request("b1"), POLICY, view, at(10))
    assert verdict.hold == ("b1",)


# ----- modes --------------------------------------------------------------------------------------------------------


def test_observe_mode_computes_the_full_verdict_without_acting() -> None:
    state = FleetState(cluster="c", mode=FleetMode.OBSERVE, drains=drains((0, "n9")))
    verdict = decide_isolation(state, request("n1", "n2", "n3"), POLICY, cluster(40), at(10))
    assert verdict.act is False
    assert verdict.drain == ("n1", "n2", "n3")  # what WOULD be drained (1 of 4 used)
    assert "n1: would drain (confidence 0.90): node-level evidence: xid-79" in verdict.reasons
    assert verdict.reasons[0].startswith("observe mode")
    assert decide_isolation(state, request("n1", "n2", "n3", "n4"), POLICY, cluster(40), at(10)).hold == ("n4",)


@pytest.mark.parametrize(
    ("canary", "job_partition", "act"),
    [
        ("canary", "canary", True),
        ("canary", "canary,gpu", True),  # a job pending in several partitions: the first one decides
        ("canary", "gpu,canary", False),
        ("canary", "gpu", False),
        ("", "", False),  # no canary partition set: act nowhere
        ("", "gpu", False),
    ],
)
def test_canary_mode(canary: str, job_partition: str, act: bool) -> None:
    state = FleetState(cluster="c", mode=FleetMode.CANARY, canary_partition=canary)
    verdict = decide_isolation(state, request("n1", partition=job_partition), POLICY, cluster(10), T0)
    assert verdict.act is act
    assert verdict.drain == ("n1",)


def test_act_mode_acts() -> None:
    verdict = decide_isolation(ACT, request("n1"), POLICY, cluster(10), T0)
    assert (verdict.act, verdict.drain, verdict.exclude) == (True, ("n1",), ("n1",))
    assert "n1: drain (confidence 0.90): node-level evidence: xid-79" in verdict.reasons


# ----- ownership: external drains, our drains, unknown nodes --------------------------------------------------------


def test_external_drain_is_excluded_never_drained() -> None:
    view = cluster(10, extra=[node("n2", drained="admin: bad fan")])
    verdict = decide_isolation(ACT, request("n1", "n2"), POLICY.model_copy(update={"breaker_max_nodes": 10}), view, T0)
    assert verdict.external == ("n2",)
    assert "n2" not in verdict.drain and "n2" not in verdict.hold
    assert verdict.exclude == ("n1", "n2")
    assert any("n2: drained by someone else ('admin: bad fan')" in r for r in verdict.reasons)


def test_drain_without_reason_is_not_ours() -> None:
    view = cluster(10, extra=[node("n2", drained="")])
    assert decide_isolation(ACT, request("n2"), POLICY, view, T0).external == ("n2",)


def test_our_own_drain_is_excluded_only() -> None:
    view = cluster(10, extra=[node("n2", drained=OURS)])
    verdict = decide_isolation(ACT, request("n2", "n1"), POLICY, view, T0)
    assert verdict.external == ()
    assert verdict.drain == ("n1",)  # n2 is not drained again and uses no breaker capacity
    assert verdict.exclude == ("n1", "n2")
    assert "n2: already drained by Rebound: excluded" in verdict.reasons


def test_unknown_nodes_are_excluded_with_a_reason() -> None:
    verdict = decide_isolation(ACT, request("ghost", "n1"), POLICY, cluster(10), T0)
    assert verdict.drain == ("n1",)
    assert verdict.exclude == ("n1", "ghost")
    assert "ghost: not a node of this cluster: excluded" in verdict.reasons


def test_repeated_and_blank_nodes_are_deduplicated_in_order() -> None:
    verdict = decide_isolation(ACT, request("n3", "n1", "n3", "", "n1"), POLICY, cluster(100), T0)
    assert verdict.drain == ("n3", "n1")
    assert verdict.exclude == ("n3", "n1")


# ----- cross-job correlation -----------------------------------------------------------------------------------------


def _noted(*reqs: IsolationRequest, now: datetime = T0) -> FleetState:
    state = ACT
    for r in reqs:
        state = note_incident(state, r, now, POLICY)
    return state


def test_two_jobs_three_nodes_is_shared_infrastructure() -> None:
    state = _noted(request("n1", job=1, seconds=0))
    verdict = decide_isolation(state, request("n2", "n3", job=2, seconds=60), POLICY, cluster(100), at(60))
    assert verdict.drain == ()
    assert verdict.hold == ("n2", "n3")
    assert verdict.exclude == ("n2", "n3")
    assert any(
        r.startswith("shared infrastructure suspected: jobs 1, 2 of users u1 and u2 implicate 3 nodes")
        for r in verdict.reasons
    )


def test_two_jobs_of_three_nodes_each_hold_everything() -> None:
    state = _noted(request("n1", "n2", "n3", job=1))
    verdict = decide_isolation(state, request("n4", "n5", "n6", job=2, seconds=10), POLICY, cluster(100), at(10))
    assert (verdict.drain, verdict.hold) == ((), ("n4", "n5", "n6"))


def test_one_job_three_nodes_is_not_correlation() -> None:
    state = _noted(request("n1", "n2", job=1, number=1))  # the same job's earlier incident does not count
    verdict = decide_isolation(state, request("n1", "n2", "n3", job=1, number=2), POLICY, cluster(100), at(10))
    assert verdict.drain == ("n1", "n2", "n3")
    assert not any("shared infrastructure" in r for r in verdict.reasons)


def test_two_jobs_on_one_node_is_a_strong_suspect_not_shared_infrastructure() -> None:
    state = _noted(request("n1", job=1, confidence=0.2))
    verdict = decide_isolation(state, request("n1", job=2, confidence=0.2, seconds=30), POLICY, cluster(100), at(30))
    assert verdict.drain == ("n1",)  # low confidence, but implicated by two jobs
    assert "n1: strong suspect: also implicated by job 1 of user u1 within 5m" in verdict.reasons


def test_two_jobs_of_one_user_over_three_nodes_freeze_nothing() -> None:
    """One user's jobs cannot freeze the cluster's drains: a hostile user controls what they print and how many
    there are. Before job output was a claim, two jobs implicating three nodes froze every drain."""
    state = _noted(request("n1", job=1, user="alice"))
    verdict = decide_isolation(
        state, request("n2", "n3", job=2, seconds=60, user="alice"), POLICY, cluster(100), at(60)
    )
    assert verdict.drain == ("n2", "n3") and verdict.hold == ()
    assert not any(r.startswith("shared infrastructure suspected") for r in verdict.reasons)
    assert (
        "not shared infrastructure: jobs 1, 2 implicate 3 nodes within 5m, but all are jobs of user alice: one "
        "user's jobs cannot freeze the cluster's drains"
    ) in verdict.reasons
    # The rule before (histories recorded then) froze them.
    legacy = decide_isolation(
        state, request("n2", "n3", job=2, seconds=60, user="alice"), POLICY, cluster(100), at(60), claims=False
    )
    assert legacy.hold == ("n2", "n3")


def test_jobs_of_unknown_owners_count_for_no_user_in_correlation() -> None:
    state = _noted(request("n1", job=1, user=""))
    verdict = decide_isolation(state, request("n2", "n3", job=2, seconds=60), POLICY, cluster(100), at(60))
    assert verdict.drain == ("n2", "n3")
    # A request of an unknown owner adds no nodes to the count, but a burst of two known users holds its drains.
    state = _noted(request("n1", job=1, user="alice"), request("n4", job=3, user="bob"))
    verdict = decide_isolation(state, request("n2", job=2, seconds=60, user=""), POLICY, cluster(100), at(60))
    assert verdict.drain == ("n2",)  # n1 and n4: two nodes
    state = _noted(request("n1", "n5", job=1, user="alice"), request("n4", job=3, user="bob"))
    verdict = decide_isolation(state, request("n2", job=2, seconds=60, user=""), POLICY, cluster(100), at(60))
    assert verdict.hold == ("n2",)
    assert (
        "shared infrastructure suspected: jobs 1, 3 of users alice and bob implicate 3 nodes (n1, n4, n5) within "
        "5m: nothing is drained until an operator decides"
    ) in verdict.reasons


def test_another_job_of_the_same_user_is_no_strong_suspect() -> None:
    state = _noted(request("n1", job=1, confidence=0.2, user="alice"))
    verdict = decide_isolation(
        state, request("n1", job=2, confidence=0.2, seconds=30, user="alice"), POLICY, cluster(100), at(30)
    )
    assert verdict.hold == ("n1",) and verdict.drain == ()
    assert "n1: waits for an operator: confidence 0.20 below 0.50" in verdict.reasons


def test_low_confidence_alone_waits() -> None:
    verdict = decide_isolation(ACT, request("n1", confidence=0.2), POLICY, cluster(100), T0)
    assert (verdict.drain, verdict.hold) == ((), ("n1",))
    assert "n1: waits for an operator: confidence 0.20 below 0.50" in verdict.reasons


def test_correlation_window_expires() -> None:
    state = _noted(request("n1", job=1, confidence=0.2))
    # 301 s later: neither correlation nor a strong suspect.
    late = decide_isolation(state, request("n1", job=2, confidence=0.2, seconds=301), POLICY, cluster(100), at(301))
    assert late.hold == ("n1",)
    state = _noted(request("n1", job=1))
    late = decide_isolation(state, request("n2", "n3", job=2, seconds=301), POLICY, cluster(100), at(301))
    assert late.drain == ("n2", "n3")
    # Exactly at the window's edge the failures are still compared.
    edge = decide_isolation(state, request("n2", "n3", job=2, seconds=300), POLICY, cluster(100), at(300))
    assert edge.hold == ("n2", "n3")


def test_breaker_reset_also_acknowledges_earlier_correlated_incidents() -> None:
    state = _noted(request("n1", job=1, seconds=0))
    assert decide_isolation(state, request("n2", "n3", job=2, seconds=60), POLICY, cluster(100), at(60)).drain == ()
    reset = state.model_copy(update={"breaker_reset_at": at(30)})
    verdict = decide_isolation(reset, request("n2", "n3", job=2, seconds=60), POLICY, cluster(100), at(60))
    assert verdict.drain == ("n2", "n3")
    # Incidents after the reset are compared again.
    later = note_incident(reset, request("n4", job=3, seconds=40), at(40), POLICY)
    assert decide_isolation(later, request("n2", "n3", job=2, seconds=60), POLICY, cluster(100), at(60)).drain == ()


def test_correlation_compares_failure_times_not_processing_times() -> None:
    """A backlog worked off an hour late is compared by when the failures were reported."""
    state = _noted(request("n1", job=1, seconds=0), now=at(3600))
    verdict = decide_isolation(state, request("n2", "n3", job=2, seconds=3600), POLICY, cluster(100), at(3600))
    assert verdict.drain == ("n2", "n3")


def test_correlation_min_nodes_is_configurable() -> None:
    state = _noted(request("n1", job=1))
    policy = POLICY.model_copy(update={"correlation_min_nodes": 2})
    assert decide_isolation(state, request("n2", job=2), policy, cluster(100), T0).hold == ("n2",)
    assert decide_isolation(state, request("n2", job=2), POLICY, cluster(100), T0).drain == ("n2",)


@pytest.mark.parametrize(("confidence", "held"), [(0.49, True), (0.5, False), (0.0, True), (1.0, False)])
def test_low_confidence_boundary(confidence: float, held: bool) -> None:
    verdict = decide_isolation(ACT, request("n1", confidence=confidence), POLICY, cluster(100), T0)
    assert (verdict.hold == ("n1",)) is held
    assert (verdict.drain == ("n1",)) is not held


def test_protected_partition_always_waits() -> None:
    view = cluster(90, extra=[node("p1", partitions=("gpu", "prod"))])
    policy = POLICY.model_copy(update={"protected_partitions": ("prod",)})
    state = _noted(request("p1", job=1))  # even a strong suspect
    verdict = decide_isolation(state, request("p1", "n1", job=2, confidence=1.0), policy, view, T0)
    assert (verdict.drain, verdict.hold) == (("n1",), ("p1",))
    assert "p1: waits for an operator: protected partition prod" in verdict.reasons


@pytest.mark.parametrize(("start", "restart", "needs"), [(0, 1, False), (0, 99, False), (3, 2, False), (3, 3, True)])
def test_restart_approval(start: int, restart: int, needs: bool) -> None:
    policy = POLICY.model_copy(update={"approve_restart_from": start})
    verdict = decide_isolation(ACT, request("n1", restart=restart), policy, cluster(10), T0)
    assert verdict.restart_needs_approval is needs
    assert any(r.startswith(f"restart {restart} of job 1 waits") for r in verdict.reasons) is needs


def test_no_nodes_no_drain() -> None:
    verdict = decide_isolation(ACT, request(), POLICY, cluster(10), T0)
    assert (verdict.drain, verdict.hold, verdict.exclude) == ((), (), ())


# ----- note_incident and lemons ---------------------------------------------------------------------------------------


def test_note_incident_marks_suspects_and_is_idempotent() -> None:
    req = request("n1", "n2")
    state = note_incident(ACT, req, T0, POLICY)
    assert [state.nodes[n].state for n in ("n1", "n2")] == [NodeLifecycle.SUSPECT] * 2
    assert state.nodes["n1"].incidents[0].request_id == req.request_id
    assert note_incident(state, req, at(10), POLICY) is state
    assert len(note_incident(state, request("n1", number=2), at(10), POLICY).nodes["n1"].incidents) == 2


def test_note_incident_does_not_demote_a_drained_node() -> None:
    state = ACT.model_copy(update={"nodes": {"n1": NodeRecord(node="n1", state=NodeLifecycle.DRAINED)}})
    assert note_incident(state, request("n1"), T0, POLICY).nodes["n1"].state is NodeLifecycle.DRAINED


def test_note_incident_bounds_and_forgets() -> None:
    state = ACT
    for i in range(MAX_INCIDENTS_PER_NODE + 5):
        state = note_incident(state, request("n1", number=i, seconds=i), at(i), POLICY)
    incidents = state.nodes["n1"].incidents
    assert len(incidents) == MAX_INCIDENTS_PER_NODE
    assert incidents[-1].incident == f"1-{MAX_INCIDENTS_PER_NODE + 4}"
    later = at(POLICY.lemon_window_s + 55)
    state = note_incident(state, request("n1", number=999, seconds=POLICY.lemon_window_s + 55), later, POLICY)
    assert [i.incident for i in state.nodes["n1"].incidents] == ["1-999"]  # the rest are older than the window


def test_lemon_after_three_incidents() -> None:
    state = ACT
    for i in range(1, 3):
        state = note_incident(state, request("n1", job=i, seconds=i * 3600), at(i * 3600), POLICY)
    assert is_lemon(state.nodes["n1"], POLICY, at(3 * 3600)) is False
    state = note_incident(state, request("n1", job=3, seconds=3 * 3600), at(3 * 3600), POLICY)
    assert is_lemon(state.nodes["n1"], POLICY, at(3 * 3600)) is True
    # The first incident leaves the window: two are left.
    assert is_lemon(state.nodes["n1"], POLICY, at(3600 + POLICY.lemon_window_s)) is True
    assert is_lemon(state.nodes["n1"], POLICY, at(3601 + POLICY.lemon_window_s)) is False


# ----- after_drain and health checks -------------------------------------------------------------------------------


def test_after_drain_records_the_drain_and_counts_it_once() -> None:
    req = request("n1")
    state = after_drain(ACT, "n1", OURS, req, ("gpu",), at(5), POLICY)
    record = state.nodes["n1"]
    assert (record.state, record.drained_at, record.drain_reason) == (NodeLifecycle.DRAINED, at(5), OURS)
    assert record.partitions == ("gpu",)
    assert len(record.incidents) == 1  # noted even when the workflow did not call note_incident first
    assert state.drains == (DrainEvent(at=at(5), node="n1", partitions=("gpu",), incident="1-1"),)
    assert after_drain(state, "n1", OURS, req, ("gpu",), at(6), POLICY) is state
    assert breaker_status(state, POLICY, 100, at(6)).drained_in_window == 1


def test_after_drain_holds_a_lemon() -> None:
    state = ACT
    for job in (1, 2):
        state = note_incident(state, request("n1", job=job, seconds=job), at(job), POLICY)
    state = after_drain(state, "n1", OURS, request("n1", job=3, seconds=3), ("gpu",), at(3), POLICY)
    record = state.nodes["n1"]
    assert record.state is NodeLifecycle.HELD
    assert record.reason == "lemon: 3 incidents in 7d"
    assert health_checks_due(state, POLICY, at(10_000)) == []


def test_drain_history_is_bounded() -> None:
    policy = POLICY.model_copy(update={"breaker_window_s": 100.0})
    state = ACT
    for i in range(10):
        state = after_drain(state, f"n{i}", OURS, request(f"n{i}", number=i), (), at(i * 50), policy)
    # Kept: the last two windows (200 s) before the latest drain at 450 s.
    assert [d.at for d in state.drains] == [at(t) for t in (250, 300, 350, 400, 450)]


def test_health_checks_due() -> None:
    state = after_drain(ACT, "n1", OURS, request("n1"), ("gpu",), T0, POLICY)
    state = after_drain(state, "n2", OURS, request("n2", job=2), ("gpu",), at(30), POLICY)
    held = NodeRecord(node="n3", state=NodeLifecycle.HELD, drained_at=T0)
    ext = NodeRecord(node="n4", state=NodeLifecycle.EXTERNAL, drained_at=T0)
    state = state.model_copy(update={"nodes": {**state.nodes, "n3": held, "n4": ext}})
    assert health_checks_due(state, POLICY, at(59.9)) == []
    assert health_checks_due(state, POLICY, at(60)) == ["n1"]
    assert health_checks_due(state, POLICY, at(1000)) == ["n1", "n2"]
    assert health_checks_due(state, POLICY.model_copy(update={"health_check_after_s": 0.0}), T0) == ["n1"]


def _drained(reason: str = OURS) -> tuple[FleetState, ClusterSnapshot]:
    state = after_drain(ACT, "n1", OURS, request("n1"), ("gpu",), T0, POLICY)
    view = cluster(4, extra=[node("n1", drained=reason)] if reason else [])
    return state, view


def test_health_check_passed_returns_the_node() -> None:
    state, view = _drained()
    state, resume = after_health_check(state, "n1", True, "dcgm diag ok", POLICY, at(120), view)
    assert resume is True
    record = state.nodes["n1"]
    assert (record.state, record.reason) == (NodeLifecycle.HEALTHY, "returned to service: dcgm diag ok")
    assert record.checks == (f"{at(120).isoformat()} pass: dcgm diag ok",)


def test_health_check_failed_holds_the_node() -> None:
    state, view = _drained()
    state, resume = after_health_check(state, "n1", False, "xid 79 again", POLICY, at(120), view)
    assert resume is False
    assert (state.nodes["n1"].state, state.nodes["n1"].reason) == (
        NodeLifecycle.HELD,
        "failed health check: xid 79 again",
    )
    assert health_checks_due(state, POLICY, at(10_000)) == []


def test_health_check_never_resumes_a_reason_someone_changed() -> None:
    state, view = _drained("admin: RMA 1234")
    state, resume = after_health_check(state, "n1", True, "ok", POLICY, at(120), view)
    assert resume is False
    assert state.nodes["n1"].state is NodeLifecycle.EXTERNAL
    # Not even another Rebound reason: only exactly the one we set.
    state, view = _drained("rebound: 9-9 other")
    assert after_health_check(state, "n1", True, "ok", POLICY, at(120), view)[1] is False


def test_health_check_after_an_operator_resumed_the_node() -> None:
    state, view = _drained("")
    state, resume = after_health_check(state, "n1", True, "ok", POLICY, at(120), view)
    assert resume is False
    assert (state.nodes["n1"].state, state.nodes["n1"].reason) == (NodeLifecycle.HEALTHY, "resumed by an operator")


def test_health_check_passed_but_lemon_or_no_return() -> None:
    state, view = _drained()
    record = state.nodes["n1"]
    extra = tuple(NodeIncident(at=at(-i), job_id=10 + i, incident=f"x{i}", cause="xid") for i in range(1, 3))
    lemon = state.model_copy(
        update={"nodes": {"n1": record.model_copy(update={"incidents": record.incidents + extra})}}
    )
    new, resume = after_health_check(lemon, "n1", True, "ok", POLICY, at(120), view)
    assert (resume, new.nodes["n1"].state, new.nodes["n1"].reason) == (
        False,
        NodeLifecycle.HELD,
        "lemon: 3 incidents in 7d",
    )
    keep = POLICY.model_copy(update={"return_healthy_nodes": False})
    new, resume = after_health_check(state, "n1", True, "ok", keep, at(120), view)
    assert (resume, new.nodes["n1"].state) == (False, NodeLifecycle.HELD)


def test_health_check_of_unknown_or_vanished_node() -> None:
    state, view = _drained()
    assert after_health_check(state, "nope", True, "ok", POLICY, at(120), view) == (state, False)
    gone = cluster(4)
    gone = gone.model_copy(update={"nodes": tuple(n for n in gone.nodes if n.name != "n1")})
    new, resume = after_health_check(state, "n1", True, "ok", POLICY, at(120), gone)
    assert (resume, new.nodes["n1"].state) == (False, NodeLifecycle.HELD)


def test_health_check_results_are_bounded() -> None:
    state, view = _drained()
    held = state.model_copy(
        update={"nodes": {"n1": state.nodes["n1"].model_copy(update={"state": NodeLifecycle.HELD})}}
    )
    for i in range(MAX_CHECKS_PER_NODE + 3):
        held, resume = after_health_check(held, "n1", True, f"run {i}", POLICY, at(i), view)
        assert resume is False  # HELD: recorded, never resumed
    checks = held.nodes["n1"].checks
    assert len(checks) == MAX_CHECKS_PER_NODE
    assert checks[-1].endswith(f"run {MAX_CHECKS_PER_NODE + 2}")


# ----- sync_with_view ----------------------------------------------------------------------------------------------


def test_sync_operator_resume_makes_our_node_healthy() -> None:
    state, _ = _drained()
    synced = sync_with_view(state, cluster(4), at(10))
    assert (synced.nodes["n1"].state, synced.nodes["n1"].reason) == (NodeLifecycle.HEALTHY, "resumed by an operator")


def test_sync_external_drain_of_a_suspect() -> None:
    state = note_incident(ACT, request("n1"), T0, POLICY)
    view = cluster(4, extra=[node("n1", drained="admin: fan")])
    synced = sync_with_view(state, view, at(10))
    assert synced.nodes["n1"].state is NodeLifecycle.EXTERNAL
    # ... and it is never drained (nor resumed) by Rebound, whatever comes next.
    verdict = decide_isolation(synced, request("n1", job=2), POLICY, view, at(20))
    assert (verdict.drain, verdict.external) == ((), ("n1",))
    assert health_checks_due(synced, POLICY.model_copy(update={"health_check_after_s": 0.0}), at(9999)) == []
    assert after_health_check(synced, "n1", True, "ok", POLICY, at(30), view)[1] is False
    # Once nobody's drain is left, the node is healthy again.
    back = sync_with_view(synced, cluster(4), at(40))
    assert back.nodes["n1"].state is NodeLifecycle.HEALTHY


def test_sync_mid_drain() -> None:
    draining = NodeRecord(node="n1", state=NodeLifecycle.DRAINING, reason="rebound: 1-1 xid-79")
    state = ACT.model_copy(update={"nodes": {"n1": draining}})
    assert sync_with_view(state, cluster(4), at(1)) is state  # the drain may not show yet
    assert sync_with_view(state, cluster(4, extra=[node("n1", drained=OURS)]), at(1)) is state  # after_drain's
    taken = sync_with_view(state, cluster(4, extra=[node("n1", drained="admin: first")]), at(1))
    assert taken.nodes["n1"].state is NodeLifecycle.EXTERNAL


def test_sync_our_drain_taken_over() -> None:
    state, _ = _drained()
    synced = sync_with_view(state, cluster(4, extra=[node("n1", drained="admin: keep out")]), at(10))
    assert synced.nodes["n1"].state is NodeLifecycle.EXTERNAL


def test_sync_without_changes_returns_the_same_state() -> None:
    state, view = _drained()
    assert sync_with_view(state, view, at(10)) is state
    suspect = note_incident(ACT, request("n1"), T0, POLICY)
    assert sync_with_view(suspect, cluster(4), at(10)) is suspect  # not drained: stays a suspect
    assert sync_with_view(suspect, cluster(4, extra=[node("n1", drained=OURS)]), at(10)) is suspect


# ----- approvals ------------------------------------------------------------------------------------------------------

OPS = POLICY.model_copy(update={"operators": ("alice", "bob")})


def _open(state: FleetState = ACT, *, number: int = 1) -> tuple[FleetState, Approval]:
    return open_approval(state, ApprovalKind.DRAIN, request("n1", number=number), ["n1"], ["breaker"], OPS, T0)


def test_open_approval_numbers_and_deadline() -> None:
    state, first = _open()
    assert (first.id, first.deadline, first.outcome) == ("a-1", at(900), ApprovalOutcome.PENDING)
    state, second = _open(state, number=2)
    assert second.id == "a-2"
    assert state.next_approval == 3
    # The same request and kind again: the pending one, not a second question to the operator.
    again, same = _open(state, number=2)
    assert (again, same) == (state, second)


def test_answer_approval_and_not_twice() -> None:
    state, _ = _open()
    answer = ApprovalAnswer(approval_id="a-1", operator="alice", approve=False, note="switch issue")
    state = answer_approval(state, answer, at(60))
    a = state.approvals[0]
    assert (a.outcome, a.applied, a.decided_by, a.decided_at, a.note) == (
        ApprovalOutcome.REJECTED,
        ApprovalOutcome.REJECTED,
        "alice",
        at(60),
        "switch issue",
    )
    second = ApprovalAnswer(approval_id="a-1", operator="bob", approve=True)
    assert approval_refusal(state, "a-1") == "approval a-1 is not pending: already rejected by alice"
    assert answer_approval(state, second, at(70)) is state
    state, _ = _open(state, number=2)
    state = answer_approval(state, ApprovalAnswer(approval_id="a-2", operator="bob", approve=True), at(80))
    assert state.approvals[1].applied is ApprovalOutcome.APPROVED


@pytest.mark.parametrize(
    ("default", "applied"),
    [
        (ApprovalOutcome.REJECTED, ApprovalOutcome.REJECTED),
        (ApprovalOutcome.APPROVED, ApprovalOutcome.APPROVED),
        (ApprovalOutcome.EXPIRED, ApprovalOutcome.REJECTED),  # nonsense default: the safe side
    ],
)
def test_expire_approvals(default: ApprovalOutcome, applied: ApprovalOutcome) -> None:
    policy = OPS.model_copy(update={"approval_default": default})
    state, _ = _open()
    assert expire_approvals(state, policy, at(899.9)) == (state, [])
    state, expired = expire_approvals(state, policy, at(900))
    assert [(a.id, a.outcome, a.applied) for a in expired] == [("a-1", ApprovalOutcome.EXPIRED, applied)]
    assert state.approvals[0].outcome is ApprovalOutcome.EXPIRED
    assert state.approvals[0].note == f"no answer within 15m: {applied.value} by default"
    assert expire_approvals(state, policy, at(2000)) == (state, [])


def test_decided_approvals_are_bounded_pending_ones_kept() -> None:
    state, _ = _open(number=0)  # stays pending throughout
    for i in range(1, MAX_DECIDED_APPROVALS + 6):
        state, a = _open(state, number=i)
        state = answer_approval(state, ApprovalAnswer(approval_id=a.id, operator="alice", approve=True), at(i))
        state = state.model_copy(  # the workflow carried the answer out
            update={
                "approvals": tuple(
                    x.model_copy(update={"carried_out": x.id == a.id or x.carried_out}) for x in state.approvals
                )
            }
        )
    assert state.approvals[0].id == "a-1" and state.approvals[0].outcome is ApprovalOutcome.PENDING
    decided = [a for a in state.approvals if a.outcome is not ApprovalOutcome.PENDING]
    assert len(decided) == MAX_DECIDED_APPROVALS
    assert decided[-1].id == f"a-{MAX_DECIDED_APPROVALS + 6}"


def test_bounding_never_drops_an_answer_not_yet_carried_out() -> None:
    state = ACT
    for i in range(MAX_DECIDED_APPROVALS + 20):
        state, _ = _open(state, number=i)
    state, expired = expire_approvals(state, OPS, at(1000))  # a burst: more than the bound decided at once
    assert len(expired) == len(state.approvals) == MAX_DECIDED_APPROVALS + 20
    carried = tuple(a.model_copy(update={"carried_out": True}) for a in state.approvals[:30])
    done = state.model_copy(update={"approvals": carried + state.approvals[30:]})
    state, _ = _open(done, number=10_000)  # bounding runs again: only carried-out ones may go
    kept = [a for a in state.approvals if a.outcome is not ApprovalOutcome.PENDING]
    assert len(kept) == MAX_DECIDED_APPROVALS
    assert [a.id for a in kept][:10] == [f"a-{i}" for i in range(21, 31)]
    assert all(not a.carried_out for a in kept[10:])


# ----- decisions ---------------------------------------------------------------------------------------------------


def test_remember_and_find_decisions() -> None:
    state = ACT
    for i in range(MAX_DECISIONS + 5):
        state = remember_decision(state, IsolationDecision(request_id=f"r{i}", mode=FleetMode.ACT, act=True))
    assert len(state.decisions) == MAX_DECISIONS
    assert find_decision(state, "r0") is None
    assert find_decision(state, f"r{MAX_DECISIONS + 4}") is not None
    updated = IsolationDecision(request_id="r100", mode=FleetMode.ACT, act=False, drained=("n1",))
    state = remember_decision(state, updated)
    assert find_decision(state, "r100") == updated
    assert sum(d.request_id == "r100" for d in state.decisions) == 1


# ----- the breaker and ownership hold under any sequence of events --------------------------------------------------

_SIZES = {"a": 8, "b": 4}  # partition -> node count
_NODES = [f"{p}{i}" for p, n in _SIZES.items() for i in range(1, n + 1)]

_request = st.tuples(
    st.just("request"),
    st.integers(1, 4),  # job
    st.lists(st.sampled_from(_NODES), min_size=1, max_size=5),
    st.sampled_from([0.1, 0.5, 0.9, 1.0]),
    st.integers(0, 1500),  # seconds since the previous event
)
_external = st.tuples(st.just("external"), st.sampled_from(_NODES), st.integers(0, 600))
_undrain = st.tuples(st.just("operator_resume"), st.sampled_from(_NODES), st.integers(0, 600))
_check = st.tuples(st.just("check"), st.booleans(), st.integers(0, 600))


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(st.one_of(_request, _request, _request, _external, _undrain, _check), min_size=5, max_size=60),
    fraction=st.sampled_from([0.1, 0.25, 0.5, 1.0]),
    max_nodes=st.integers(1, 6),
    min_nodes=st.integers(2, 4),
)
def test_breaker_and_ownership_hold_for_any_sequence(
    events: list[tuple[object, ...]], fraction: float, max_nodes: int, min_nodes: int
) -> None:
    policy = FleetPolicy(
        breaker_max_fraction=fraction,
        breaker_max_nodes=max_nodes,
        correlation_min_nodes=min_nodes,
        health_check_after_s=300.0,
    )
    view = {n: node(n, partitions=(n[0],)) for n in _NODES}
    state = ACT
    now = T0
    done: list[DrainEvent] = []  # every drain ever, unbounded (the state keeps only recent ones)
    number = 0
    for event in events:
        kind, *args = event
        delay = args[-1]
        assert isinstance(delay, int)
        now += timedelta(seconds=delay)
        if kind == "external":
            name = str(args[0])
            # An administrator drains it, or takes over a drain Rebound set by rewriting the reason.
            view[name] = node(name, partitions=(name[0],), drained="admin: pulled for RMA")
        elif kind == "operator_resume":
            name = str(args[0])
            view[name] = node(name, partitions=(name[0],))
        snapshot = ClusterSnapshot(observed_at=now, nodes=tuple(view.values()))
        state = sync_with_view(state, snapshot, now)
        if kind == "request":
            job, nodes, confidence = args[0], args[1], args[2]
            assert isinstance(job, int) and isinstance(nodes, list) and isinstance(confidence, float)
            number += 1
            req = request(*nodes, job=job, number=number, confidence=confidence)
            req = req.model_copy(update={"requested_at": now})
            verdict = decide_isolation(state, req, policy, snapshot, now)
            foreign = {n for n, s in view.items() if s.is_drained and not is_rebound_drain(s.reason)}
            assert not foreign & set(verdict.drain)
            assert set(verdict.external) <= foreign
            assert not set(verdict.drain) & set(verdict.hold)
            assert set(verdict.drain) | set(verdict.hold) | set(verdict.external) <= set(verdict.exclude)
            state = note_incident(state, req, now, policy)
            for name in verdict.drain:
                reason = drain_reason(req.incident, req.cause)
                view[name] = node(name, partitions=(name[0],), drained=reason)
                state = after_drain(state, name, reason, req, (name[0],), now, policy)
                done.append(DrainEvent(at=now, node=name, partitions=(name[0],)))
        elif kind == "check":
            for name in health_checks_due(state, policy, now):
                owned_before = view[name].reason == state.nodes[name].drain_reason and view[name].is_drained
                state, resume = after_health_check(state, name, bool(args[0]), "diag", policy, now, snapshot)
                if resume:
                    assert owned_before and is_rebound_drain(view[name].reason)
                    view[name] = node(name, partitions=(name[0],))

    window = timedelta(seconds=policy.breaker_window_s)
    cap = max(1, min(max_nodes, int(fraction * len(_NODES) + 1e-9)))
    for last in done:
        in_window = [d for d in done if last.at - window <= d.at <= last.at]
        assert len(in_window) <= cap
        for part, size in _SIZES.items():
            assert sum(part in d.partitions for d in in_window) <= max(1, int(fraction * size + 1e-9))
