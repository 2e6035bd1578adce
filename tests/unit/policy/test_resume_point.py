"""The checkpoint a restart resumes from, and whether it did (``workflows.policy.resume_point``). Pure."""

from __future__ import annotations

from tests.unit.policy.test_progress_state import at, sample
from workflows.domain.checkpoints import (
    CheckedCheckpoint,
    CheckpointFallback,
    CheckpointFormat,
    CheckpointRef,
    CheckpointReport,
    CheckpointStatus,
    IncompleteCheckpoint,
)
from workflows.domain.findings import Cause, FindingKind
from workflows.domain.incident import AnomalyKind, Attribution, FailureClass, Incident, LogFinding
from workflows.domain.loop import ResumeOutcome, WaitResumeResult
from workflows.domain.progress import ProgressState, observe
from workflows.domain.resume_point import RestartCheckpoint, ResumePoint
from workflows.policy.resume_point import (
    corrupt_checkpoint_retry,
    from_scratch_anomaly,
    is_checkpoint_load_failure,
    judge_resume_point,
    last_seen_step,
    restart_checkpoint,
    should_quarantine,
)

NOW = at(1000)
F = CheckpointFormat.LIGHTNING


def _ref(step: int | None, saved: float | None = 700, path: str = "") -> CheckpointRef:
    return CheckpointRef(
        path=path or f"/ck/epoch=0-step={step}.ckpt", step=step, saved_at=None if saved is None else at(saved), format=F
    )


def _checked(step: int, status: CheckpointStatus = CheckpointStatus.VALID) -> CheckedCheckpoint:
    return CheckedCheckpoint(path=f"/ck/epoch=0-step={step}.ckpt", format=F, step=step, status=status, reason="")


def _report(
    latest: CheckpointRef | None,
    *,
    incomplete: tuple[IncompleteCheckpoint, ...] = (),
    checked: tuple[CheckedCheckpoint, ...] = (),
) -> CheckpointReport:
    return CheckpointReport(dir="/ck", format=F, latest_valid=latest, incomplete=incomplete, checked=checked)


PARTIAL = IncompleteCheckpoint(path="/ck/epoch=0-step=200.ckpt.tmp", step=200, reason="no completion marker")


# ----- before the restart -------------------------------------------------------------------------------------------
def test_the_latest_valid_checkpoint_its_age_and_the_steps_lost() -> None:
    found = restart_checkpoint(_report(_ref(180)), directory="/ck", last_step=203, now=NOW)
    assert found.latest_valid == _ref(180) and found.age_s == 300 and found.steps_lost == 23
    assert found.summary == (
        "latest valid checkpoint /ck/epoch=0-step=180.ckpt (step 180), saved 5 min ago; "
        "23 steps will be redone (last seen step 203)"
    )
    quiet = restart_checkpoint(_report(_ref(180, saved=None)), directory="/ck", last_step=None, now=NOW)
    assert quiet.age_s is None and quiet.steps_lost is None  # a job without step lines, a format without a marker
    assert quiet.summary == "latest valid checkpoint /ck/epoch=0-step=180.ckpt (step 180)"


def test_a_partial_newer_save_is_named_and_an_older_one_is_not() -> None:
    older = IncompleteCheckpoint(path="/ck/x-step=100.tmp", step=100, reason="short shard")
    found = restart_checkpoint(_report(_ref(180), incomplete=(older, PARTIAL)), directory="/ck", last_step=203, now=NOW)
    assert found.partial_newest == PARTIAL
    assert found.summary.endswith("; partial newer save /ck/epoch=0-step=200.ckpt.tmp (step 200): no completion marker")
    none_valid = restart_checkpoint(_report(None, incomplete=(PARTIAL,)), directory="/ck", last_step=203, now=NOW)
    assert none_valid.latest_valid is None and none_valid.partial_newest == PARTIAL
    assert none_valid.summary.startswith("no valid checkpoint in /ck: the job restarts from scratch (203 steps redone)")


def test_the_previous_valid_checkpoint_is_kept_for_a_fallback() -> None:
    checked = (_checked(100), _checked(140), _checked(180), _checked(200, CheckpointStatus.INCOMPLETE))
    found = restart_checkpoint(_report(_ref(180), checked=checked), directory="/ck", last_step=None, now=NOW)
    assert found.previous_valid == _checked(140)


def test_a_failed_scan_is_unknown_never_no_checkpoint() -> None:
    failed = restart_checkpoint(None, directory="/ck", last_step=5, now=NOW)
    assert failed.error and failed.latest_valid is None
    assert failed.summary == "checkpoints in /ck unknown: the checkpoint scan did not answer"
    denied = restart_checkpoint(
        CheckpointReport(dir="/ck", format=None, latest_valid=None, error="permission denied"),
        directory="/ck", last_step=5, now=NOW,
    )  # fmt: skip
    assert denied.error == "permission denied"
    assert (
        judge_resume_point(failed, WaitResumeResult(outcome=ResumeOutcome.RESUMED, observed_at=NOW, step=1))[0]
        is ResumePoint.UNCONFIRMED
    )


def test_last_seen_step_is_the_highest_of_any_rank() -> None:
    assert last_seen_step(None) is None and last_seen_step(ProgressState()) is None
    progress = observe(ProgressState(), [sample(0, 40, 1), sample(1, 42, 1.1)], at(2))
    assert last_seen_step(progress) == 42


def test_quarantine_only_when_asked_with_a_partial_save_and_a_complete_one_to_fall_back_to() -> None:
    found = RestartCheckpoint(dir="/ck", latest_valid=_ref(180), partial_newest=PARTIAL)
    assert should_quarantine(CheckpointFallback.QUARANTINE, found)
    assert not should_quarantine(CheckpointFallback.OFF, found)
    assert not should_quarantine(CheckpointFallback.QUARANTINE, found.model_copy(update={"partial_newest": None}))
    assert not should_quarantine(CheckpointFallback.QUARANTINE, found.model_copy(update={"latest_valid": None}))
    assert not should_quarantine(CheckpointFallback.QUARANTINE, found.model_copy(update={"quarantined": ("/ck/x",)}))
    assert not should_quarantine(CheckpointFallback.QUARANTINE, None)


# ----- after the restart --------------------------------------------------------------------------------------------
FOUND = RestartCheckpoint(dir="/ck", latest_valid=_ref(180))


def _resumed(**kw: object) -> WaitResumeResult:
    return WaitResumeResult.model_validate({"outcome": ResumeOutcome.RESUMED, "observed_at": NOW, **kw})


def test_the_frameworks_own_load_line_naming_the_checkpoint_verifies() -> None:
    for name in ("/ck/epoch=0-step=180.ckpt", "epoch=0-step=180.ckpt", "./epoch=0-step=180.ckpt"):
        assert judge_resume_point(FOUND, _resumed(checkpoint=name, step=181))[0] is ResumePoint.VERIFIED
    # Unnamed, with the step it holds.
    assert judge_resume_point(FOUND, _resumed(checkpoint="x", checkpoint_step=180))[0] is ResumePoint.VERIFIED
    point, note = judge_resume_point(FOUND, _resumed(checkpoint="/ck/epoch=0-step=120.ckpt", checkpoint_step=120))
    assert point is ResumePoint.OTHER and "at step 120, not /ck/epoch=0-step=180.ckpt (step 180)" in note


def test_the_first_step_equal_to_the_checkpoints_or_the_next_verifies() -> None:
    assert judge_resume_point(FOUND, _resumed(step=181))[0] is ResumePoint.VERIFIED
    assert judge_resume_point(FOUND, _resumed(step=180))[0] is ResumePoint.VERIFIED
    assert judge_resume_point(FOUND, _resumed(step=150))[0] is ResumePoint.OTHER
    assert judge_resume_point(FOUND, _resumed(step=190))[0] is ResumePoint.UNCONFIRMED  # logs every 10 steps
    assert judge_resume_point(FOUND, _resumed())[0] is ResumePoint.UNCONFIRMED  # a new checkpoint decided


def test_from_scratch_although_a_valid_checkpoint_existed() -> None:
    for resumed in (_resumed(step=0), _resumed(step=1), _resumed(from_scratch=True, checkpoint="none", step=1)):
        point, note = judge_resume_point(FOUND, resumed)
        assert point is ResumePoint.FROM_SCRATCH, resumed
    anomaly = from_scratch_anomaly(FOUND, note, NOW)
    assert anomaly.kind is AnomalyKind.RESTARTED_FROM_SCRATCH
    assert anomaly.summary.endswith(": 180 steps will be trained again")
    nothing = RestartCheckpoint(dir="/ck")
    assert judge_resume_point(nothing, _resumed(step=1))[0] is ResumePoint.NO_CHECKPOINT
    assert judge_resume_point(None, _resumed(step=1))[0] is ResumePoint.NO_CHECKPOINT


# ----- a corrupt checkpoint -----------------------------------------------------------------------------------------
LOAD_FAILED = LogFinding(
    kind=FindingKind.PYTHON_EXCEPTION,
    rank=0,
    exception="RuntimeError",
    text="RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
    culprit=True,
    failure_class=FailureClass.INFRASTRUCTURE,
)
USER_BUG = Attribution(failure_class=FailureClass.USER, cause=Cause.USER_BUG, retryable=False, confidence=0.75)


def test_a_load_failure_is_the_checkpoint_io_rows_culprit_line() -> None:
    assert is_checkpoint_load_failure(LOAD_FAILED)
    assert not is_checkpoint_load_failure(LOAD_FAILED.model_copy(update={"culprit": False}))
    assert not is_checkpoint_load_failure(LOAD_FAILED.model_copy(update={"failure_class": FailureClass.USER}))


def test_a_corrupt_checkpoint_with_an_older_valid_one_is_retryable_not_the_users_bug() -> None:
    partial = RestartCheckpoint(dir="/ck", latest_valid=_ref(180), partial_newest=PARTIAL)
    retried = corrupt_checkpoint_retry(USER_BUG, [LOAD_FAILED], partial, CheckpointFallback.OFF)
    assert retried.retryable and retried.cause == "checkpoint-unreadable"
    assert retried.failure_class is FailureClass.INFRASTRUCTURE and retried.implicated_nodes == ()
    assert "could not load /ck/epoch=0-step=200.ckpt.tmp" in retried.explanation
    assert "/ck/epoch=0-step=180.ckpt is valid: the restart tries again" in retried.explanation
    quarantined = corrupt_checkpoint_retry(USER_BUG, [LOAD_FAILED], partial, CheckpointFallback.QUARANTINE)
    assert "it is set aside before the restart" in quarantined.explanation
    # A corrupt latest valid (structure fine, content not) with an older valid one.
    corrupt = RestartCheckpoint(dir="/ck", latest_valid=_ref(180), previous_valid=_checked(140))
    assert corrupt_checkpoint_retry(USER_BUG, [LOAD_FAILED], corrupt, CheckpointFallback.OFF).retryable


def test_without_an_older_valid_checkpoint_or_a_load_failure_the_attribution_stands() -> None:
    alone = RestartCheckpoint(dir="/ck", latest_valid=_ref(180))
    assert corrupt_checkpoint_retry(USER_BUG, [LOAD_FAILED], alone, CheckpointFallback.OFF) == USER_BUG
    partial = RestartCheckpoint(dir="/ck", latest_valid=_ref(180), partial_newest=PARTIAL)
    value_error = LOAD_FAILED.model_copy(update={"failure_class": FailureClass.USER, "text": "ValueError: shape"})
    assert corrupt_checkpoint_retry(USER_BUG, [value_error], partial, CheckpointFallback.OFF) == USER_BUG
    assert corrupt_checkpoint_retry(USER_BUG, [LOAD_FAILED], None, CheckpointFallback.OFF) == USER_BUG
    retryable = USER_BUG.model_copy(update={"retryable": True, "cause": "rank-crash"})
    assert corrupt_checkpoint_retry(retryable, [LOAD_FAILED], partial, CheckpointFallback.OFF) == retryable


def test_the_same_checkpoint_failing_again_without_quarantine_is_not_retried() -> None:
    partial = RestartCheckpoint(dir="/ck", latest_valid=_ref(180), partial_newest=PARTIAL)
    first = corrupt_checkpoint_retry(USER_BUG, [LOAD_FAILED], partial, CheckpointFallback.OFF)
    earlier = Incident.model_validate(
        {
            "number": 2,
            "id": "7-2",
            "detected_at": NOW,
            "anomaly": {"kind": "rank_crash", "observed_at": NOW, "summary": "x"},
            "attribution": first,
            "checkpoint": partial,
        }
    )
    again = corrupt_checkpoint_retry(USER_BUG, [LOAD_FAILED], partial, CheckpointFallback.OFF, [earlier])
    assert not again.retryable and again.cause == "checkpoint-unreadable"
    assert "set ckpt_fallback=quarantine, or move it aside" in again.explanation
    # With quarantine asked, it is set aside this time: retried.
    assert corrupt_checkpoint_retry(
        USER_BUG, [LOAD_FAILED], partial, CheckpointFallback.QUARANTINE, [earlier]
    ).retryable


def test_an_attribution_already_naming_an_unreadable_checkpoint_is_retried_the_same_way() -> None:
    unreadable = Attribution(
        failure_class=FailureClass.INFRASTRUCTURE, cause="checkpoint-unreadable", retryable=False, confidence=0.8
    )
    dedicated = LOAD_FAILED.model_copy(update={"kind": FindingKind.RANK_EXIT, "failure_class": None})
    partial = RestartCheckpoint(dir="/ck", latest_valid=_ref(180), partial_newest=PARTIAL)
    retried = corrupt_checkpoint_retry(unreadable, [dedicated], partial, CheckpointFallback.OFF)
    assert retried.retryable and retried.cause == "checkpoint-unreadable"
    assert corrupt_checkpoint_retry(unreadable, [], partial, CheckpointFallback.OFF) == unreadable
