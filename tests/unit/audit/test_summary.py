"""The audit's numbers from hand-built incidents (``builders`` says what each one must give). Pure, no Temporal."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError
from temporalio.contrib.pydantic import pydantic_data_converter

from tests.unit.audit.builders import (
    CLUSTER,
    SINCE,
    UNTIL,
    approval,
    at,
    fleet_approvals,
    job_101_incidents,
    job_202_incidents,
    job_303_incidents,
    status,
)
from workflows.domain.audit import (
    MAX_AUDIT_APPROVALS,
    MAX_AUDIT_INCIDENTS,
    MAX_SUMMARY_CHARS,
    ApprovalKindRow,
    AuditCollection,
    AuditInput,
    CountRow,
    FleetApprovals,
    FleetRead,
    IncidentDigest,
    JobAudit,
    NodeRow,
)
from workflows.domain.fleet import Approval, ApprovalKind, ApprovalOutcome
from workflows.domain.incident import Anomaly, AnomalyKind, Evidence, EvidenceKind, EvidenceSource, Incident
from workflows.domain.recovery import RecoveryState
from workflows.policy.action_ladder import with_action
from workflows.policy.audit import summarise
from workflows.policy.audit_approvals import EXPIRED_DECIDER, approval_summary
from workflows.policy.audit_approvals import fleet_approvals as approvals_of_period
from workflows.policy.audit_incidents import RunRead, cap_incidents, digest_incident, incident_onset, job_audit
from workflows.policy.audit_measures import histogram, latency_stats
from workflows.policy.fleet import MAX_DECIDED_APPROVALS
from workflows.policy.goodput import downtime_s
from workflows.policy.stats import percentile

FLEET_ID = f"rebound/{CLUSTER}/fleet"


def _run(
    job_id: int, incidents: tuple[Incident, ...], start: datetime, close: datetime | None, **kw: object
) -> RunRead:
    return RunRead(
        workflow_id=f"rebound/{CLUSTER}/job/{job_id}",
        run_id=f"run-{job_id}-{start.timestamp():.0f}",
        started_at=start,
        closed_at=close,
        status=status(job_id, incidents, **kw),  # type: ignore[arg-type]
    )


def _collection() -> AuditCollection:
    jobs = [
        job_audit([_run(101, job_101_incidents(), at(-7200), None)], SINCE, UNTIL),
        job_audit([_run(202, job_202_incidents(), at(7200), at(21600), state=RecoveryState.GAVE_UP)], SINCE, UNTIL),
        job_audit([_run(303, job_303_incidents(), at(-14400), at(43200))], SINCE, UNTIL),
    ]
    assert all(j is not None for j in jobs)
    return AuditCollection(
        cluster=CLUSTER,
        since=SINCE,
        until=UNTIL,
        runs_listed=3,
        jobs=tuple(j for j in jobs if j),
        fleet=approvals_of_period(FLEET_ID, fleet_approvals(), SINCE, UNTIL),
    )


def test_counts_and_categories_of_known_incidents() -> None:
    s = summarise(_collection())
    assert (s.jobs, s.incidents, s.resumed, s.unresolved) == (3, 5, 2, 0)  # 303-1 was detected before the period
    assert s.by_anomaly == (
        CountRow(key="rank_crash", count=2),
        CountRow(key="gpu_fault", count=1),
        CountRow(key="hang", count=1),
        CountRow(key="straggler", count=1),
    )
    assert s.by_cause == (
        CountRow(key="xid-79", count=2),
        CountRow(key="node-down", count=1),
        CountRow(key="straggler", count=1),
        CountRow(key="user-bug", count=1),
    )
    assert s.by_failure_class == (
        CountRow(key="hardware", count=3),
        CountRow(key="infrastructure", count=1),
        CountRow(key="user", count=1),
    )
    assert s.top_nodes == (
        NodeRow(node="n1", incidents=2, drains=1),
        NodeRow(node="n2", incidents=1, drains=1),
        NodeRow(node="n3", incidents=1, drains=0),
    )


def test_latencies_of_known_incidents() -> None:
    s = summarise(_collection())
    # Detection: 2 s (evidence), 10 s (GPU event), 90 s (hang silence); 101-3 and 101-4 have no onset.
    assert s.detection.values == (2.0, 10.0, 90.0) and s.detection.unknown == 2
    assert (s.detection.p50, s.detection.p95, s.detection.mean, s.detection.max) == (10.0, 82.0, 34.0, 90.0)
    # Recovery action: 30, 60, 20 s; the straggler and the hang had none.
    assert s.action.values == (20.0, 30.0, 60.0) and s.action.unknown == 2
    assert (s.action.p50, s.action.p95, s.action.mean) == (30.0, 57.0, 36.667)
    assert s.resume.values == (300.0, 600.0) and (s.resume.p50, s.resume.p95) == (450.0, 585.0)


def test_goodput_of_known_incidents() -> None:
    s = summarise(_collection())
    by_job = {g.job_id: g for g in s.goodput}
    assert (by_job[101].observed_s, by_job[101].downtime_s) == (36000.0, 1500.0)
    assert by_job[101].goodput == round(1 - 1500 / 36000, 6) and by_job[101].incidents == 4
    assert (by_job[202].observed_s, by_job[202].downtime_s, by_job[202].goodput) == (14400.0, 7200.0, 0.5)
    assert (by_job[303].observed_s, by_job[303].downtime_s, by_job[303].incidents) == (36000.0, 600.0, 0)
    assert s.cluster_goodput == round(1 - (1500 + 7200 + 600) / (36000 + 14400 + 36000), 6) == 0.892361


# ----- approvals (from the Fleet) -----------------------------------------------------------------------------------


def test_approvals_of_the_period_by_kind_outcome_wait_and_decider() -> None:
    a = summarise(_collection()).approvals
    assert (a.fleet, a.fleet_workflow_id, a.total, a.pending_at_end) == (FleetRead.READ, FLEET_ID, 7, 3)
    assert a.by_kind == (
        ApprovalKindRow(kind=ApprovalKind.DRAIN, total=5, approved=2, rejected=0, expired=1, pending=2),
        ApprovalKindRow(kind=ApprovalKind.RESTART, total=2, approved=0, rejected=1, expired=0, pending=1),
    )
    # Decided in the period: a-2 20 s, a-9 60 s, a-4 900 s (requested before the period), a-5 900 s (expired).
    assert a.wait.values == (20.0, 60.0, 900.0, 900.0)
    assert (a.wait.count, a.wait.p50, a.wait.max, a.wait.mean) == (4, 480.0, 900.0, 470.0)
    assert a.deciders == (
        CountRow(key="alice", count=1),
        CountRow(key="bob", count=1),
        CountRow(key="carol", count=1),
        CountRow(key=EXPIRED_DECIDER, count=1),
    )
    assert [r.id for r in a.rows] == ["a-8", "a-4", "a-2", "a-3", "a-9", "a-5", "a-6"]
    assert (a.dropped, a.history_full) == (0, False)


def test_each_approval_is_reported_as_it_stood_at_the_end_of_the_period() -> None:
    rows = {r.id: r for r in summarise(_collection()).approvals.rows}
    # a-6 was approved by alice 600 s after the period: pending here, no wait, no decider.
    late = rows["a-6"]
    assert (late.outcome, late.decided_at, late.decided_by, late.applied, late.waited_s) == (
        ApprovalOutcome.PENDING,
        None,
        "",
        None,
        None,
    )
    done = rows["a-2"]
    assert (done.kind, done.job_id, done.incident, done.nodes, done.decided_by, done.waited_s) == (
        ApprovalKind.DRAIN,
        101,
        "101-1",
        ("n1",),
        "alice",
        20.0,
    )
    expired = rows["a-5"]
    assert (expired.outcome, expired.applied, expired.decided_by, expired.decided_at) == (
        ApprovalOutcome.EXPIRED,
        ApprovalOutcome.REJECTED,
        "",
        at(20900),
    )
    assert rows["a-4"].requested_at == at(-600) and rows["a-4"].waited_s == 900.0
    # The next period sees a-6's decision, and a-4 no more (decided before it).
    later = UNTIL + timedelta(hours=1)
    nxt = approval_summary(approvals_of_period(FLEET_ID, fleet_approvals(), UNTIL, later), UNTIL, later)
    assert {r.id: (r.outcome, r.waited_s) for r in nxt.rows} == {
        "a-3": (ApprovalOutcome.PENDING, None),
        "a-6": (ApprovalOutcome.APPROVED, 1600.0),
        "a-7": (ApprovalOutcome.PENDING, None),
        "a-8": (ApprovalOutcome.PENDING, None),
    }


def test_fleet_approvals_keeps_the_newest_within_the_limit_and_counts_the_rest() -> None:
    kept = approvals_of_period(FLEET_ID, fleet_approvals(), SINCE, UNTIL, limit=2)
    assert [d.id for d in kept.approvals] == ["a-5", "a-6"] and kept.dropped == 5
    a = approval_summary(kept, SINCE, UNTIL)
    assert (a.total, a.dropped) == (2, 5)
    with pytest.raises(ValueError, match="positive"):
        approvals_of_period(FLEET_ID, fleet_approvals(), SINCE, UNTIL, limit=0)


def test_a_fleet_at_its_bound_says_decisions_of_the_period_may_be_gone() -> None:
    def decided(first_s: float, count: int) -> list[Approval]:
        return [
            approval(
                i,
                ApprovalKind.DRAIN,
                1,
                first_s + 10 * i,
                "n1",
                decided=first_s + 10 * i + 5,
                outcome=ApprovalOutcome.APPROVED,
                by="alice",
            )
            for i in range(count)
        ]

    # At the bound, the oldest decision inside the period: older ones of the period may have been forgotten.
    assert approvals_of_period(FLEET_ID, decided(100, MAX_DECIDED_APPROVALS), SINCE, UNTIL).history_full
    # At the bound, but the oldest decision is before the period: everything the period needs is still there.
    assert not approvals_of_period(FLEET_ID, decided(-100, MAX_DECIDED_APPROVALS), SINCE, UNTIL).history_full
    # Below the bound the Fleet forgot nothing.
    assert not approvals_of_period(FLEET_ID, decided(100, MAX_DECIDED_APPROVALS - 1), SINCE, UNTIL).history_full


def test_no_fleet_reports_zero_approvals() -> None:
    missing = FleetApprovals(workflow_id=FLEET_ID, read=FleetRead.MISSING)
    coll = _collection().model_copy(update={"fleet": missing})
    a = summarise(coll).approvals
    assert (a.fleet, a.total, a.pending_at_end, a.by_kind, a.rows, a.wait.count) == (FleetRead.MISSING, 0, 0, (), (), 0)
    # A digest no longer carries approvals: they are the Fleet's alone.
    assert "approvals" not in digest_incident(job_101_incidents()[0]).model_dump()


def test_empty_period_has_no_numbers_and_no_errors() -> None:
    s = summarise(AuditCollection(cluster=CLUSTER, since=SINCE, until=UNTIL))
    assert (s.jobs, s.incidents, s.cluster_goodput, s.detection.p50, s.top_nodes, s.goodput) == (
        0,
        0,
        None,
        None,
        (),
        (),
    )


# ----- downtime edge cases ----------------------------------------------------------------------------------------


def _job(*digests: IncidentDigest, start: float = -100.0, close: float | None = None) -> JobAudit:
    return JobAudit(
        workflow_id="w",
        job_id=1,
        started_at=at(start),
        closed_at=at(close) if close is not None else None,
        incidents=digests,
    )


def _d(
    n: int, detected: float, resumed: float | None = None, kind: str = "rank_crash", requeues: int = 1
) -> IncidentDigest:
    return IncidentDigest(
        id=f"1-{n}",
        number=n,
        anomaly=kind,
        detected_at=at(detected),
        resumed_at=at(resumed) if resumed is not None else None,
        requeues=requeues,
    )


def test_downtime_is_the_union_clipped_to_the_observed_window() -> None:
    # Before the period (clipped at 0), overlapping (union), open at the end (to the window's end).
    job = _job(_d(1, -50, 100), _d(2, 80, 200), _d(3, 35000))
    assert downtime_s(job, SINCE, UNTIL) == 200 + 1000
    # A closed job: its open incident ends at the close, not at the period's end.
    assert downtime_s(_job(_d(1, 100), close=400), SINCE, UNTIL) == 300
    # A job that started after its incident (carried over) counts from its start.
    assert downtime_s(_job(_d(1, 10, 70), start=50), SINCE, UNTIL) == 20


def test_straggler_reports_cost_nothing_but_straggler_restarts_do() -> None:
    assert downtime_s(_job(_d(1, 100, kind="straggler", requeues=0)), SINCE, UNTIL) == 0
    assert downtime_s(_job(_d(1, 100, 160, kind="straggler", requeues=1)), SINCE, UNTIL) == 60


def test_unresolved_incident_lasts_until_the_next_one_not_the_end() -> None:
    job = _job(_d(1, 100), _d(2, 400, 500), _d(3, 450, kind="straggler", requeues=0))
    assert downtime_s(job, SINCE, UNTIL) == 400


# ----- merging runs (continue-as-new) and bounding ------------------------------------------------------------------


def test_runs_are_merged_and_the_latest_copy_of_an_incident_wins() -> None:
    first, second, third, _ = job_101_incidents()
    unresolved = first.model_copy(update={"resumed_at": None, "outcome": ""})
    run1 = _run(101, (unresolved, second), at(-7200), at(5000))
    run2 = _run(101, (first, second, third), at(5000), None, state=RecoveryState.VERIFYING)
    unread = RunRead(workflow_id=run1.workflow_id, run_id="lost", started_at=at(-9000), closed_at=at(-7200))
    merged = job_audit([run2, unread, run1], SINCE, UNTIL)
    assert merged is not None
    assert [d.id for d in merged.incidents] == ["101-1", "101-2", "101-3"]
    assert merged.incidents[0].resumed_at == at(3900)
    assert (merged.runs, merged.state, merged.closed_at, merged.started_at) == (3, "VERIFYING", None, at(-9000))
    assert job_audit([unread], SINCE, UNTIL) is None
    with pytest.raises(ValueError, match="one workflow id"):
        job_audit([run1, run1.model_copy(update={"workflow_id": "other"})], SINCE, UNTIL)


def test_incidents_outside_the_period_are_not_carried() -> None:
    old = job_303_incidents(SINCE - timedelta(days=1))  # resumed a day before the period
    late = job_202_incidents(UNTIL)  # detected after it
    merged = job_audit([_run(1, (*old, *late), at(-90000), None)], SINCE, UNTIL)
    assert merged is not None and merged.incidents == ()


def test_cap_keeps_the_newest_incidents() -> None:
    jobs = [_job(*(_d(n, n * 10) for n in range(1, 6))), _job(_d(1, 1000)).model_copy(update={"workflow_id": "v"})]
    capped, dropped = cap_incidents(jobs, 3)
    assert dropped == 3
    assert [d.number for d in capped[0].incidents] == [4, 5] and [d.number for d in capped[1].incidents] == [1]
    assert cap_incidents(jobs, 6) == (tuple(jobs), 0)


def test_largest_collection_payload_stays_far_below_temporals_limit() -> None:
    long_nodes = tuple(f"gpu-node-{i:04d}" for i in range(8))
    digest = IncidentDigest(
        id="1234567-99",
        number=99,
        anomaly="gpu_fault",
        summary="x" * MAX_SUMMARY_CHARS,
        detected_at=SINCE,
        onset_at=SINCE,
        failure_class="infrastructure",
        cause="xid-79",
        nodes=long_nodes,
        drained=long_nodes[:2],
        requeues=1,
        restarted_at=SINCE,
        resumed_at=SINCE,
        outcome="failed again before resuming",
    )
    per_job = MAX_AUDIT_INCIDENTS // 100
    jobs = tuple(
        JobAudit(
            workflow_id=f"rebound/cluster/job/{1000000 + j}",
            job_id=1000000 + j,
            job_name="n" * 64,
            state="WATCHING",
            started_at=SINCE,
            incidents=tuple(digest.model_copy(update={"number": i}) for i in range(per_job)),
        )
        for j in range(100)
    )
    # As many approvals as the collection carries, all decided in the period (each a row, a wait and a decider).
    many = [
        approval(
            i,
            ApprovalKind.DRAIN,
            1000000 + i,
            10 + i,
            *long_nodes,
            decided=20 + i,
            outcome=ApprovalOutcome.APPROVED,
            by=f"operator-{i:04d}",
            incident=i,
        )
        for i in range(MAX_AUDIT_APPROVALS + 50)
    ]
    fleet = approvals_of_period(FLEET_ID, many, SINCE, UNTIL)
    assert (len(fleet.approvals), fleet.dropped) == (MAX_AUDIT_APPROVALS, 50)
    coll = AuditCollection(cluster="c", since=SINCE, until=UNTIL, jobs=jobs, fleet=fleet)
    size = len(pydantic_data_converter.payload_converter.to_payloads([coll])[0].data)
    summary_size = len(pydantic_data_converter.payload_converter.to_payloads([summarise(coll)])[0].data)
    print(
        f"collection payload {size} bytes, summary {summary_size} bytes for {MAX_AUDIT_INCIDENTS} incidents and "
        f"{MAX_AUDIT_APPROVALS} approvals"
    )
    assert size < 1_000_000 and summary_size < 1_000_000  # Temporal refuses payloads over 2 MB


# ----- statistics and onset -----------------------------------------------------------------------------------------


def test_percentile_interpolates_linearly_like_numpy() -> None:
    assert percentile([1.0], 95) == 1.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert math.isclose(percentile([1.0, 2.0, 3.0, 4.0], 95), 3.85)
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_latency_stats_count_unknowns_and_skip_non_finite() -> None:
    st = latency_stats([1.0, None, float("nan"), 3.0])
    assert (st.count, st.unknown, st.p50, st.values) == (2, 2, 2.0, (1.0, 3.0))
    assert latency_stats([None]).p50 is None


def test_histogram_bins_from_zero_to_the_largest_value() -> None:
    bins = histogram([0.0, 1.0, 2.0, 4.0], bins=4)
    assert bins == ((0.0, 1.0, 1), (1.0, 2.0, 1), (2.0, 3.0, 1), (3.0, 4.0, 1))
    assert histogram([0.0, 0.0]) == ((0.0, 0.0, 2),)
    assert histogram([]) == ()
    assert sum(c for _, _, c in histogram([0.1 * i for i in range(100)])) == 100
    with pytest.raises(ValueError):
        histogram([-1.0])
    with pytest.raises(ValueError):
        histogram([1.0], bins=0)


def test_onset_ignores_evidence_after_detection_and_reads_naive_times_as_utc() -> None:
    naive = datetime(2025, 1, 1, 0, 59, 50)  # noqa: DTZ001 - a log line without a zone
    inc = Incident(
        number=1,
        id="1-1",
        detected_at=at(3600),
        anomaly=Anomaly(
            kind=AnomalyKind.RANK_CRASH,
            observed_at=at(3600),
            summary="s",
            evidence=(
                Evidence(source=EvidenceSource.LOGS, text="later", at=at(3700)),
                Evidence(source=EvidenceSource.LOGS, text="naive", at=naive),
            ),
        ),
    )
    assert incident_onset(inc) == datetime(2025, 1, 1, 0, 59, 50, tzinfo=UTC)
    later_only = inc.model_copy(
        update={"anomaly": inc.anomaly.model_copy(update={"evidence": inc.anomaly.evidence[:1]})}
    )
    assert incident_onset(later_only) is None


def test_digest_drops_evidence_and_bounds_the_summary() -> None:
    first = job_101_incidents()[0]
    long = first.model_copy(update={"anomaly": first.anomaly.model_copy(update={"summary": "y" * 1000})})
    d = digest_incident(long)
    assert len(d.summary) == MAX_SUMMARY_CHARS and "evidence" not in json.loads(d.model_dump_json())
    assert (d.drained, d.requeues, d.nodes, d.cause) == (("n1",), 1, ("n1",), "xid-79")


# ----- input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one"),
        ({"period_s": 60, "since": SINCE}, "exactly one"),
        ({"since": UNTIL, "until": SINCE}, "before"),
        ({"since": SINCE - timedelta(days=100), "until": SINCE}, "at most"),
        ({"period_s": 60, "out_dir": "reports"}, "absolute"),
        ({"since": datetime(2025, 1, 1)}, "timezone"),  # noqa: DTZ001
        ({"period_s": -1}, "greater than 0"),
    ],
)
def test_audit_input_refuses_what_cannot_work(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AuditInput(cluster="c", **kwargs)


def test_audit_window() -> None:
    now = datetime(2025, 6, 1, tzinfo=UTC)
    assert AuditInput(cluster="c", period_s=3600).window(now) == (now - timedelta(hours=1), now)
    assert AuditInput(cluster="c", since=SINCE, until=UNTIL).window(now) == (SINCE, UNTIL)
    assert AuditInput(cluster="c", since=SINCE).window(now) == (SINCE, now)


def test_digest_says_which_rung_the_evidence_allowed_and_why() -> None:
    first = job_101_incidents()[0]
    assert first.attribution is not None
    att = with_action(first.attribution.model_copy(update={"basis": EvidenceKind.RANK_EXIT}))
    d = digest_incident(first.model_copy(update={"attribution": att}))
    assert d.action == "exclude" and "a rank died with no hardware evidence" in d.action_reason
    assert digest_incident(first).action == ""  # decided before the ladder: no rung claimed
