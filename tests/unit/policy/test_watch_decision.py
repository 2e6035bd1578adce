"""The watch's per-poll decision and the resume check, one test (at least) per branch. Pure, no Temporal."""

from __future__ import annotations

from datetime import timedelta

from tests.unit.policy.test_progress_state import at, sample
from workflows.domain.findings import FindingKind
from workflows.domain.hang import HangPolicy
from workflows.domain.incident import AnomalyKind, EvidenceSource, LogFinding
from workflows.domain.loop import ResumeOutcome, WatchOutcome
from workflows.domain.progress import ProgressSample, ProgressState, observe
from workflows.domain.recovery import StragglerAction
from workflows.domain.slurm import JobState, SlurmJob
from workflows.policy.watch import (
    ResumeFacts,
    StepLine,
    WatchAction,
    WatchFacts,
    decide_poll,
    decide_resume,
)

NOW = at(1000)
FAST = HangPolicy(floor_s=5.0, min_intervals=5, startup_s=120.0)


def _job(state: JobState = JobState.RUNNING, restarts: int = 0, **kw: object) -> SlurmJob:
    return SlurmJob.model_validate(
        {"job_id": 7, "state": state, "restart_count": restarts, "nodes": ("n1", "n2"), "task_count": 4, **kw}
    )


_RUNNING = object()


def _facts(job: SlurmJob | None | object = _RUNNING, **kw: object) -> WatchFacts:
    base: dict[str, object] = {
        "now": NOW,
        "job": _job() if job is _RUNNING else job,
        "progress": ProgressState(),
        "last_state": JobState.RUNNING,
        "last_restart_count": 0,
    }
    return WatchFacts.model_validate({**base, **kw})


def _victim(rank: int = 1) -> LogFinding:
    return LogFinding(kind=FindingKind.TERMINATED, rank=rank, text=f"{rank}: srun: Terminated", order=rank)


def _culprit(rank: int = 2) -> LogFinding:
    return LogFinding(
        kind=FindingKind.CUDA_ERROR, rank=rank, node="n2", culprit=True, text="CUDA error: an illegal memory access"
    )


def _stepping(ranks: int = 4, steps: int = 10, compute: dict[int, float] | None = None) -> ProgressState:
    """Every rank logs ``steps`` steps a quarter second apart (``compute``: per-rank compute time)."""
    lines: list[ProgressSample] = []
    for i in range(1, steps + 1):
        slowest = max((compute or {0: 0.2}).values())
        for r in range(ranks):
            extra = {"compute_time_s": compute[r], "step_time_s": slowest + 0.03} if compute else {}
            lines.append(sample(r, i, 900 + i * 0.25 + r * 0.001, node=f"n{r // 2 + 1}", **extra))
    return observe(ProgressState(), lines, at(903))


# ----- decide_poll -------------------------------------------------------------------------------------------------


def test_victims_only_with_a_snapshot_view_asks_the_scheduler_again() -> None:
    decision = decide_poll(_facts(findings=(_victim(),)))
    assert decision.action is WatchAction.REFRESH_SCHEDULER and decision.anomaly is None


def test_victims_only_after_an_outside_requeue_or_cancel_are_not_a_failure() -> None:
    # Requeued: the restart count moved (the state may still say RUNNING for a moment).
    requeued = decide_poll(_facts(_job(restarts=1), findings=(_victim(),), scheduler_fresh=True))
    assert (requeued.action, requeued.outcome, requeued.anomaly) == (WatchAction.RETURN, WatchOutcome.CHANGED, None)
    for state in (JobState.CANCELLED, JobState.PENDING, JobState.COMPLETING):
        decision = decide_poll(_facts(_job(state), findings=(_victim(),), scheduler_fresh=True))
        assert (decision.outcome, decision.anomaly, decision.findings) == (WatchOutcome.CHANGED, None, ()), state


def test_victims_only_of_a_job_still_running_are_a_rank_crash() -> None:
    decision = decide_poll(_facts(findings=(_victim(1), _victim(0)), scheduler_fresh=True))
    assert decision.outcome is WatchOutcome.ANOMALY and decision.anomaly is not None
    assert decision.anomaly.kind is AnomalyKind.RANK_CRASH
    assert decision.anomaly.summary == "rank 0: terminated: 0: srun: Terminated"
    assert len(decision.findings) == 2


def test_a_culprit_is_a_rank_crash_without_asking_the_scheduler() -> None:
    decision = decide_poll(_facts(findings=(_victim(), _culprit()), progress=_stepping()))
    assert decision.action is WatchAction.RETURN and decision.anomaly is not None
    assert decision.anomaly.kind is AnomalyKind.RANK_CRASH
    assert decision.anomaly.summary.startswith("rank 2: cuda_error: CUDA error")
    assert [e.source for e in decision.anomaly.evidence] == [EvidenceSource.LOGS] * 2
    assert decision.progress == _stepping()  # the last step seen goes back to the incident


def test_a_culprit_while_the_job_is_cancelled_is_still_a_crash() -> None:
    decision = decide_poll(_facts(_job(JobState.CANCELLED), findings=(_culprit(),)))
    assert decision.anomaly is not None and decision.anomaly.kind is AnomalyKind.RANK_CRASH


def test_an_unresponsive_node_is_a_node_failure() -> None:
    decision = decide_poll(_facts(unresponsive_nodes=("n2",)))
    assert decision.anomaly is not None and decision.anomaly.kind is AnomalyKind.NODE_FAILURE
    assert decision.anomaly.summary == "node(s) n2 of the job stopped responding"
    assert [(e.source, e.node) for e in decision.anomaly.evidence] == [(EvidenceSource.SCHEDULER, "n2")]


def test_an_unresponsive_node_of_a_job_gone_from_the_scheduler_is_a_node_failure() -> None:
    decision = decide_poll(_facts(job=None, unresponsive_nodes=("n1",)))
    assert decision.anomaly is not None and decision.anomaly.kind is AnomalyKind.NODE_FAILURE


def test_an_unresponsive_node_after_the_job_ended_is_not_the_jobs_failure() -> None:
    done = _job(JobState.COMPLETED)
    decision = decide_poll(_facts(done, unresponsive_nodes=("n2",)))
    assert (decision.outcome, decision.anomaly) == (WatchOutcome.CHANGED, None)


def test_a_job_the_scheduler_no_longer_lists_is_gone() -> None:
    progress = _stepping()
    decision = decide_poll(_facts(job=None, progress=progress))
    assert (decision.action, decision.outcome, decision.progress) == (WatchAction.RETURN, WatchOutcome.GONE, progress)


def test_a_job_that_ended_in_a_failure_is_job_failed() -> None:
    failed = _job(JobState.FAILED, exit_code=1, state_reason="NonZeroExitCode")
    decision = decide_poll(_facts(failed, progress=_stepping()))
    assert decision.anomaly is not None and decision.anomaly.kind is AnomalyKind.JOB_FAILED
    assert decision.anomaly.summary == "job ended FAILED (exit 1, NonZeroExitCode)"
    assert decision.anomaly.evidence[-1].text == "job 7 FAILED exit=1 reason=NonZeroExitCode"
    assert decision.progress is not None


def test_a_state_or_restart_change_without_failure_is_changed() -> None:
    started = decide_poll(_facts(_job(JobState.RUNNING), last_state=JobState.PENDING))
    assert (started.outcome, started.anomaly) == (WatchOutcome.CHANGED, None)
    restarted = decide_poll(_facts(_job(restarts=2), last_restart_count=1))
    assert restarted.outcome is WatchOutcome.CHANGED


def test_a_running_job_silent_for_its_window_is_hung() -> None:
    quiet = observe(ProgressState(), [sample(r, s, float(s)) for s in (1, 2) for r in range(4)], at(2))
    decision = decide_poll(_facts(progress=quiet, hang=FAST, now=at(2 + 121)))
    assert decision.anomaly is not None and decision.anomaly.kind is AnomalyKind.HANG
    assert decision.hang is not None and decision.hang.hung and decision.stragglers is None
    assert decision.anomaly.summary == decision.hang.summary
    # Just inside the window: keep watching.
    assert decide_poll(_facts(progress=quiet, hang=FAST, now=at(2 + 100))).action is WatchAction.KEEP_WATCHING


def test_a_new_straggler_node_is_reported_once() -> None:
    slow = _stepping(ranks=6, compute={r: 0.2 if r < 4 else 0.3 for r in range(6)})  # n3's ranks 4 and 5
    decision = decide_poll(_facts(progress=slow, now=at(904)))
    assert decision.anomaly is not None and decision.anomaly.kind is AnomalyKind.STRAGGLER
    assert decision.stragglers is not None and [n.node for n in decision.stragglers.nodes] == ["n3"]
    assert decision.progress is not None and decision.progress != slow  # the streaks were counted
    again = decide_poll(_facts(progress=slow, now=at(904), reported_straggler_nodes=("n3",)))
    assert again.action is WatchAction.KEEP_WATCHING and again.progress is not None


def test_a_kept_progress_unchanged_since_is_not_judged_again() -> None:
    """Judging the kept (already judged) progress again gives what the last poll gave: ``progress_unchanged``
    skips it, the same decision."""
    slow = _stepping(ranks=6, compute={r: 0.2 if r < 4 else 0.3 for r in range(6)})
    kept = decide_poll(_facts(progress=slow, now=at(904), reported_straggler_nodes=("n3",)))
    assert kept.action is WatchAction.KEEP_WATCHING and kept.progress is not None
    for now in (at(905), at(960)):
        again = decide_poll(_facts(progress=kept.progress, now=now, reported_straggler_nodes=("n3",)))
        skipped = decide_poll(
            _facts(progress=kept.progress, now=now, reported_straggler_nodes=("n3",), progress_unchanged=True)
        )
        assert again == skipped and skipped.progress == kept.progress


def test_stragglers_are_not_judged_when_switched_off() -> None:
    slow = _stepping(ranks=6, compute={r: 0.2 if r < 4 else 0.3 for r in range(6)})
    decision = decide_poll(_facts(progress=slow, now=at(904), straggler_action=StragglerAction.OFF))
    assert (decision.action, decision.progress) == (WatchAction.KEEP_WATCHING, slow)


def test_a_healthy_running_or_pending_job_keeps_being_watched() -> None:
    running = decide_poll(_facts(progress=_stepping(), now=at(904)))
    assert (running.action, running.outcome, running.anomaly) == (WatchAction.KEEP_WATCHING, None, None)
    pending = decide_poll(_facts(_job(JobState.PENDING), last_state=JobState.PENDING))
    assert pending.action is WatchAction.KEEP_WATCHING


# ----- decide_resume -----------------------------------------------------------------------------------------------

RESTARTED_AT = at(500)


def _resume(job: SlurmJob | None, **kw: object) -> ResumeFacts:
    base: dict[str, object] = {"job": job, "expected_restart_count": 1, "not_before": RESTARTED_AT, "logs_read": True}
    return ResumeFacts.model_validate({**base, **kw})


def test_resume_gone_and_cancelled_end_the_wait_before_any_log_is_read() -> None:
    assert decide_resume(_resume(None, logs_read=False)).outcome is ResumeOutcome.GONE
    cancelled = _job(JobState.CANCELLED, restarts=1)
    assert decide_resume(_resume(cancelled, logs_read=False)).outcome is ResumeOutcome.CANCELLED


def test_resume_asks_for_the_logs_of_a_job_still_there() -> None:
    decision = decide_resume(_resume(_job(restarts=1), logs_read=False))
    assert (decision.outcome, decision.read_logs) == (None, True)


def test_resume_the_first_new_step_line_means_resumed() -> None:
    steps = (StepLine(step=12, at=at(520)), StepLine(step=11, at=at(510)), StepLine(step=40, at=at(400)))
    decision = decide_resume(_resume(_job(restarts=1), steps=steps))
    assert decision.outcome is ResumeOutcome.RESUMED and decision.first_step == StepLine(step=11, at=at(510))


def test_resume_step_lines_of_the_old_attempt_do_not_count() -> None:
    stamped_before = decide_resume(_resume(_job(restarts=1), steps=(StepLine(step=40, at=at(499)),)))
    assert stamped_before.outcome is None
    # An unstamped line counts only once the new attempt runs (not while it is PENDING or not yet requeued).
    unstamped = (StepLine(step=3),)
    assert decide_resume(_resume(_job(JobState.PENDING, restarts=1), steps=unstamped)).outcome is None
    assert decide_resume(_resume(_job(restarts=0), steps=unstamped)).outcome is None
    assert decide_resume(_resume(_job(restarts=1), steps=unstamped)).outcome is ResumeOutcome.RESUMED
    assert decide_resume(_resume(_job(restarts=0), not_before=None, steps=unstamped)).outcome is ResumeOutcome.RESUMED


def test_resume_a_failed_state_of_the_new_attempt_is_failed_again() -> None:
    assert decide_resume(_resume(_job(JobState.FAILED, restarts=1))).outcome is ResumeOutcome.FAILED_AGAIN
    # The old attempt's failed state (not requeued yet) is the incident being recovered.
    assert decide_resume(_resume(_job(JobState.FAILED, restarts=0))).outcome is None


def test_resume_a_culprit_line_of_the_new_attempt_is_failed_again() -> None:
    crash = _culprit().model_copy(update={"at": RESTARTED_AT + timedelta(seconds=5)})
    assert decide_resume(_resume(_job(restarts=1), findings=(crash,))).outcome is ResumeOutcome.FAILED_AGAIN
    old = _culprit().model_copy(update={"at": RESTARTED_AT - timedelta(seconds=5)})
    assert decide_resume(_resume(_job(restarts=1), findings=(old,))).outcome is None
    victim = _victim().model_copy(update={"at": RESTARTED_AT + timedelta(seconds=5)})
    assert decide_resume(_resume(_job(restarts=1), findings=(victim,))).outcome is None


def test_resume_nothing_yet_keeps_waiting() -> None:
    decision = decide_resume(_resume(_job(JobState.PENDING, restarts=1)))
    assert (decision.outcome, decision.read_logs, decision.first_step) == (None, False, None)
