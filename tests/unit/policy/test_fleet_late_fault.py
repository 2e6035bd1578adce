"""A late node-level GPU fault on a suspected node: a drain request naming both, through the normal drain rules.
Pure, no Temporal."""

from __future__ import annotations

from datetime import timedelta

from tests.unit.policy.test_fleet_suspicions import ACT, POLICY, T0, cluster, handle, suspicion
from workflows.domain.fleet import FleetState, NodeGpuFault
from workflows.domain.gpu import GpuAction, GpuEvent, GpuEventKind
from workflows.domain.incident import ActionRung
from workflows.policy.fleet import decide_isolation, late_fault_escalation, note_incident

FLEET = "rebound/c/fleet"


def fault(node: str, seconds: float, action: GpuAction = GpuAction.DRAIN_NODE, code: int = 79) -> NodeGpuFault:
    at = T0 + timedelta(seconds=seconds)
    event = GpuEvent(kind=GpuEventKind.XID, host=node, index=0, xid=code, observed_at=at)
    return NodeGpuFault(node=node, event=event, action=action, finding=f"XID {code} (GPU has fallen off the bus)")


def suspected() -> FleetState:
    state, _ = handle(ACT, suspicion("n2"), cluster(4))
    return state


def test_a_node_level_fault_within_the_window_asks_to_drain_naming_both() -> None:
    now = T0 + timedelta(seconds=600)
    found = late_fault_escalation(suspected(), fault("n2", 590), POLICY, now, FLEET)
    assert found is not None
    req, why = found
    assert (req.nodes, req.incident, req.rung, req.restart, req.reply_to) == (
        ("n2",),
        "42-1",
        ActionRung.DRAIN,
        False,
        "",
    )
    assert req.cause == "rank-killed+xid-79" and req.request_id == f"{FLEET}/gpu-fault/n2/42-1"
    assert "suspected since 42-1 (rank-killed, job 42: a rank died with no hardware evidence)" in why
    assert "XID 79 (GPU has fallen off the bus)" in why and "drain requested" in why


def test_no_escalation_without_a_suspicion_in_the_window_or_for_the_jobs_own_fault() -> None:
    now = T0 + timedelta(seconds=7200)
    assert late_fault_escalation(suspected(), fault("n2", 3601), POLICY, now, FLEET) is None  # window is 1 h
    assert late_fault_escalation(suspected(), fault("n3", 60), POLICY, now, FLEET) is None  # not suspected
    restart_app = fault("n2", 60, GpuAction.RESTART_JOB, code=13)
    assert late_fault_escalation(suspected(), restart_app, POLICY, now, FLEET) is None


def test_the_escalation_goes_through_the_drain_rules() -> None:
    now = T0 + timedelta(seconds=600)
    state = suspected()
    found = late_fault_escalation(state, fault("n2", 590), POLICY, now, FLEET)
    assert found is not None
    req = found[0]
    state = note_incident(state, req, now, POLICY)
    verdict = decide_isolation(state, req, POLICY, cluster(4), now)
    assert verdict.act and verdict.drain == ("n2",) and not verdict.restart_needs_approval
    # An operator's word where the policy asks for it (a protected partition), and nothing in observe mode.
    guarded = POLICY.model_copy(update={"protected_partitions": ("gpu",), "approve_restart_from": 1})
    verdict = decide_isolation(state, req, guarded, cluster(4), now)
    assert verdict.drain == () and verdict.hold == ("n2",) and not verdict.restart_needs_approval
    observing = state.model_copy(update={"mode": FleetState(cluster="c").mode})
    assert not decide_isolation(observing, req, POLICY, cluster(4), now).act
