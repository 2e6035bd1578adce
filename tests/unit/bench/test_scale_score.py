"""Scoring of ``rebound bench scale``: incidents against the injector's record, and the report's exact shape."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from deploy.scale.faults import FaultKind, InjectedFault
from deploy.scale.score import Costs, RunResult, early_incidents, format_table, report_json, score
from workflows.domain.incident import Anomaly, AnomalyKind, Incident

T0 = datetime(2026, 12, 2, 8, 0, 0, tzinfo=UTC)


def _fault(kind: FaultKind, job: int, at_s: float = 0.0) -> InjectedFault:
    return InjectedFault(kind=kind, job_id=job, node="g00001", target=0, t0=(T0 + timedelta(seconds=at_s)).timestamp())


def _incident(
    number: int, detected_s: float, restarted_s: float | None = None, kind: AnomalyKind = AnomalyKind.HANG
) -> Incident:
    detected = T0 + timedelta(seconds=detected_s)
    return Incident(
        number=number,
        id=f"j-{number}",
        detected_at=detected,
        anomaly=Anomaly(kind=kind, observed_at=detected, summary="x"),
        restarted_at=None if restarted_s is None else T0 + timedelta(seconds=restarted_s),
    )


def test_first_incident_after_t0_answers_the_fault_and_others_are_false_or_extra() -> None:
    faults = [_fault(FaultKind.CRASH, 1), _fault(FaultKind.HANG, 2, at_s=100), _fault(FaultKind.XID, 3)]
    incidents = {
        1: (_incident(1, 0.4, 2.4, AnomalyKind.RANK_CRASH), _incident(2, 50.0)),  # a second one: extra
        2: (_incident(1, 20.0), _incident(2, 161.0, 165.0)),  # the first came before its fault: false
        4: (_incident(1, 30.0),),  # a job no fault touched: false
    }
    outcomes, false_count, extra = score(faults, incidents)
    assert [(o.job_id, o.detected_s, o.action_s, o.anomaly) for o in outcomes] == [
        (1, 0.4, 2.0, "rank_crash"),
        (2, 61.0, 4.0, "hang"),
        (3, None, None, ""),  # never detected
    ]
    assert (false_count, extra) == (2, 1)
    # Each false incident named, with its job's fault and how long before it the incident came.
    assert early_incidents(faults, incidents) == ["job 2 (hang -80.0 s): hang: x", "job 4 (no fault): hang: x"]


def test_an_incident_a_moment_before_t0_is_within_clock_slack() -> None:
    outcomes, false_count, _ = score([_fault(FaultKind.XID, 1, at_s=10)], {1: (_incident(1, 9.5, 12.0),)})
    assert outcomes[0].detected_s == 0.0 and false_count == 0


def _run() -> RunResult:
    faults = [_fault(FaultKind.CRASH, 1), _fault(FaultKind.XID, 2)]
    outcomes, false_count, extra = score(faults, {1: (_incident(1, 0.5, 3.5),), 2: (_incident(1, 1.5, 5.5),)})
    costs = Costs(
        window_s=600.0,
        worker_cpu_cores=0.5,
        worker_rss_mb=200.0,
        server_cpu_cores=0.2,
        server_rss_mb=300.0,
        machine_cpu_cores=1.5,
        actions=15000.0,
        heartbeats=3000.0,
        history_events=30000,
        snapshot_parse_s=0.01,
    )
    return RunResult(
        jobs=100,
        ranks=8,
        workers=1,
        minutes=10.0,
        costs=costs,
        faults=outcomes,
        false_incidents=false_count,
        extra_incidents=extra,
    )


def test_report_has_exactly_the_issues_keys_and_rates_per_job_hour() -> None:
    run = report_json([_run()])["runs"][0]  # type: ignore[index]
    assert list(run) == [
        "jobs", "ranks", "workers", "minutes", "worker_cpu_cores", "worker_rss_mb", "server_cpu_cores",
        "server_rss_mb", "machine_cpu_cores", "actions_per_s", "actions_per_job_hour", "heartbeats_per_s",
        "events_per_job_hour", "snapshot_parse_s", "detection_s", "action_s", "faults_injected",
        "faults_detected", "false_incidents",
    ]  # fmt: skip
    assert run["actions_per_s"] == 25.0
    assert run["actions_per_job_hour"] == 900.0  # 15,000 actions over 100 jobs x 1/6 h
    assert run["heartbeats_per_s"] == 5.0
    assert run["events_per_job_hour"] == 1800.0
    assert run["detection_s"] == {"p50": 1.0, "p99": 1.49}
    assert run["action_s"] == {"p50": 3.5, "p99": 3.99}
    assert (run["faults_injected"], run["faults_detected"], run["false_incidents"]) == (2, 2, 0)


def test_a_multi_worker_run_adds_its_takeover_time() -> None:
    one = _run()
    killed = one.model_copy(update={"workers": 2, "takeover_s": 12.5})
    quiet = one.model_copy(update={"workers": 2})
    runs = report_json([one, killed, quiet])["runs"]
    assert isinstance(runs, list)
    assert "takeover_s" not in runs[0]
    assert runs[1]["takeover_s"] == 12.5
    assert runs[2]["takeover_s"] is None  # two workers, no kill (or not every job held again)
    assert "takeover after a worker kill (s)" in format_table([one, killed])


def test_a_run_that_waited_for_the_steady_state_says_how_long_the_start_up_took() -> None:
    run = _run().model_copy(update={"recovering_after_s": 304.0, "steady_after_s": 95.5, "steady_query_s": 0.4})
    out = report_json([_run(), run])["runs"]
    assert isinstance(out, list)
    assert "steady_after_s" not in out[0]
    assert (out[1]["recovering_after_s"], out[1]["steady_after_s"]) == (304.0, 95.5)
    assert "slowest sampled status answer (s)" in format_table([run])


def test_table_names_every_measure_and_each_kind() -> None:
    table = format_table([_run()])
    for name in ("worker_cpu_cores", "actions_per_job_hour", "detection_s p99", "xid detected", "hang detected"):
        assert name in table
