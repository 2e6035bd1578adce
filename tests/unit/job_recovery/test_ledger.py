"""The incident ledger (``workflows.job_recovery.ledger``): pure functions over a job's status, no Temporal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.domain.fleet import FleetMode, IsolationDecision
from workflows.domain.incident import ActionKind, ActionRecord, Anomaly, AnomalyKind, Attribution, FailureClass
from workflows.domain.procs import RankStack
from workflows.domain.recovery import MAX_CARRIED_INCIDENTS, MAX_TIMELINE, JobRecoveryStatus, RecoveryState
from workflows.domain.slurm import JobState, SlurmJob
from workflows.job_recovery import ledger

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _status(**kw: object) -> JobRecoveryStatus:
    return JobRecoveryStatus.model_validate({"cluster": "c", "job_id": 42, "state": RecoveryState.WATCHING} | kw)


def _anomaly(minute: int = 0) -> Anomaly:
    return Anomaly(kind=AnomalyKind.RANK_CRASH, observed_at=T0 + timedelta(minutes=minute), summary="rank 2 died")


def _opened(count: int, status: JobRecoveryStatus | None = None) -> JobRecoveryStatus:
    st = status or _status()
    for i in range(count):
        st, _ = ledger.open_incident(st, anomaly=_anomaly(i))
    return st


def test_an_incident_opens_with_the_next_number_dated_by_its_anomaly() -> None:
    st, number = ledger.open_incident(_status(), anomaly=_anomaly(3), outcome="")
    assert number == 1
    inc = ledger.incident(st, 1)
    assert inc.id == "42-1" and inc.detected_at == T0 + timedelta(minutes=3) and inc.anomaly == _anomaly(3)
    st, number = ledger.open_incident(st, anomaly=_anomaly(4))
    assert number == 2 and [i.number for i in st.incidents] == [1, 2]


def test_numbers_go_on_after_continue_as_new_carried_only_the_newest_incidents() -> None:
    st = ledger.carry(_opened(MAX_CARRIED_INCIDENTS + 5))
    assert len(st.incidents) == MAX_CARRIED_INCIDENTS and st.incidents[0].number == 6 and st.runs == 2
    assert ledger.next_number(st) == MAX_CARRIED_INCIDENTS + 6


def test_a_reported_incident_opens_with_its_attribution_and_outcome() -> None:
    attribution = Attribution(failure_class=FailureClass.HARDWARE, cause="straggler", retryable=True, confidence=0.5)
    st, number = ledger.open_incident(_status(), anomaly=_anomaly(), attribution=attribution, outcome="reported")
    inc = ledger.incident(st, number)
    assert inc.attribution == attribution and inc.outcome == "reported"


def test_outcome_and_attribution_change_only_their_incident() -> None:
    st = _opened(2)
    attribution = Attribution(failure_class=FailureClass.USER, cause="user-bug", retryable=False, confidence=0.9)
    st = ledger.set_outcome(ledger.set_attribution(st, 1, attribution), 1, "not retryable")
    assert ledger.incident(st, 1).outcome == "not retryable" and ledger.incident(st, 1).attribution == attribution
    assert ledger.incident(st, 2).outcome == "" and ledger.incident(st, 2).attribution is None


def test_an_action_is_added_when_decided_and_replaced_when_verified() -> None:
    st = _opened(1)
    decided = ActionRecord(key="wf/incident-1/requeue", kind=ActionKind.REQUEUE, target="42", decided_at=T0)
    st = ledger.add_action(st, 1, decided)
    verified = decided.model_copy(update={"verified_at": T0 + timedelta(seconds=2), "result": "PENDING restart 1"})
    st = ledger.mark_restarted(ledger.replace_action(st, 1, verified), 1, T0 + timedelta(seconds=2))
    inc = ledger.incident(st, 1)
    assert inc.actions == (verified,) and inc.restarted_at == T0 + timedelta(seconds=2)
    assert inc.recovery_action_s == 2.0


def test_a_resumed_incident_keeps_when_and_from_which_checkpoint() -> None:
    st = ledger.mark_resumed(_opened(1), 1, T0, "step_000005")
    inc = ledger.incident(st, 1)
    assert inc.resumed_at == T0 and inc.resumed_from == "step_000005"


def test_hang_evidence_is_kept_with_its_incident() -> None:
    stack = RankStack(rank=3, pid=99, node="n2", text="...")
    st = ledger.add_hang_evidence(_opened(1), 1, stacks=(stack,), processes=(), odd_ranks=(3,))
    assert ledger.incident(st, 1).stacks == (stack,) and ledger.incident(st, 1).odd_ranks == (3,)


def test_the_fleets_drains_become_verified_actions_once_and_its_reasons_timeline_entries() -> None:
    st = _opened(1)
    decision = IsolationDecision(
        request_id="rebound/c/job/42/incident-1",
        mode=FleetMode.ACT,
        act=True,
        drained=("n2",),
        approvals=("a-1",),
        reasons=("n2: xid-79", "breaker closed"),
        decided_at=T0,
    )
    st = ledger.record_decision(st, 1, decision, fleet_id="rebound/c/fleet", now=T0 + timedelta(seconds=1))
    st = ledger.record_decision(st, 1, decision, fleet_id="rebound/c/fleet", now=T0 + timedelta(seconds=9))
    (drain,) = ledger.incident(st, 1).actions
    assert drain.key == "rebound/c/fleet/rebound/c/job/42/incident-1/drain-n2" and drain.kind is ActionKind.DRAIN
    assert drain.decided_at == drain.verified_at == T0 and drain.result == "drained by the Fleet"
    assert [(e.event, e.incident) for e in st.timeline] == [("DRAINED", 1), ("FLEET", 1)] * 2
    assert st.note == "mode act; n2: xid-79; breaker closed; awaiting approval a-1 (rebound approve ID)"


def test_the_timeline_keeps_the_newest_entries_and_its_last_detail_is_the_note() -> None:
    st = _status()
    for i in range(MAX_TIMELINE + 10):
        st = ledger.record(st, T0, "CHANGED", f"change {i}")
    assert len(st.timeline) == MAX_TIMELINE and st.timeline[0].detail == "change 10"
    assert st.note == f"change {MAX_TIMELINE + 9}"


def test_a_state_change_is_a_timeline_entry_named_after_the_state() -> None:
    st = ledger.set_state(_status(), T0, RecoveryState.DETECTED, "rank 2 died", 1)
    assert st.state is RecoveryState.DETECTED
    assert (st.timeline[-1].event, st.timeline[-1].detail, st.timeline[-1].incident) == ("DETECTED", "rank 2 died", 1)


def test_an_observation_updates_the_job_but_one_with_an_anomaly_keeps_nodes_and_restart_count() -> None:
    start = T0 - timedelta(hours=1)
    job = SlurmJob(job_id=42, name="llm", state=JobState.RUNNING, nodes=("n1", "n2"), restart_count=1, start_time=start)
    st = ledger.observe_job(_status(), job, T0)
    assert (st.nodes, st.restart_count, st.running_since, st.job_name) == (("n1", "n2"), 1, start, "llm")
    failed = SlurmJob(job_id=42, state=JobState.FAILED, restart_count=2)
    after = ledger.observe_job(st, failed, T0 + timedelta(seconds=1), keep_nodes=True)
    assert after.job_state is JobState.FAILED and after.nodes == ("n1", "n2") and after.restart_count == 1
    assert after.last_observed_at == T0 + timedelta(seconds=1)
    plain = ledger.observe_job(st, failed, T0)
    assert plain.nodes == ("n1", "n2") and plain.restart_count == 2  # no nodes listed: the last known ones


def test_the_details_show_the_state_the_restarts_and_the_recent_timeline() -> None:
    st = ledger.set_state(_status(job_name="llm", restarts_used=1), T0, RecoveryState.WATCHING, "watching job 42")
    text = ledger.details_markdown(st)
    assert "## Job 42 (llm): **WATCHING**" in text and "restarts used: 1/5" in text
    assert "| 12:00:00 | WATCHING | watching job 42 |" in text
