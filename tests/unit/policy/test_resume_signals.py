"""The resume check's progress signals besides step lines, and what a restarted job that fails again is judged
on. Pure, no Temporal."""

from __future__ import annotations

from tests.unit.policy.test_progress_state import at
from workflows.domain.checkpoints import CheckpointFormat, CheckpointRef
from workflows.domain.findings import FindingKind
from workflows.domain.incident import EvidenceSource, LogFinding
from workflows.domain.loop import ResumeOutcome, WaitResumeResult
from workflows.domain.progress import ProgressSignal
from workflows.domain.recovery import RecoverySpec
from workflows.domain.slurm import JobState, SlurmJob
from workflows.policy.recovery import after_resume, resumed_note, verify_signals
from workflows.policy.watch import ResumeFacts, StepLine, decide_resume, is_new_checkpoint

RESTARTED_AT = at(500)


def _job(state: JobState = JobState.RUNNING, restarts: int = 1) -> SlurmJob:
    return SlurmJob.model_validate(
        {"job_id": 7, "state": state, "restart_count": restarts, "nodes": ("n1", "n2"), "task_count": 4}
    )


def _resume(job: SlurmJob, **kw: object) -> ResumeFacts:
    base: dict[str, object] = {"job": job, "expected_restart_count": 1, "not_before": RESTARTED_AT, "logs_read": True}
    return ResumeFacts.model_validate({**base, **kw})


def _ckpt(step: int | None, saved: float | None, path: str = "") -> CheckpointRef:
    return CheckpointRef(
        path=path or f"/ckpt/epoch=0-step={step}.ckpt",
        step=step,
        saved_at=None if saved is None else at(saved),
        format=CheckpointFormat.LIGHTNING,
    )


def _line(text: str, *, culprit: bool, seconds: float, kind: FindingKind = FindingKind.PYTHON_EXCEPTION) -> LogFinding:
    return LogFinding(kind=kind, rank=1, node="n1", text=text, culprit=culprit, at=at(seconds))


# ----- a new checkpoint ---------------------------------------------------------------------------------------------
def test_a_new_complete_checkpoint_after_the_restart_means_resumed_by_checkpoint() -> None:
    before, saved = _ckpt(180, 400), _ckpt(200, 560)
    facts = _resume(_job(), latest_checkpoint=saved, restart_checkpoint=before)
    decision = decide_resume(facts)
    assert decision.outcome is ResumeOutcome.RESUMED and decision.signal is ProgressSignal.CHECKPOINT
    assert decision.new_checkpoint == saved and decision.first_step is None


def test_the_checkpoint_already_there_at_the_restart_is_not_progress() -> None:
    before = _ckpt(180, 400)
    assert decide_resume(_resume(_job(), latest_checkpoint=before, restart_checkpoint=before)).outcome is None
    # Saved before the restart (the old attempt, still running while Rebound scanned): not the new attempt's.
    assert decide_resume(_resume(_job(), latest_checkpoint=_ckpt(200, 499), restart_checkpoint=before)).outcome is None
    # A complete checkpoint while the successor is still PENDING is not its own.
    pending = _resume(_job(JobState.PENDING), latest_checkpoint=_ckpt(200, 560), restart_checkpoint=before)
    assert decide_resume(pending).outcome is None


def test_is_new_checkpoint_needs_a_completion_time_and_a_newer_save() -> None:
    assert not is_new_checkpoint(None, None, RESTARTED_AT)
    assert not is_new_checkpoint(_ckpt(200, None), _ckpt(180, 400), RESTARTED_AT)  # no marker time: no claim
    assert not is_new_checkpoint(_ckpt(200, 560), None, None)  # no restart time: no claim
    assert is_new_checkpoint(_ckpt(200, 560), None, RESTARTED_AT)  # none existed before: any new one
    assert not is_new_checkpoint(_ckpt(180, 560), _ckpt(180, 400), RESTARTED_AT)  # rewritten, same step
    # Formats without steps: another path completed after the restart.
    assert is_new_checkpoint(_ckpt(None, 560, "/c/b"), _ckpt(None, 400, "/c/a"), RESTARTED_AT)
    assert not is_new_checkpoint(_ckpt(None, 560, "/c/a"), _ckpt(None, 400, "/c/a"), RESTARTED_AT)


def test_advancing_stacks_of_the_new_attempt_mean_resumed_by_stacks() -> None:
    decision = decide_resume(_resume(_job(), stacks_advancing=True))
    assert decision.outcome is ResumeOutcome.RESUMED and decision.signal is ProgressSignal.STACKS
    assert decide_resume(_resume(_job(JobState.PENDING), stacks_advancing=True)).outcome is None


def test_a_step_line_decides_first_and_is_named() -> None:
    decision = decide_resume(
        _resume(_job(), steps=(StepLine(step=181, at=at(520)),), latest_checkpoint=_ckpt(200, 560))
    )
    assert decision.signal is ProgressSignal.STEP_LINE and decision.first_step == StepLine(step=181, at=at(520))


# ----- signs of life --------------------------------------------------------------------------------------------------
def test_a_heartbeat_or_a_load_line_is_a_sign_of_life_not_a_resume() -> None:
    decision = decide_resume(_resume(_job(), heartbeats=(at(510),), checkpoint_loads=(at(505),)))
    assert decision.outcome is None
    assert decision.signs_of_life == (ProgressSignal.CHECKPOINT_LOAD, ProgressSignal.HEARTBEAT)
    old = decide_resume(_resume(_job(), heartbeats=(at(490),), checkpoint_loads=(at(495),)))
    assert old.signs_of_life == ()
    # An unstamped load line counts once the new attempt runs.
    assert decide_resume(_resume(_job(JobState.PENDING), checkpoint_loads=(None,))).signs_of_life == ()
    assert decide_resume(_resume(_job(), checkpoint_loads=(None,))).signs_of_life == (ProgressSignal.CHECKPOINT_LOAD,)


# ----- failed again: its own evidence -------------------------------------------------------------------------------
def test_failed_again_carries_every_new_finding_of_the_new_attempt() -> None:
    culprit = _line("RuntimeError: PytorchStreamReader failed reading zip archive", culprit=True, seconds=520)
    victim = _line("srun: error: n2: task 3: Terminated", culprit=False, seconds=521, kind=FindingKind.TERMINATED)
    old = _line("RuntimeError: the first incident", culprit=True, seconds=450)
    decision = decide_resume(_resume(_job(), findings=(old, culprit, victim), checkpoint_loads=(at(510),)))
    assert decision.outcome is ResumeOutcome.FAILED_AGAIN
    assert decision.findings == (culprit, victim)
    assert decision.signs_of_life == (ProgressSignal.CHECKPOINT_LOAD,)


def test_victims_lines_of_the_new_attempt_are_kept_while_waiting() -> None:
    victim = _line("srun: error: n2: task 3: Terminated", culprit=False, seconds=521, kind=FindingKind.TERMINATED)
    decision = decide_resume(_resume(_job(), findings=(victim,)))
    assert decision.outcome is None and decision.findings == (victim,)


def _failed(**kw: object) -> WaitResumeResult:
    return WaitResumeResult.model_validate(
        {"outcome": ResumeOutcome.FAILED_AGAIN, "observed_at": at(530), "job": _job(JobState.FAILED), **kw}
    )


def test_failed_again_after_a_sign_of_life_does_not_claim_it_never_trained() -> None:
    culprit = _line("RuntimeError: PytorchStreamReader failed reading zip archive", culprit=True, seconds=520)
    then = after_resume(_failed(findings=(culprit,), signs_of_life=(ProgressSignal.CHECKPOINT_LOAD,)))
    assert then.failed_again is not None and then.findings == (culprit,)
    summary = then.failed_again.summary
    assert "before it trained" not in summary
    assert summary.startswith("the restarted job failed again after it started (logged a checkpoint load)")
    assert "PytorchStreamReader" in summary
    texts = [e.text for e in then.failed_again.evidence]
    assert culprit.text in texts  # the new attempt's own line is evidence, attributed by the next incident
    assert any(e.source is EvidenceSource.SCHEDULER and "FAILED" in e.text for e in then.failed_again.evidence)


def test_failed_before_it_trained_only_without_any_signal() -> None:
    then = after_resume(_failed())
    assert then.failed_again is not None
    assert then.failed_again.summary == "the restarted job failed before it trained a step"
    assert then.findings == ()


# ----- the timeline's words -----------------------------------------------------------------------------------------
def test_the_timeline_names_the_signal_that_decided() -> None:
    step = WaitResumeResult(
        outcome=ResumeOutcome.RESUMED,
        observed_at=at(520),
        step=181,
        checkpoint="last.ckpt",
        signal=ProgressSignal.STEP_LINE,
    )
    assert resumed_note(step) == "training again at step 181 from last.ckpt [signal: step line]"
    saved = _ckpt(200, 560)
    by_ckpt = WaitResumeResult(
        outcome=ResumeOutcome.RESUMED, observed_at=at(560), signal=ProgressSignal.CHECKPOINT, new_checkpoint=saved
    )
    assert resumed_note(by_ckpt) == (
        f"training again: it saved a new complete checkpoint {saved.path} (step 200) [signal: checkpoint]"
    )
    stacks = WaitResumeResult(outcome=ResumeOutcome.RESUMED, observed_at=at(560), signal=ProgressSignal.STACKS)
    assert "[signal: stacks]" in resumed_note(stacks)


def test_verifying_says_which_signals_count_for_the_job() -> None:
    assert verify_signals(RecoverySpec()) == "a step line"
    assert verify_signals(RecoverySpec(checkpoint_dir="/ck")) == "a step line or a new complete checkpoint in /ck"
