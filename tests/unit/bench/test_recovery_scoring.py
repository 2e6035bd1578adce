"""Scoring of `rebound bench recovery` runs against hand-built incidents and injection records (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from deploy.demo.common import RankInfo
from deploy.demo.injections import InjectionRecord
from workers.bench.recovery import (
    SCENARIOS,
    GroundTruth,
    RunResult,
    attribution_correct,
    batch_starts,
    bench_report,
    false_actions,
    format_table,
    ground_truth,
    latencies,
    lost_work,
    parse_rank_log,
    parse_scenarios,
    parse_sinfo_nodes,
    pick_target,
    rebound_drained,
    scenario_summary,
    score_run,
)
from workflows.domain.incident import (
    ActionKind,
    ActionRecord,
    Anomaly,
    AnomalyKind,
    Attribution,
    FailureClass,
    Incident,
    TimelineEntry,
)
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState

T0 = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)
JOB = 12


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def record(kind: str = "crash", *, node: str | None = "n2", rank: int | None = 2) -> InjectionRecord:
    return InjectionRecord.model_validate(
        {
            "id": f"{kind}-0001",
            "kind": kind,
            "run": "r",
            "job_id": JOB,
            "restart": 0,
            "rank": rank,
            "node": node,
            "gpu": None,
            "xid": None,
            "t0": T0,
            "t0_epoch": T0.timestamp(),
            "injected_at": T0,
        }
    )


def drain(node: str, verified: float = 1.0) -> ActionRecord:
    return ActionRecord(
        key=f"k/drain-{node}", kind=ActionKind.DRAIN, target=node, decided_at=at(0.9), verified_at=at(verified)
    )


def requeue(verified: float = 1.5) -> ActionRecord:
    return ActionRecord(
        key="k/requeue", kind=ActionKind.REQUEUE, target=str(JOB), decided_at=at(1.1), verified_at=at(verified)
    )


def incident(
    *,
    number: int = 1,
    nodes: tuple[str, ...] = ("n2",),
    cause: str = "rank-crash",
    failure_class: FailureClass = FailureClass.UNKNOWN,
    retryable: bool = True,
    actions: tuple[ActionRecord, ...] = (),
    detected: float = 0.2,
    restarted: float | None = 1.5,
    resumed: float | None = 14.0,
) -> Incident:
    return Incident(
        number=number,
        id=f"{JOB}-{number}",
        detected_at=at(detected),
        anomaly=Anomaly(kind=AnomalyKind.RANK_CRASH, observed_at=at(detected), summary="rank 2 died"),
        attribution=Attribution(
            failure_class=failure_class,
            cause=cause,
            retryable=retryable,
            confidence=0.6,
            implicated_nodes=nodes,
        ),
        actions=actions,
        restarted_at=at(restarted) if restarted is not None else None,
        resumed_at=at(resumed) if resumed is not None else None,
        resumed_from="step_000020" if resumed is not None else "",
        outcome="resumed" if resumed is not None else "",
    )


def status(*incidents: Incident, state: RecoveryState = RecoveryState.WATCHING, restarts: int = 1) -> JobRecoveryStatus:
    return JobRecoveryStatus(cluster="lab", job_id=JOB, state=state, incidents=incidents, restart_count=restarts)


def line(seconds: float, msg: str, rank: int = 0, node: str = "n1") -> str:
    t = at(seconds)
    return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z [INFO] rank={rank}/4 node={node} {msg}"


RANK0_LOG = [
    line(-10, "starting: job_id=12 restart=0 world_size=4 local_rank=0 gpu=0 pid=1 rendezvous=x steps=9 x=1"),
    line(-9.9, "no checkpoint found, starting from step 0"),
    line(-9.8, "step=1 loss=0.5 step_time=0.1s"),
    line(-3, "step=20 loss=0.5 step_time=0.1s"),
    line(-2.9, "saved checkpoint step_000020 (step 20, 100 bytes, 0.01s)"),
    line(-0.1, "step=32 loss=0.5 step_time=0.1s"),
    "Traceback (most recent call last):",
    "RuntimeError: Connection closed by peer",
    line(8, "starting: job_id=12 restart=1 world_size=4 local_rank=0 gpu=0 pid=2 rendezvous=x steps=9 x=1", node="n3"),
    line(13.5, "resumed from checkpoint step_000020 (step 20)", node="n3"),
    line(14, "step=21 loss=0.5 step_time=0.1s", node="n3"),
    line(14.1, "step=22 loss=0.5 step_time=0.1s", node="n3"),
]
BATCH_LOG = [
    f"{at(-11):%Y-%m-%dT%H:%M:%S}.000Z [INFO] batch job_id=12 restart=0 nodes=n[1-2] ntasks=4 batch_host=n1 gpus=0,1",
    f"{at(7.5):%Y-%m-%dT%H:%M:%S}.500Z [INFO] batch job_id=12 restart=1 nodes=n[1,3] ntasks=4 batch_host=n1 gpus=0,1",
]


def score(scenario: str, rec: InjectionRecord, st: JobRecoveryStatus | None, **kw: object) -> RunResult:
    args: dict[str, object] = {
        "scenario": scenario,
        "index": 1,
        "run": "r",
        "record": rec,
        "status": st,
        "before": set(),
        "rebound_drains": (),
        "rank0_log": RANK0_LOG,
        "batch_log": BATCH_LOG,
        "timed_out": False,
        "wall_s": 30.0,
    }
    args.update(kw)
    return score_run(**args)  # type: ignore[arg-type]


# ----- ground truth ---------------------------------------------------------------------------------------------


def test_ground_truth_per_scenario() -> None:
    assert ground_truth("rank-crash", record()) == GroundTruth(node="n2", restart=True)
    assert ground_truth("xid", record("gpu-fault")) == GroundTruth(node="n2", restart=True)
    assert ground_truth("node-crash", record("node-crash", rank=None)) == GroundTruth(node="n2", restart=True)
    assert ground_truth("user-bug", record("user-bug", node=None, rank=None)) == GroundTruth(node=None, restart=False)
    with pytest.raises(ValueError):
        ground_truth("node-crash", record("node-crash", node=None, rank=None))


# ----- a correct recovery ---------------------------------------------------------------------------------------


def test_correct_attribution_scores_latencies_lost_work_and_no_false_action() -> None:
    inc = incident(actions=(drain("n2"), requeue()))
    r = score("rank-crash", record(), status(inc), rebound_drains=["n2"])
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


def test_actions_before_the_fault_are_false() -> None:
    early = incident(number=1, nodes=("n2",), actions=(drain("n2"), requeue()), detected=-5, restarted=-4, resumed=-1)
    late = incident(number=2, actions=(drain("n2"), requeue()))
    r = score("rank-crash", record(), status(early, late, restarts=2), before={1})
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


# ----- logs and Slurm output ------------------------------------------------------------------------------------


def test_parse_rank_log_splits_attempts() -> None:
    attempts = parse_rank_log(RANK0_LOG)
    assert [a.restart for a in attempts] == [0, 1]
    assert (attempts[0].resumed_step, attempts[0].first_step, attempts[0].last_step) == (0, 1, 32)
    assert attempts[0].saved_steps == (20,)
    assert (attempts[1].resumed_step, attempts[1].first_step, attempts[1].first_step_at) == (20, 21, at(14))


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


def test_batch_starts() -> None:
    assert batch_starts(BATCH_LOG) == {0: at(-11), 1: at(7.5)}


def test_sinfo_rows_and_this_jobs_rebound_drains() -> None:
    text = "n1|idle|none\nn2|drained|rebound: 12-1 rank-crash\nn2|drained|rebound: 12-1 rank-crash\n"
    text += "n3|drained|rebound: 120-1 xid-79\nn4|down|Not responding\n"
    rows = parse_sinfo_nodes(text)
    assert [r.node for r in rows] == ["n1", "n2", "n3", "n4"]
    assert rows[0].reason == ""
    assert rebound_drained(rows, 12) == ["n2"]


def _rank(rank: int, node: str) -> RankInfo:
    return RankInfo(
        pid=100 + rank,
        rank=rank,
        world_size=4,
        node=node,
        local_rank=rank % 2,
        restart=0,
        job_id=JOB,
        gpu=rank % 2,
        proc_start=None,
        started_at="2026-11-30T04:00:00.000Z",
    )


def test_pick_target_is_first_rank_off_the_batch_host() -> None:
    ranks = [_rank(3, "n2"), _rank(0, "n1"), _rank(2, "n2"), _rank(1, "n1")]
    assert pick_target(ranks).rank == 2
    with pytest.raises(ValueError):
        pick_target([_rank(0, "n1"), _rank(1, "n1")])
    with pytest.raises(ValueError):
        pick_target([_rank(1, "n1")])


# ----- summaries ------------------------------------------------------------------------------------------------


def test_summary_excludes_failed_runs_from_stats_and_has_exact_keys() -> None:
    ok = [
        score("rank-crash", record(), status(incident(detected=d, actions=(drain("n2"), requeue()))))
        for d in (0.2, 0.4, 0.6)
    ]
    failed = score("rank-crash", record(), status(incident(resumed=None)), timed_out=True)
    s = scenario_summary([*ok, failed])
    assert set(s) == {"runs", "detection_s", "action_s", "resume_s", "lost_steps", "false_actions", "failed_runs"}
    assert s["runs"] == 4 and s["failed_runs"] == 1
    assert s["detection_s"] == {"mean": 0.4, "p50": 0.4, "p95": 0.58}
    assert s["lost_steps"] == {"mean": 12.0, "p50": 12.0, "p95": 12.0}


def test_user_bug_summary_has_null_action_and_resume() -> None:
    inc = incident(nodes=(), cause="user-bug", retryable=False, restarted=None, resumed=None)
    r = score(
        "user-bug", record("user-bug", node=None, rank=None), status(inc, state=RecoveryState.GAVE_UP, restarts=0)
    )
    report = bench_report([r], ["user-bug", "xid"])
    assert list(report) == ["scenarios", "runs"]
    ub = report["scenarios"]["user-bug"]
    assert ub["action_s"] is None and ub["resume_s"] is None and ub["lost_steps"] is None
    assert ub["detection_s"] == {"mean": 0.2, "p50": 0.2, "p95": 0.2}
    assert report["scenarios"]["xid"]["runs"] == 0 and report["scenarios"]["xid"]["detection_s"] is None
    table = format_table(report)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["scenario", "runs", "failed", "attributed"]
    assert lines[2].split() == ["user-bug", "1", "0", "1/1", "0.20/0.20/0.20", "-", "-", "-", "0"]


def test_parse_scenarios() -> None:
    assert parse_scenarios(None) == SCENARIOS
    assert parse_scenarios("all") == SCENARIOS
    assert parse_scenarios("xid, user-bug,xid") == ("xid", "user-bug")
    with pytest.raises(ValueError):
        parse_scenarios("disk-full")
    with pytest.raises(ValueError):
        parse_scenarios(",")
