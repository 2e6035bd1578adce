"""JobRecovery's state model and its transitions (``workflows.job_recovery.state``): pure, no Temporal."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from temporalio.contrib.pydantic import pydantic_data_converter

from workflows.domain.fleet import FleetMode, IsolationDecision
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.incident import Anomaly, AnomalyKind
from workflows.domain.progress import ProgressState
from workflows.domain.recovery import (
    MAX_CARRIED_INCIDENTS,
    MAX_PENDING_GPU_EVENTS,
    MAX_SEEN_GPU_EVENTS,
    JobRecoveryInput,
    JobRecoveryState,
    JobRecoveryStatus,
    RecoveryState,
)
from workflows.domain.slurm import JobState, SlurmJob
from workflows.job_recovery import ledger, state

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _state(**kw: object) -> JobRecoveryState:
    status = JobRecoveryStatus(cluster="c", job_id=42, state=RecoveryState.WATCHING)
    return JobRecoveryState.model_validate({"status": status} | kw)


def _event(seq: int, host: str = "n1") -> GpuEvent:
    return GpuEvent(kind=GpuEventKind.XID, host=host, index=0, xid=79, observed_at=T0, sequence=seq)


def _decision(n: int, **kw: object) -> IsolationDecision:
    fields: dict[str, object] = {"request_id": f"wf/incident-{n}", "mode": FleetMode.ACT, "act": True} | kw
    return IsolationDecision.model_validate(fields)


def test_a_resent_gpu_event_is_taken_once() -> None:
    st = state.take_gpu_event(state.take_gpu_event(_state(), _event(1)), _event(1))
    st = state.take_gpu_event(st, _event(1, host="n2"))
    assert st.gpu_events == (_event(1), _event(1, host="n2"))


def test_taking_the_gpu_events_for_attribution_empties_the_pending_ones_but_remembers_them() -> None:
    st, events = state.take_gpu_events(state.take_gpu_event(_state(), _event(1)))
    assert events == (_event(1),) and st.gpu_events == ()
    assert state.take_gpu_event(st, _event(1)).gpu_events == ()  # the agent re-sends it: already attributed


def test_gpu_events_are_bounded_pending_and_remembered() -> None:
    st = _state()
    for seq in range(MAX_SEEN_GPU_EVENTS + 10):
        st = state.take_gpu_event(st, _event(seq))
    assert len(st.gpu_events) == MAX_PENDING_GPU_EVENTS and st.gpu_events[0] == _event(0)  # the storm's first
    assert len(st.seen_gpu_events) == MAX_SEEN_GPU_EVENTS
    assert st.seen_gpu_events[-1] == state.gpu_event_key(_event(MAX_SEEN_GPU_EVENTS + 9))


def test_the_fleets_latest_word_per_request_is_kept_and_the_answers_are_bounded() -> None:
    st = state.take_decision(_state(), _decision(1))
    st = state.take_decision(st, _decision(1, drained=("n2",)))
    assert state.decision_for(st, "wf/incident-1") == _decision(1, drained=("n2",))
    assert state.decision_for(st, "wf/incident-2") is None
    for n in range(2, MAX_CARRIED_INCIDENTS + 5):
        st = state.take_decision(st, _decision(n))
    assert len(st.decisions) == MAX_CARRIED_INCIDENTS and state.decision_for(st, "wf/incident-1") is None


def test_a_request_names_its_incident_while_the_ledger_holds_it() -> None:
    status, _ = ledger.open_incident(
        _state().status, anomaly=Anomaly(kind=AnomalyKind.HANG, observed_at=T0, summary="s")
    )
    st = _state(status=status)
    assert state.incident_of_request(st, "rebound/c/job/42/incident-1") == 1
    assert state.incident_of_request(st, "rebound/c/job/42/incident-7") is None


def test_a_new_attempt_restarts_the_hang_clock_and_reports_stragglers_afresh() -> None:
    st = _state(progress=ProgressState(), reported_stragglers=("n3",))
    after = state.new_attempt(st, T0)
    assert after.reported_stragglers == () and after.progress is not None and after.progress.restarted_at == T0
    held = state.restart_hang_clock(st, T0)
    assert held.reported_stragglers == ("n3",) and held.progress is not None and held.progress.restarted_at == T0
    assert state.new_attempt(_state(), T0).progress is None


def test_the_whole_state_survives_continue_as_new_through_the_data_converter() -> None:
    status = _state().status
    for i in range(MAX_CARRIED_INCIDENTS + 3):
        status, _ = ledger.open_incident(status, anomaly=Anomaly(kind=AnomalyKind.HANG, observed_at=T0, summary=f"{i}"))
    st = _state(
        status=status,
        progress=ProgressState(),
        reported_stragglers=("n3",),
        gpu_events=(_event(1),),
        seen_gpu_events=(state.gpu_event_key(_event(1)),),
        decisions=(_decision(1),),
        last_job=SlurmJob(job_id=42, state=JobState.RUNNING),
    )
    inp = JobRecoveryInput(cluster="c", job_id=42, carried=state.carry(st))
    converter = pydantic_data_converter.payload_converter
    (payload,) = converter.to_payloads([inp])
    back = converter.from_payloads([payload], [JobRecoveryInput])[0]
    assert back == inp and back.carried is not None
    assert back.carried.status.runs == 2 and len(back.carried.status.incidents) == MAX_CARRIED_INCIDENTS
    assert back.carried.model_copy(update={"status": st.status}) == st  # everything else came along as it was


def test_an_input_written_before_the_state_model_is_read_as_status_and_progress() -> None:
    status = JobRecoveryStatus(cluster="c", job_id=42, state=RecoveryState.WATCHING, runs=3)
    old = {"cluster": "c", "job_id": 42, "carried": status.model_dump(mode="json"), "carried_progress": {}}
    inp = JobRecoveryInput.model_validate_json(json.dumps(old))
    assert inp.carried == JobRecoveryState(status=status, progress=ProgressState())
    fresh = JobRecoveryInput.model_validate({"cluster": "c", "job_id": 42, "carried": None, "carried_progress": None})
    assert fresh.carried is None
