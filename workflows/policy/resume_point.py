"""The checkpoint a restart resumes from, and whether it did. Pure.

Before every restart (``restart_checkpoint``) the incident records the latest valid checkpoint of the job's
``ckpt=`` directory, its step and age, the steps the restart will redo (the last step seen minus the checkpoint's),
a partial save newer than it (named: the framework may try to load it), and the newest valid one before it.
``should_quarantine``: with ``ckpt_fallback=quarantine`` a partial newest save is set aside before the restart, so
the framework's own resume picks the complete one.

After the restart (``judge_resume_point``), first rule that applies:

1. The scan failed: ``UNCONFIRMED``. No valid checkpoint was recorded: from scratch is all the job could do
   (``NO_CHECKPOINT``).
2. The job's own line says it found no checkpoint: ``FROM_SCRATCH``.
3. Its load line names the recorded checkpoint (its path ends with the name, or the line's step is its step):
   ``VERIFIED``; names another step: ``OTHER``.
4. Its first step line is the checkpoint's step or the next one (frameworks count the step they resume at, or the
   first one they complete): ``VERIFIED``; step 0 or 1 while the checkpoint holds a later step: ``FROM_SCRATCH``;
   an earlier step: ``OTHER`` (an older checkpoint).
5. Otherwise ``UNCONFIRMED`` (a new checkpoint decided the resume, or a step the rules cannot place: a job that
   logs every N steps).

``corrupt_checkpoint_retry``: a load failure of a corrupt checkpoint (the job's culprit line is a checkpoint read
error) while an older valid checkpoint exists is retryable, not the user's bug; once. The same checkpoint failing
again without quarantine would fail the same way: then it is not retryable, and the explanation says what to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from workflows.domain.anomaly import build_anomaly
from workflows.domain.checkpoints import (
    CheckedCheckpoint,
    CheckpointFallback,
    CheckpointReport,
    CheckpointStatus,
    IncompleteCheckpoint,
)
from workflows.domain.findings import FindingKind
from workflows.domain.incident import (
    Anomaly,
    AnomalyKind,
    Attribution,
    FailureClass,
    Incident,
    LogFinding,
)
from workflows.domain.loop import WaitResumeResult
from workflows.domain.progress import ProgressState
from workflows.domain.resume_point import RestartCheckpoint, ResumePoint

__all__ = [
    "CHECKPOINT_UNREADABLE_CAUSE",
    "corrupt_checkpoint_retry",
    "from_scratch_anomaly",
    "is_checkpoint_load_failure",
    "judge_resume_point",
    "last_seen_step",
    "restart_checkpoint",
    "should_quarantine",
]

#: The cause of a checkpoint that cannot be loaded: the attribution names it for the signature library's checkpoint
#: load findings (``FindingKind.CHECKPOINT_LOAD`` on the formats branch), and this policy makes it retryable when
#: an older valid checkpoint exists.
CHECKPOINT_UNREADABLE_CAUSE = "checkpoint-unreadable"


def last_seen_step(progress: ProgressState | None) -> int | None:
    """The highest step any rank logged (None: no step line was ever seen)."""
    if progress is None:
        return None
    return max((r.last_step for r in progress.ranks if r.last_step is not None), default=None)


def restart_checkpoint(
    report: CheckpointReport | None, *, directory: str, last_step: int | None, now: datetime
) -> RestartCheckpoint:
    """What the restart will find in ``directory`` (``report``: the scan; None when the scan itself failed)."""
    if report is None or report.error:
        error = report.error if report is not None and report.error else "the checkpoint scan did not answer"
        summary = f"checkpoints in {directory} unknown: {error}"
        return RestartCheckpoint(dir=directory, last_seen_step=last_step, error=error, summary=summary)
    latest = report.latest_valid
    partial = _partial_newest(report.incomplete, latest.step if latest is not None else None)
    previous = _previous_valid(report.checked, latest.path if latest else "", latest.step if latest else None)
    if latest is None:
        summary = f"no valid checkpoint in {directory}: the job restarts from scratch"
        if last_step is not None:
            summary += f" ({last_step} steps redone)"
        return RestartCheckpoint(
            dir=directory, last_seen_step=last_step, partial_newest=partial, summary=_with_partial(summary, partial)
        )
    age = None if latest.saved_at is None else max(0.0, (now - latest.saved_at).total_seconds())
    lost = None
    if last_step is not None and latest.step is not None:
        lost = max(0, last_step - latest.step)
    at = f" (step {latest.step})" if latest.step is not None else ""
    summary = f"latest valid checkpoint {latest.path}{at}"
    if age is not None:
        summary += f", saved {_age(age)} ago"
    if lost is not None:
        summary += f"; {lost} steps will be redone (last seen step {last_step})"
    return RestartCheckpoint(
        dir=directory,
        latest_valid=latest,
        age_s=age,
        last_seen_step=last_step,
        steps_lost=lost,
        partial_newest=partial,
        previous_valid=previous,
        summary=_with_partial(summary, partial),
    )


def should_quarantine(fallback: CheckpointFallback, checkpoint: RestartCheckpoint | None) -> bool:
    """Set the partial newest save aside: only when asked, and only when a complete one is there to resume from."""
    return (
        fallback is CheckpointFallback.QUARANTINE
        and checkpoint is not None
        and checkpoint.partial_newest is not None
        and checkpoint.latest_valid is not None
        and not checkpoint.quarantined
    )


def judge_resume_point(checkpoint: RestartCheckpoint | None, resumed: WaitResumeResult) -> tuple[ResumePoint, str]:
    """Where the restarted job started, against the recorded checkpoint, and why (see the module docstring)."""
    if checkpoint is not None and checkpoint.error:
        return ResumePoint.UNCONFIRMED, f"the checkpoints were unknown before the restart ({checkpoint.error})"
    latest = checkpoint.latest_valid if checkpoint is not None else None
    if latest is None:
        return ResumePoint.NO_CHECKPOINT, "no valid checkpoint was recorded before the restart"
    want = f"{latest.path}" + (f" (step {latest.step})" if latest.step is not None else "")
    if resumed.from_scratch:
        return ResumePoint.FROM_SCRATCH, f"the job said it found no checkpoint, although {want} was valid"
    if resumed.checkpoint:
        if _names(latest.path, resumed.checkpoint) or (
            latest.step is not None and resumed.checkpoint_step == latest.step
        ):
            return ResumePoint.VERIFIED, f"its load line names {resumed.checkpoint} ({want})"
        if resumed.checkpoint_step is not None and latest.step is not None:
            return ResumePoint.OTHER, f"it loaded {resumed.checkpoint} at step {resumed.checkpoint_step}, not {want}"
    step = resumed.step
    if step is None or latest.step is None:
        return ResumePoint.UNCONFIRMED, f"nothing it logged places its start against {want}"
    if latest.step <= step <= latest.step + 1:
        return ResumePoint.VERIFIED, f"its first step {step} follows {want}"
    if step <= 1 < latest.step:
        return ResumePoint.FROM_SCRATCH, f"its first step is {step}, although {want} was valid"
    if step < latest.step:
        return ResumePoint.OTHER, f"its first step {step} is before {want}: it resumed from an older checkpoint"
    return ResumePoint.UNCONFIRMED, f"its first logged step {step} is past {want} (it may log every few steps)"


def from_scratch_anomaly(checkpoint: RestartCheckpoint, note: str, observed_at: datetime) -> Anomaly:
    """The incident for a job that threw its progress away: trained from step 0 with a valid checkpoint there."""
    lost = checkpoint.latest_valid.step if checkpoint.latest_valid is not None else None
    redone = f": {lost} steps will be trained again" if lost else ""
    return build_anomaly(
        AnomalyKind.RESTARTED_FROM_SCRATCH, observed_at, summary=f"restarted from scratch ({note}){redone}"
    )


def is_checkpoint_load_failure(finding: LogFinding) -> bool:
    """A culprit line that says a checkpoint could not be read: the signature library's checkpoint I/O rows (an
    exception it classes as infrastructure, not the training code's). An attribution whose cause is already
    ``checkpoint-unreadable`` (a dedicated load finding) counts too (``corrupt_checkpoint_retry``)."""
    return (
        finding.culprit
        and finding.kind is FindingKind.PYTHON_EXCEPTION
        and finding.failure_class is FailureClass.INFRASTRUCTURE
    )


def corrupt_checkpoint_retry(
    attribution: Attribution,
    findings: Sequence[LogFinding],
    checkpoint: RestartCheckpoint | None,
    fallback: CheckpointFallback,
    earlier: Iterable[Incident] = (),
) -> Attribution:
    """``attribution``, or a retryable ``checkpoint-unreadable`` one when the failure is a checkpoint that cannot be
    loaded while an older valid one exists (see the module docstring)."""
    if attribution.retryable or checkpoint is None:
        return attribution
    failed = [f for f in findings if is_checkpoint_load_failure(f)]
    if not failed and attribution.cause == CHECKPOINT_UNREADABLE_CAUSE:
        failed = [f for f in findings if f.culprit]
    target = _fallback_target(checkpoint)
    if not failed or target is None:
        return attribution
    suspect = _suspect(checkpoint)
    line = failed[0].text[:200]
    again = any(
        i.attribution is not None
        and i.attribution.cause == CHECKPOINT_UNREADABLE_CAUSE
        and i.checkpoint is not None
        and _suspect(i.checkpoint) == suspect
        for i in earlier
    )
    fixes = should_quarantine(fallback, checkpoint)
    if again and not fixes:
        explanation = (
            f"the job failed again to load {suspect} ({line}); a restart loads it again: set ckpt_fallback="
            f"quarantine, or move it aside so the framework resumes from {target}"
        )
        return attribution.model_copy(
            update={"cause": CHECKPOINT_UNREADABLE_CAUSE, "failure_class": FailureClass.INFRASTRUCTURE,
                    "explanation": explanation}
        )  # fmt: skip
    how = "it is set aside before the restart" if fixes else "the restart tries again"
    return Attribution(
        failure_class=FailureClass.INFRASTRUCTURE,
        cause=CHECKPOINT_UNREADABLE_CAUSE,
        retryable=True,
        confidence=0.7,
        implicated_ranks=tuple(sorted({f.rank for f in failed if f.rank is not None})),
        explanation=f"the job could not load {suspect} ({line}); {target} is valid: {how}, not the user's bug",
        evidence=attribution.evidence,
    )


def _fallback_target(checkpoint: RestartCheckpoint) -> str | None:
    """The older valid checkpoint the job can resume from instead of the one that failed to load."""
    if checkpoint.partial_newest is not None and checkpoint.latest_valid is not None:
        return checkpoint.latest_valid.path
    if checkpoint.previous_valid is not None:
        return checkpoint.previous_valid.path
    return None


def _suspect(checkpoint: RestartCheckpoint) -> str:
    """The checkpoint that most likely failed to load: a partial newest save, else the latest valid one."""
    if checkpoint.partial_newest is not None:
        return checkpoint.partial_newest.path
    return checkpoint.latest_valid.path if checkpoint.latest_valid is not None else checkpoint.dir


def _partial_newest(incomplete: Iterable[IncompleteCheckpoint], valid_step: int | None) -> IncompleteCheckpoint | None:
    """The newest incomplete save past the latest valid step (any, when there is no valid one)."""
    newer = [c for c in incomplete if c.step is not None and (valid_step is None or c.step > valid_step)]
    if not newer and valid_step is None:
        newer = list(incomplete)
    return max(newer, key=lambda c: c.step or 0, default=None)


def _previous_valid(
    checked: Iterable[CheckedCheckpoint], latest_path: str, step: int | None
) -> CheckedCheckpoint | None:
    older = [
        c for c in checked
        if c.status is CheckpointStatus.VALID and c.path != latest_path
        and (step is None or c.step is None or c.step < step)
    ]  # fmt: skip
    return max(older, key=lambda c: c.step or 0, default=None)


def _with_partial(summary: str, partial: IncompleteCheckpoint | None) -> str:
    if partial is None:
        return summary
    at = f" (step {partial.step})" if partial.step is not None else ""
    return f"{summary}; partial newer save {partial.path}{at}: {partial.reason}"


def _names(path: str, name: str) -> bool:
    """Whether a load line's ``name`` names ``path`` (lines give a full path, a relative one, or a base name)."""
    name = name.strip().rstrip("/")
    path = path.rstrip("/")
    return bool(name) and (path == name or path.endswith("/" + name.lstrip("./")) or name.endswith(path))


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
