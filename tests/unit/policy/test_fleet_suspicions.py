"""The Fleet's suspicions: the exclude rung records a suspicion and drains nothing; the same node implicated again
within the window by a job of another user is drained, the incidents and users named; implicated again only by
jobs of the same user (a job's output is a claim), it stays a suspicion and its drain waits for an operator; an
exclusion that would leave the job unplaceable is not made. Pure, no Temporal."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from workers.fleet_cli import format_nodes
from workflows.domain.fleet import (
    ApprovalKind,
    BreakerStatus,
    DrainEvent,
    FleetMode,
    FleetPolicy,
    FleetState,
    FleetStatus,
    FleetVerdict,
    IsolationRequest,
    NodeLifecycle,
)
from workflows.domain.incident import ActionRung
from workflows.domain.slurm import ClusterSnapshot, NodeBaseState, SlurmNode
from workflows.policy.fleet import (
    active_suspicions,
    clear_stale_suspects,
    decide_isolation,
    note_incident,
    open_approval,
    sync_with_view,
)
from workflows.policy.fleet.suspicion import MAX_JOB_EXCLUSIONS, standing_exclusion

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POLICY = FleetPolicy(suspicion_window_s=3600.0)
ACT = FleetState(cluster="c", mode=FleetMode.ACT)
EVIDENCE = "a rank died with no hardware evidence"


def cluster(count: int, *, down: Sequence[str] = ()) -> ClusterSnapshot:
    nodes = tuple(
        SlurmNode(
            name=f"n{i}",
            state=NodeBaseState.DOWN if f"n{i}" in down else NodeBaseState.IDLE,
            partitions=("gpu",),
        )
        for i in range(1, count + 1)
    )
    return ClusterSnapshot(observed_at=T0, nodes=nodes)


def suspicion(
    *nodes: str,
    job: int = 42,
    number: int = 1,
    seconds: float = 0.0,
    rung: ActionRung = ActionRung.EXCLUDE,
    node_count: int = 2,
    excluded_before: tuple[str, ...] = (),
    owner_excluded: tuple[str, ...] = (),
    confidence: float = 0.6,
    user: str = "alice",
) -> IsolationRequest:
    return IsolationRequest(
        request_id=f"rebound/c/job/{job}/incident-{number}",
        reply_to=f"rebound/c/job/{job}",
        job_id=job,
        partition="gpu",
        incident=f"{job}-{number}",
        cause="rank-killed",
        confidence=confidence,
        nodes=nodes,
        requested_at=T0 + timedelta(seconds=seconds),
        rung=rung,
        evidence=EVIDENCE if rung is ActionRung.EXCLUDE else "",
        node_count=node_count,
        excluded_before=excluded_before,
        owner_excluded=owner_excluded,
        user=user,
    )


def handle(state: FleetState, req: IsolationRequest, view: ClusterSnapshot) -> tuple[FleetState, FleetVerdict]:
    """What the Fleet workflow does with one request: note it, then decide."""
    now = req.requested_at
    state = note_incident(state, req, now, POLICY)
    return state, decide_isolation(state, req, POLICY, view, now)


def test_a_first_suspicion_excludes_the_node_for_the_job_and_drains_nothing() -> None:
    state, verdict = handle(ACT, suspicion("n2"), cluster(4))
    assert verdict.drain == () and verdict.hold == ()
    assert verdict.suspected == ("n2",) and verdict.exclude == ("n2",)
    assert verdict.job_exclusion == ("n2",)
    record = state.nodes["n2"]
    assert record.state is NodeLifecycle.SUSPECT and record.reason.startswith("suspected (excluded, not drained)")
    assert record.incidents[-1].suspicion and "no hardware evidence" in record.incidents[-1].evidence
    assert any("n2: suspicion recorded, not drained" in r for r in verdict.reasons)


def test_the_same_job_implicating_the_node_again_asks_an_operator_and_drains_nothing() -> None:
    state, _ = handle(ACT, suspicion("n2", number=1), cluster(4))
    state, verdict = handle(state, suspicion("n2", number=2, seconds=600), cluster(4))
    assert verdict.drain == () and verdict.hold == ("n2",)  # the hold is the operator's approval of a drain
    assert verdict.suspected == ("n2",) and verdict.exclude == ("n2",) and verdict.job_exclusion == ("n2",)
    assert state.nodes["n2"].incidents[-1].suspicion and state.nodes["n2"].incidents[-1].user == "alice"
    claim = next(r for r in verdict.reasons if "implicated again" in r)
    assert claim.startswith("n2: implicated again within 1h only by jobs of user alice")
    assert "42-1 (rank-killed, job 42 of alice) and now 42-2 (rank-killed, job 42 of alice)" in claim
    assert "a job's output is a claim" in claim and claim.endswith("waits for an operator")
    # Before job output was a claim (histories recorded then), the repeat drained the node.
    legacy = decide_isolation(state, suspicion("n2", number=2, seconds=600), POLICY, cluster(4), T0, claims=False)
    assert legacy.drain == ("n2",) and legacy.suspected == ()


def test_a_node_already_waiting_for_an_operator_is_not_asked_about_again() -> None:
    state, _ = handle(ACT, suspicion("n2", number=1), cluster(4))
    state, verdict = handle(state, suspicion("n2", number=2, seconds=60), cluster(4))
    req = suspicion("n2", number=2, seconds=60)
    state, approval = open_approval(state, ApprovalKind.DRAIN, req, verdict.hold, verdict.reasons, POLICY, T0)
    state, verdict = handle(state, suspicion("n2", job=43, seconds=120), cluster(4))
    assert verdict.hold == () and verdict.drain == () and verdict.suspected == ("n2",)
    assert f"n2: its drain already waits for an operator ({approval.id}): not asked again" in verdict.reasons


def test_another_job_of_the_same_user_does_not_drain_the_node_either() -> None:
    state, _ = handle(ACT, suspicion("n3", job=7), cluster(8))
    state, verdict = handle(state, suspicion("n3", job=42, seconds=1800), cluster(8))
    assert verdict.drain == () and verdict.hold == ("n3",) and verdict.exclude == ("n3",)
    assert any("only by jobs of user alice" in r for r in verdict.reasons)


def test_jobs_of_unknown_owners_never_make_another_user() -> None:
    state, _ = handle(ACT, suspicion("n3", job=7, user=""), cluster(8))
    state, verdict = handle(state, suspicion("n3", job=42, seconds=60), cluster(8))
    assert verdict.drain == () and verdict.hold == ("n3",)
    state, _ = handle(ACT, suspicion("n3", job=7, user="bob"), cluster(8))
    state, verdict = handle(state, suspicion("n3", job=42, seconds=60, user=""), cluster(8))
    assert verdict.drain == () and verdict.hold == ("n3",)
    assert any("only by jobs of user bob" in r for r in verdict.reasons)


def test_a_job_of_another_user_within_the_window_drains_even_at_low_confidence() -> None:
    state, _ = handle(ACT, suspicion("n3", job=7, user="bob"), cluster(8))
    state, verdict = handle(state, suspicion("n3", job=42, seconds=1800, confidence=0.4), cluster(8))
    assert verdict.drain == ("n3",) and verdict.hold == ()
    repeat = next(r for r in verdict.reasons if "implicated again" in r)
    assert "7-1 (rank-killed, job 7 of bob) and now 42-1 (rank-killed, job 42 of alice)" in repeat
    assert "implicated by jobs of users alice and bob" in repeat
    assert "n3: drain (confidence 0.40): implicated by jobs of users alice and bob" in verdict.reasons


def test_a_suspicion_older_than_the_window_does_not_escalate() -> None:
    state, _ = handle(ACT, suspicion("n2", job=7, user="bob"), cluster(4))
    state, verdict = handle(state, suspicion("n2", job=42, seconds=3601), cluster(4))
    assert verdict.drain == () and verdict.suspected == ("n2",)


def test_a_repeated_request_is_not_its_own_repeat() -> None:
    state, _ = handle(ACT, suspicion("n2"), cluster(4))
    state, verdict = handle(state, suspicion("n2"), cluster(4))
    assert verdict.drain == () and verdict.suspected == ("n2",)


def test_an_escalated_drain_still_obeys_the_breaker() -> None:
    # Cap: 1 drain per window on 4 nodes; n1 drained earlier in the window.
    state, _ = handle(ACT, suspicion("n2", job=7, user="bob"), cluster(4))
    state = state.model_copy(update={"drains": (DrainEvent(at=T0, node="n1", partitions=("gpu",)),)})
    state, verdict = handle(state, suspicion("n2", seconds=60), cluster(4))
    assert verdict.drain == () and verdict.hold == ("n2",)
    assert any("breaker" in r for r in verdict.reasons)


def test_a_drain_rung_request_is_decided_as_before() -> None:
    _, verdict = handle(ACT, suspicion("n2", rung=ActionRung.DRAIN, confidence=0.95), cluster(4))
    assert verdict.drain == ("n2",) and verdict.suspected == ()


def test_node_evidence_drains_even_after_the_same_users_suspicion_and_names_it() -> None:
    # The node agent's read is evidence the job cannot forge: whoever's job it was, the node is drained.
    state, _ = handle(ACT, suspicion("n2", job=7), cluster(4))
    req = suspicion("n2", job=42, seconds=60, rung=ActionRung.DRAIN, confidence=0.95)
    req = req.model_copy(update={"evidence": "the node agent read a GPU fault"})
    state, verdict = handle(state, req, cluster(4))
    assert verdict.drain == ("n2",) and verdict.hold == ()
    assert "n2: drain (confidence 0.95): node-level evidence: the node agent read a GPU fault" in verdict.reasons


def test_an_exclusion_that_would_leave_the_job_unplaceable_is_not_made() -> None:
    # 3 nodes, n3 down: without n2 only n1 is left for a 2-node job.
    _, verdict = handle(ACT, suspicion("n2", node_count=2), cluster(3, down=("n3",)))
    assert verdict.exclude == () and verdict.suspected == ("n2",)
    assert verdict.job_exclusion == ()
    why = next(r for r in verdict.reasons if "not excluded" in r)
    assert "needs 2 nodes" in why and "keep 1 placeable" in why and "restarted without this exclusion" in why


def test_the_jobs_earlier_exclusions_count_against_its_placement() -> None:
    # 4 nodes, the job already keeps n4 out: without n2 as well, n1 and n3 are left for a 3-node job.
    _, verdict = handle(ACT, suspicion("n2", node_count=3, excluded_before=("n4",)), cluster(4))
    assert verdict.exclude == ()
    _, verdict = handle(ACT, suspicion("n2", node_count=2, excluded_before=("n4",)), cluster(4))
    assert verdict.exclude == ("n2",) and verdict.job_exclusion == ("n4", "n2")


def test_the_owners_exclusion_counts_against_placement_but_not_in_the_standing_one() -> None:
    _, verdict = handle(ACT, suspicion("n2", node_count=3, owner_excluded=("n4",)), cluster(4))
    assert verdict.exclude == ()
    _, verdict = handle(ACT, suspicion("n2", node_count=2, owner_excluded=("n4",)), cluster(4))
    assert verdict.exclude == ("n2",) and verdict.job_exclusion == ("n2",)


def test_observe_mode_records_the_suspicion_and_acts_on_nothing() -> None:
    state, verdict = handle(FleetState(cluster="c"), suspicion("n2"), cluster(4))
    assert not verdict.act and verdict.drain == ()
    assert state.nodes["n2"].incidents[-1].suspicion


def test_the_standing_exclusion_is_bounded_newest_kept() -> None:
    before = tuple(f"n{i}" for i in range(1, MAX_JOB_EXCLUSIONS + 1))
    req = suspicion("n99", excluded_before=before)
    kept = standing_exclusion(req, ["n99"])
    assert len(kept) == MAX_JOB_EXCLUSIONS and kept[-1] == "n99" and "n1" not in kept


def test_rebound_nodes_lists_the_suspicions_within_the_window() -> None:
    state, _ = handle(ACT, suspicion("n2", job=7), cluster(4))
    state, _ = handle(state, suspicion("n3", job=42, seconds=120), cluster(4))
    assert [(n, i.incident) for n, i in active_suspicions(state, POLICY, T0 + timedelta(seconds=600))] == [
        ("n3", "42-1"),
        ("n2", "7-1"),
    ]
    assert [n for n, _ in active_suspicions(state, POLICY, T0 + timedelta(seconds=3700))] == ["n3"]
    text = format_nodes(
        FleetStatus(state=state, breaker=BreakerStatus(drained_in_window=0, cap=1, open=False), policy=POLICY),
        now=T0 + timedelta(seconds=600),
    )
    assert "not drained; implicated again within 1 h by a job of another user: drained): 2" in text
    assert "n3         2026-12-01 12:02:00  job 42 of alice (42-1: rank-killed)" in text


def test_a_suspect_with_nothing_in_the_window_is_healthy_again() -> None:
    state, _ = handle(ACT, suspicion("n2"), cluster(4))
    assert clear_stale_suspects(state, POLICY, T0 + timedelta(seconds=3600)) is state  # closed window: still suspect
    later = clear_stale_suspects(state, POLICY, T0 + timedelta(seconds=3601))
    record = later.nodes["n2"]
    assert record.state is NodeLifecycle.HEALTHY and "no longer suspect" in record.reason
    assert record.incidents == state.nodes["n2"].incidents  # the history stays (lemons read it)


def sized(gpus: Sequence[int | None], cpus: int = 64) -> ClusterSnapshot:
    nodes = tuple(
        SlurmNode(name=f"n{i}", state=NodeBaseState.IDLE, partitions=("gpu",), gpus=g, cpus=cpus)
        for i, g in enumerate(gpus, start=1)
    )
    return ClusterSnapshot(observed_at=T0, nodes=nodes)


def test_the_placement_check_counts_only_nodes_big_enough_for_the_job() -> None:
    # n3 has 2 GPUs: it cannot take a node of a job that needs 4 per node.
    req = suspicion("n2", node_count=2).model_copy(update={"gpus_per_node": 4, "cpus_per_node": 16})
    _, verdict = handle(ACT, req, sized([4, 4, 2, 4]))
    assert verdict.exclude == ("n2",)
    assert "placement checked per node: 4 GPUs, 16 CPUs each" in verdict.reasons
    req = suspicion("n2", node_count=2).model_copy(update={"gpus_per_node": 4, "cpus_per_node": 16})
    _, verdict = handle(ACT, req, sized([4, 4, 2, 2]))
    assert verdict.exclude == ()
    why = next(r for r in verdict.reasons if "not excluded" in r)
    assert "needs 2 nodes with 4 GPUs, 16 CPUs" in why and "keep 1 placeable" in why
    # Too few CPUs count the same way; the rough count would have excluded n2 here.
    req = suspicion("n2", node_count=2).model_copy(update={"gpus_per_node": 0, "cpus_per_node": 128})
    _, verdict = handle(ACT, req, sized([4, 4, 4, 4]))
    assert verdict.exclude == () and any("no GPUs, 128 CPUs" in r for r in verdict.reasons)


def test_the_placement_check_says_when_it_was_rough() -> None:
    # A node's size unknown: the count falls back to placeable nodes, and the reasons say it was rough.
    req = suspicion("n2", node_count=2).model_copy(update={"gpus_per_node": 4})
    _, verdict = handle(ACT, req, sized([4, None, 2, 2], cpus=0))
    assert verdict.exclude == ("n2",)
    assert any(r.startswith("placement check was rough") for r in verdict.reasons)
    # GPUs known, CPUs not: GPUs are checked and the note names what was not.
    req = suspicion("n2", node_count=2).model_copy(update={"gpus_per_node": 4})
    _, verdict = handle(ACT, req, sized([4, 4, 2, 4], cpus=0))
    assert "placement checked per node: 4 GPUs each; CPUs unknown, not checked" in verdict.reasons


def test_implications_before_the_node_came_back_to_service_are_not_a_repeat() -> None:
    # Job 7's XID drained n2; an operator repaired and resumed it. A later rank crash on n2 is a first suspicion
    # again, not "implicated again": what was before the return was dealt with (the lemon count still sees it).
    state, verdict = handle(ACT, suspicion("n2", job=7, rung=ActionRung.DRAIN, confidence=0.95), cluster(4))
    assert verdict.drain == ("n2",)
    record = state.nodes["n2"].model_copy(
        update={"state": NodeLifecycle.DRAINED, "drained_at": T0, "drain_reason": "rebound: 7-1 xid-79"}
    )
    state = state.model_copy(update={"nodes": {**state.nodes, "n2": record}})
    state = sync_with_view(state, cluster(4), T0 + timedelta(seconds=300))  # n2 shows resumed
    assert state.nodes["n2"].state is NodeLifecycle.HEALTHY and state.nodes["n2"].returned_at is not None
    state, verdict = handle(state, suspicion("n2", job=42, seconds=600), cluster(4))
    assert verdict.drain == () and verdict.suspected == ("n2",)
    assert not any("implicated again" in r for r in verdict.reasons)
    # After the return, a second implication within the window (another user's job) is a repeat again.
    state, verdict = handle(state, suspicion("n2", job=43, seconds=900, user="bob"), cluster(4))
    assert verdict.drain == ("n2",)
    assert "42-1 (rank-killed, job 42 of alice)" in next(r for r in verdict.reasons if "implicated again" in r)
