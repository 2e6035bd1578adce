"""Scoring of `rebound bench recovery` runs against hand-built incidents and injection records (pure)."""

from __future__ import annotations

from deploy.bench.labparse import parse_rank_log
from deploy.bench.scenarios import GroundTruth
from deploy.bench.scoring import attribution_correct, false_actions, latencies, lost_work
from tests.unit.bench.builders import RANK0_LOG, T0, at, drain, incident, line, record, requeue, score, status
from workflows.domain.incident import FailureClass, TimelineEntry
from workflows.domain.recovery import RecoveryState

# ----- a correct recovery ---------------------------------------------------------------------------------------


def test_correct_attribution_scores_latencies_lost_work_and_no_false_action() -> None:
    inc = incident(actions=(drain("n2"), requeue()))  # an XID: node-level evidence, the drain is right
    r = score("xid", record("gpu-fault"), status(inc), rebound_drains=["n2"])
    assert not r.failed and r.error == ""
    assert r.attribution_correct is True
    assert (r.detection_s, r.action_s, r.resume_s) == (0.2, 1.3, 14.0)
    assert (r.last_step, r.resumed_step, r.lost_steps) == (32, 20, 12)
    assert r.resumed_from == "step_000020"
    assert r.false_actions == 0 and r.false_action_details == ()
    assert r.phases == {
        "fault_to_requeued_s": 1.5,
        "requeued_to_batch_start_s": 6.0,
        "batch_start_to_ranks_start_s": 0.5,
        "ranks_start_to_first_step_s": 6.0,
    }


def test_detection_recorded_is_the_workflows_detected_entry() -> None:
    inc = incident(actions=(drain("n2"), requeue()))
    timeline = (
        TimelineEntry(at=at(-20), event="WATCHING", detail="watching"),
        TimelineEntry(at=at(0.45), event="DETECTED", detail="rank 2 died", incident=1),
    )
    st = status(inc).model_copy(update={"timeline": timeline})
    r = score("rank-crash", record(), st)
    assert (r.detection_s, r.detection_recorded_s) == (0.2, 0.45)
    assert score("rank-crash", record(), status(inc)).detection_recorded_s is None


def test_latencies_use_first_incident_and_first_resume() -> None:
    failed_again = incident(number=1, detected=0.5, restarted=2.0, resumed=None)
    second = incident(number=2, detected=20.0, restarted=21.0, resumed=40.0)
    lat = latencies(T0, [failed_again, second])
    assert (lat.detection_s, lat.action_s, lat.resume_s) == (0.5, 1.5, 40.0)
    assert latencies(T0, []).detection_s is None


# ----- false actions --------------------------------------------------------------------------------------------


def test_false_drain_and_wrong_implicated_node_are_counted() -> None:
    inc = incident(nodes=("n1", "n2"), cause="xid-79", actions=(drain("n1"), drain("n2"), requeue()))
    r = score("xid", record("gpu-fault"), status(inc), rebound_drains=["n1", "n2", "n3"])
    # n1 drained (action and sinfo: once), n3 drained (sinfo only), n1 implicated
    assert r.false_action_details == (
        "drained healthy node n1",
        "drained healthy node n3",
        "implicated healthy node n1",
    )
    assert r.false_actions == 3
    assert r.attribution_correct is False
    assert not r.failed  # it did resume: a run with false actions still counts


def test_missing_node_is_a_misattribution_but_not_a_false_action() -> None:
    inc = incident(nodes=(), cause="unknown", actions=(requeue(),))
    r = score("node-crash", record("node-crash", rank=None), status(inc))
    assert r.attribution_correct is False
    assert r.false_actions == 0


def test_user_bug_restart_is_a_false_action() -> None:
    inc = incident(nodes=(), cause="unknown", actions=(requeue(),))
    r = score("user-bug", record("user-bug", node=None, rank=None), status(inc, restarts=1))
    assert r.false_action_details == ("restart 1 of a job no restart can help",)
    assert r.lost_steps is None and r.phases == {}


def test_user_bug_restarts_seen_by_slurm_count_even_without_actions() -> None:
    truth = GroundTruth(node=None, restart=False)
    assert false_actions(truth, [], restarts_observed=2) == [
        "restart 1 of a job no restart can help",
        "restart 2 of a job no restart can help",
    ]


def test_user_bug_given_up_is_correct() -> None:
    inc = incident(
        nodes=(),
        cause="user-bug",
        failure_class=FailureClass.USER,
        retryable=False,
        restarted=None,
        resumed=None,
    )
    r = score(
        "user-bug", record("user-bug", node=None, rank=None), status(inc, state=RecoveryState.GAVE_UP, restarts=0)
    )
    assert not r.failed
    assert r.attribution_correct is True
    assert r.false_actions == 0
    assert (r.detection_s, r.action_s, r.resume_s, r.lost_steps) == (0.2, None, None, None)


def test_user_bug_drain_is_false() -> None:
    inc = incident(
        nodes=("n1",), cause="user-bug", retryable=False, actions=(drain("n1"),), restarted=None, resumed=None
    )
    truth = GroundTruth(node=None, restart=False)
    assert false_actions(truth, [inc]) == ["drained healthy node n1", "implicated healthy node n1"]
    assert attribution_correct(truth, inc) is False


def test_a_rank_crash_that_drains_its_node_is_false() -> None:
    """A rank that exits with no hardware evidence: its node is excluded for the job, drained for nobody."""
    inc = incident(nodes=("n2",), cause="rank-crash", actions=(drain("n2"),))
    assert false_actions(GroundTruth(node="n2", restart=True, drain=False), [inc]) == [
        "drained n2 for everyone on the job's word alone (no node-level evidence)"
    ]
    assert false_actions(GroundTruth(node="n2", restart=True), [inc]) == []  # an XID: the drain is right


def test_actions_before_the_fault_are_false() -> None:
    early = incident(number=1, nodes=("n2",), actions=(drain("n2"), requeue()), detected=-5, restarted=-4, resumed=-1)
    late = incident(number=2, actions=(drain("n2"), requeue()))
    r = score("xid", record("gpu-fault"), status(early, late, restarts=2), before={1})
    assert r.incidents == 1
    assert r.detection_s == 0.2
    assert r.false_action_details == (
        "before the fault: drained healthy node n2",
        "before the fault: restart 1 of a job no restart can help",
        "before the fault: implicated healthy node n2",
    )


# ----- failed runs ----------------------------------------------------------------------------------------------


def test_not_resumed_in_time_is_a_failed_run() -> None:
    inc = incident(actions=(drain("n2"), requeue()), resumed=None)
    r = score("rank-crash", record(), status(inc, state=RecoveryState.VERIFYING), timed_out=True)
    assert r.failed
    assert r.error.startswith("timeout: not resumed in time: state VERIFYING")
    assert r.lost_steps is None


def test_gave_up_on_a_hardware_fault_is_a_failed_run() -> None:
    inc = incident(resumed=None, restarted=None)
    r = score("xid", record("gpu-fault"), status(inc, state=RecoveryState.GAVE_UP))
    assert r.failed and "workflow ended GAVE_UP without resuming" in r.error


def test_no_incident_or_no_status_is_a_failed_run() -> None:
    assert score("rank-crash", record(), status()).error.startswith("no incident recorded after the fault")
    assert score("rank-crash", record(), None).error == "no status from the workflow"


# ----- lost work ------------------------------------------------------------------------------------------------


def test_lost_work_skips_an_attempt_that_failed_before_training() -> None:
    log = [
        *RANK0_LOG[:6],
        line(8, "starting: job_id=12 restart=1 world_size=4 local_rank=0 gpu=0 pid=2 rendezvous=x steps=9 x=1"),
        line(9, "resumed from checkpoint step_000020 (step 20)"),
        line(30, "starting: job_id=12 restart=2 world_size=4 local_rank=0 gpu=0 pid=3 rendezvous=x steps=9 x=1"),
        line(31, "resumed from checkpoint step_000020 (step 20)"),
        line(32, "step=21 loss=0.5 step_time=0.1s"),
    ]
    lost = lost_work(parse_rank_log(log), 0)
    assert (lost.last_step, lost.resumed_step, lost.lost_steps) == (32, 20, 12)
    assert lost_work(parse_rank_log(RANK0_LOG[:6]), 0).lost_steps is None
