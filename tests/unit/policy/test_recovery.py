"""JobRecovery's decisions (``workflows.policy.recovery``): every branch of the loop, without Temporal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workflows.domain.fleet import FleetMode, IsolationDecision
from workflows.domain.gpu import GpuEvent, GpuEventKind, GpuHealthReport, GpuSample
from workflows.domain.incident import Anomaly, AnomalyKind, Attribution, FailureClass
from workflows.domain.loop import ResumeOutcome, WaitResumeResult
from workflows.domain.recovery import DetectionPolicy, RecoverySpec, RecoveryState, StragglerAction
from workflows.domain.slurm import JobState
from workflows.domain.straggler import RankStraggler, StragglerVerdict
from workflows.policy.recovery import (
    after_observe,
    after_requeue,
    after_resume,
    attempt_gpu_events,
    cancelled_by_owner,
    expected_restart_count,
    fleet_silent,
    give_up_before_isolating,
    hang_policy,
    job_over,
    note_unread_agents,
    requeue_refused,
    restart_rejected,
    scheduler_forgot,
    straggler_choice,
    throttled_gpus,
    unknown_job,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _attribution(*, retryable: bool = True) -> Attribution:
    return Attribution(
        failure_class=FailureClass.HARDWARE if retryable else FailureClass.USER,
        cause="xid-79" if retryable else "user-bug",
        retryable=retryable,
        confidence=0.9,
        explanation="GPU fell off the bus" if retryable else "ValueError in train.py",
    )


def _decision(**kw: object) -> IsolationDecision:
    fields: dict[str, object] = {"request_id": "wf/incident-1", "mode": FleetMode.ACT, "act": True} | kw
    return IsolationDecision.model_validate(fields)


def _event(seq: int, at: datetime | None, host: str = "n1") -> GpuEvent:
    return GpuEvent(kind=GpuEventKind.XID, host=host, index=0, xid=79, observed_at=at, sequence=seq)


def _verdict(*slowdowns: float) -> StragglerVerdict:
    return StragglerVerdict(
        stragglers=tuple(
            RankStraggler(rank=i, node=f"n{i}", value_s=s, slowdown=s, streak=5, evidence="")
            for i, s in enumerate(slowdowns)
        )
    )


# ----- the loop between incidents ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("state", "reason"),
    [(JobState.COMPLETED, "the job completed"), (JobState.CANCELLED, "the job was cancelled by its owner")],
)
def test_a_completed_or_cancelled_job_ends_the_loop_as_finished(state: JobState, reason: str) -> None:
    ending = job_over(state)
    assert ending is not None and ending.state is RecoveryState.FINISHED and ending.reason == reason


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.PENDING, JobState.FAILED, JobState.SUSPENDED])
def test_any_other_job_state_keeps_watching(state: JobState) -> None:
    assert job_over(state) is None


def test_a_job_the_scheduler_never_knew_or_forgot_is_given_up() -> None:
    assert unknown_job(7).state is RecoveryState.GAVE_UP and unknown_job(7).reason == "Slurm does not know job 7"
    assert scheduler_forgot().state is RecoveryState.GAVE_UP
    assert scheduler_forgot().reason == "the scheduler no longer lists the job" and not scheduler_forgot().outcome


def test_a_cancel_by_the_owner_finishes_with_that_outcome() -> None:
    before = cancelled_by_owner(during_recovery=False)
    during = cancelled_by_owner(during_recovery=True)
    assert before.state is during.state is RecoveryState.FINISHED
    assert before.reason == "the job was cancelled by its owner"
    assert during.reason == "the job was cancelled by its owner during recovery"
    assert before.outcome == during.outcome == "cancelled by its owner"


# ----- expected restart count --------------------------------------------------------------------------------------
def test_a_node_failure_expects_the_lower_of_the_recorded_and_observed_restart_counts() -> None:
    # Slurm requeued the job on the node failure itself: the observed count is ahead of Rebound's.
    assert expected_restart_count(AnomalyKind.NODE_FAILURE, recorded=1, observed=2) == 1
    assert expected_restart_count(AnomalyKind.NODE_FAILURE, recorded=3, observed=2) == 2


@pytest.mark.parametrize("kind", [k for k in AnomalyKind if k is not AnomalyKind.NODE_FAILURE])
def test_any_other_anomaly_expects_the_recorded_restart_count(kind: AnomalyKind) -> None:
    assert expected_restart_count(kind, recorded=1, observed=2) == 1


# ----- give up -----------------------------------------------------------------------------------------------------
def test_a_failure_that_is_not_retryable_gives_up_before_the_fleet_is_asked() -> None:
    ending = give_up_before_isolating(_attribution(retryable=False), restarts_used=0, budget=5)
    assert ending is not None and ending.state is RecoveryState.GAVE_UP
    assert ending.outcome == "not retryable"
    assert ending.reason == "not retryable (user-bug): ValueError in train.py"


def test_a_spent_budget_gives_up_with_the_counts() -> None:
    ending = give_up_before_isolating(_attribution(), restarts_used=5, budget=5)
    assert ending is not None and ending.outcome == "budget spent"
    assert ending.reason == "restart budget spent (5/5)"


def test_not_retryable_is_named_before_a_spent_budget() -> None:
    ending = give_up_before_isolating(_attribution(retryable=False), restarts_used=5, budget=5)
    assert ending is not None and ending.outcome == "not retryable"


def test_a_retryable_failure_with_budget_left_goes_to_the_fleet() -> None:
    assert give_up_before_isolating(_attribution(), restarts_used=4, budget=5) is None


def test_a_rejected_restart_gives_up_with_the_fleets_reasons() -> None:
    assert restart_rejected(_decision()) is None
    ending = restart_rejected(_decision(restart_allowed=False, reasons=("rejected by alice", "expired")))
    assert ending is not None and ending.state is RecoveryState.GAVE_UP and ending.outcome == "restart rejected"
    assert ending.reason == "the restart was not approved: rejected by alice; expired"


def test_a_refused_requeue_gives_up_naming_the_refusal() -> None:
    ending = requeue_refused("JobNotRequeueable", "job 7 was submitted with --no-requeue")
    assert ending.state is RecoveryState.GAVE_UP and ending.outcome == "requeue refused: JobNotRequeueable"
    assert ending.reason == "the job cannot be requeued (JobNotRequeueable): job 7 was submitted with --no-requeue"


def test_a_job_cancelled_while_it_was_requeued_finishes() -> None:
    assert after_requeue(JobState.PENDING) is None
    assert after_requeue(None) is None
    assert after_requeue(JobState.CANCELLED) == cancelled_by_owner(during_recovery=True)


# ----- the Fleet and observe mode ----------------------------------------------------------------------------------
def test_no_answer_from_the_fleet_counts_as_observe_mode() -> None:
    decision = fleet_silent("wf/incident-3", 3600.0)
    assert decision.request_id == "wf/incident-3" and decision.mode is FleetMode.OBSERVE and not decision.act
    assert decision.reasons == ("the Fleet did not answer within 3600 s",)


@pytest.mark.parametrize(
    ("job_state", "last_state"),
    [(JobState.FAILED, None), (JobState.RUNNING, JobState.FAILED), (JobState.NODE_FAIL, JobState.RUNNING)],
)
def test_observe_mode_ends_the_workflow_when_the_job_already_ended(
    job_state: JobState, last_state: JobState | None
) -> None:
    then = after_observe(_decision(mode=FleetMode.OBSERVE, act=False), job_state, last_state)
    assert then.outcome == "observed only (observe mode)"
    assert then.ending is not None and then.ending.state is RecoveryState.FINISHED
    assert then.ending.reason == "the job failed; observe mode: not restarted"


def test_observe_mode_goes_on_watching_a_job_that_still_runs() -> None:
    then = after_observe(_decision(mode=FleetMode.CANARY, act=False), JobState.RUNNING, JobState.RUNNING)
    assert then.outcome == "observed only (canary mode)" and then.ending is None
    assert then.note == "canary mode: nothing done"


# ----- after the restart ---------------------------------------------------------------------------------------------
def _resumed(outcome: ResumeOutcome) -> WaitResumeResult:
    return WaitResumeResult(outcome=outcome, observed_at=T0, step=6, checkpoint="step_000005")


def test_a_job_that_trains_again_is_resumed() -> None:
    then = after_resume(_resumed(ResumeOutcome.RESUMED))
    assert then.resumed and then.outcome == "resumed" and then.ending is None and then.failed_again is None


def test_a_job_that_fails_again_before_training_is_the_next_incident_at_once() -> None:
    then = after_resume(_resumed(ResumeOutcome.FAILED_AGAIN))
    assert not then.resumed and then.ending is None and then.outcome == "failed again before resuming"
    assert then.failed_again is not None
    assert then.failed_again.kind is AnomalyKind.RANK_CRASH and then.failed_again.observed_at == T0
    assert then.failed_again.summary == "the restarted job failed before it trained a step"


def test_a_job_cancelled_while_verified_finishes_and_one_gone_is_given_up() -> None:
    cancelled = after_resume(_resumed(ResumeOutcome.CANCELLED))
    assert cancelled.ending == cancelled_by_owner(during_recovery=True)
    assert cancelled.outcome == "cancelled by its owner"
    gone = after_resume(_resumed(ResumeOutcome.GONE))
    assert gone.ending == scheduler_forgot() and gone.outcome == ""


# ----- stragglers --------------------------------------------------------------------------------------------------
def test_a_straggler_is_only_reported_unless_the_job_asks_for_restarts() -> None:
    for action in (StragglerAction.REPORT, StragglerAction.OFF):
        choice = straggler_choice(_verdict(3.0), action, DetectionPolicy())
        assert not choice.restart and choice.outcome == "reported (straggler action: report)"


def test_a_straggler_restart_must_repay_its_cost() -> None:
    detection = DetectionPolicy(straggler_horizon_s=3600, straggler_restart_cost_s=600)
    # 1.1x over an hour loses ~327 s < 600 s; 2x loses 1800 s > 600 s. The worst straggler decides.
    cheap = straggler_choice(_verdict(1.1), StragglerAction.RESTART, detection)
    assert not cheap.restart and cheap.outcome == "reported: a 1.10x slowdown does not repay a restart"
    assert straggler_choice(_verdict(1.1, 2.0), StragglerAction.RESTART, detection).restart


def test_throttled_gpus_names_each_slowed_gpu_of_each_node() -> None:
    hot = GpuSample(host="n1", index=3, clocks_event_reasons=0x40, temperature_c=91)
    cool = GpuSample(host="n1", index=0, clocks_event_reasons=0x1, temperature_c=50)  # idle bit: not a slowdown
    reports = [GpuHealthReport(host="n1", samples=(cool, hot)), None]
    assert throttled_gpus(["n1", "n2"], reports) == {
        "n1": ["GPU 3: hw_thermal_slowdown (clocks_event_reasons=0x40, 91 C)"]
    }


# ----- evidence choices ----------------------------------------------------------------------------------------------
def test_attribution_weighs_each_gpu_event_once_and_only_this_attempts() -> None:
    start = T0
    signalled = _event(1, T0 + timedelta(seconds=5))
    anomaly = Anomaly(kind=AnomalyKind.GPU_FAULT, observed_at=T0, summary="xid", gpu_events=(signalled,))
    old = _event(0, T0 - timedelta(hours=1), host="n2")  # another job's story
    undated = _event(2, None, host="n2")
    fresh = _event(3, T0 + timedelta(seconds=6), host="n2")
    reports = [
        GpuHealthReport(host="n1", events=(signalled,)),
        GpuHealthReport(host="n2", events=(old, undated, fresh)),
        None,
    ]
    events = attempt_gpu_events(anomaly, [signalled, _event(9, T0)], reports, start)
    assert events == (signalled, _event(9, T0), undated, fresh)
    assert attempt_gpu_events(anomaly, [], reports, None) == (signalled, old, undated, fresh)


def test_the_jobs_own_hang_window_overrides_the_learned_one() -> None:
    detection = DetectionPolicy()
    assert hang_policy(detection, RecoverySpec()) == detection.hang
    assert hang_policy(detection, RecoverySpec(hang_after_s=90)).override_s == 90


def test_an_unread_agent_is_named_in_the_explanation_and_nothing_else_changes() -> None:
    att = Attribution(
        failure_class=FailureClass.HARDWARE, cause="rank-crash", retryable=True, confidence=0.4,
        implicated_nodes=("n2",), explanation="rank 3 exited 13",
    )  # fmt: skip
    noted = note_unread_agents(att, ("n1", "n2"), [GpuHealthReport(host="n1"), None])
    assert noted.explanation == "rank 3 exited 13; n2: node agent did not answer (no GPU read)"
    assert noted.model_copy(update={"explanation": att.explanation}) == att  # the verdict itself is untouched
    assert note_unread_agents(att, ("n1", "n2"), [GpuHealthReport(host="n1"), GpuHealthReport(host="n2")]) is att
    bare = att.model_copy(update={"explanation": ""})
    assert note_unread_agents(bare, ("n1",), [None]).explanation == "n1: node agent did not answer (no GPU read)"
