"""What the watch does after each poll, and what the resume check concludes. Pure: the activities gather the facts
(the scheduler's view of the job, the crash findings and step lines of the new log lines, the ranks' progress),
call these functions, and act on the answer.

``decide_poll``, first rule that applies:

1. Only victims' lines (a lost peer, "Terminated") and a scheduler view that may lag the logs by a second: ask the
   scheduler again before deciding (``REFRESH_SCHEDULER``).
2. Those victims' lines while the job was requeued, cancelled, sent back to PENDING or is being torn down: someone
   stopped it from outside, its ranks' last words are not a failure (a failed job ends FAILED and is caught by 6).
3. Crash findings: a ``rank_crash`` anomaly.
4. One of the job's nodes is DOWN or NOT_RESPONDING (while the job is not over): a ``node_failure`` anomaly.
5. The scheduler no longer lists the job: ``GONE``.
6. Its state or restart count changed: a ``job_failed`` anomaly if it ended in a failure, else ``CHANGED``.
7. Running: a hang verdict is a ``hang`` anomaly; else (stragglers watched) a straggler verdict naming a node not
   reported yet in this attempt is a ``straggler`` anomaly; else, for a job that never showed a step line or a
   heartbeat, a due liveness sample returns ``SAMPLE`` (the workflow samples its ranks' stacks and checkpoints).
8. Otherwise keep watching.

``decide_resume``: the job gone or cancelled ends the wait; else, once the new log lines are read, the restarted
attempt trains again on the first of these signals (``ProgressSignal``, named in the answer): its first step line;
a new complete checkpoint in its ``ckpt=`` directory saved after the restart (a job that prints no step line still
saves); its ranks' stacks advancing between samples. A failed state or a culprit's line from the new attempt means
it failed again, and the answer carries the new attempt's own crash lines (every finding of the new attempt, not
only the culprit's) so the next incident judges them; a heartbeat file touched or a checkpoint load line after
the restart are signs of life that tell "failed after it started" from "failed before it trained".
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

from workflows.domain.anomaly import build_anomaly
from workflows.domain.base import Frozen
from workflows.domain.checkpoints import CheckpointRef
from workflows.domain.hang import HangPolicy, HangVerdict
from workflows.domain.incident import Anomaly, AnomalyKind, LogFinding
from workflows.domain.loop import ResumeOutcome, WatchOutcome
from workflows.domain.progress import ProgressSignal, ProgressState
from workflows.domain.recovery import StragglerAction
from workflows.domain.slurm import JobState, SlurmJob
from workflows.domain.straggler import StragglerPolicy, StragglerVerdict
from workflows.policy.hang import assess_hang, may_be_hung
from workflows.policy.straggler import judge_stragglers

__all__ = [
    "ResumeDecision",
    "ResumeFacts",
    "StepLine",
    "WatchAction",
    "WatchDecision",
    "WatchFacts",
    "decide_poll",
    "decide_resume",
    "is_new_checkpoint",
]

#: States of a job someone stopped on purpose (a requeue shows PENDING before its restart count moves).
_STOPPED_STATES = frozenset({JobState.CANCELLED, JobState.PENDING, JobState.COMPLETING})


class WatchFacts(Frozen):
    """Everything one poll of the watch gathered, and what the watch was told to compare it with."""

    now: datetime
    job: SlurmJob | None
    """The scheduler's view of the job; None when it no longer lists it."""
    scheduler_fresh: bool = False
    """``job`` was read from the scheduler just now, not from the shared snapshot (which may lag the logs)."""
    findings: tuple[LogFinding, ...] = ()
    """Crash findings in this poll's new log lines (informational ones already dropped)."""
    unresponsive_nodes: tuple[str, ...] = ()
    """The job's nodes (as last seen) that the scheduler shows DOWN or NOT_RESPONDING."""
    progress: ProgressState
    """The ranks' progress, this poll's step lines and heartbeats folded in."""
    last_state: JobState | None = None
    last_restart_count: int = 0
    hang: HangPolicy = HangPolicy()
    stragglers: StragglerPolicy = StragglerPolicy()
    straggler_action: StragglerAction = StragglerAction.REPORT
    reported_straggler_nodes: tuple[str, ...] = ()
    sample_due: bool = False
    """This watch was asked to return for a liveness sample (``JobWatchInput.sample_after_s``) and that long has
    passed since it started."""
    progress_unchanged: bool = False
    """``progress`` is the state the previous poll's decision kept watching with, unchanged since (no step line or
    heartbeat came): its straggler verdict cannot have changed (``assess_stragglers`` changes nothing without new
    samples) and named no new node then, so it is not judged again."""


class WatchAction(StrEnum):
    KEEP_WATCHING = "keep_watching"
    """Nothing to report: sleep, poll again."""
    REFRESH_SCHEDULER = "refresh_scheduler"
    """Read the job from the scheduler now (not the shared snapshot) and decide again."""
    RETURN = "return"
    """Return ``outcome`` to the workflow."""


class WatchDecision(Frozen):
    action: WatchAction
    outcome: WatchOutcome | None = None
    """With ``RETURN``."""
    anomaly: Anomaly | None = None
    findings: tuple[LogFinding, ...] = ()
    """The findings behind a ``rank_crash`` anomaly."""
    progress: ProgressState | None = None
    """The progress to carry on: into the next poll, or back to the workflow (with every outcome)."""
    hang: HangVerdict | None = None
    stragglers: StragglerVerdict | None = None


def decide_poll(facts: WatchFacts) -> WatchDecision:
    """What to do after one poll (see the module docstring for the rules, in order)."""
    job, now = facts.job, facts.now
    findings = facts.findings
    if findings and not any(f.culprit for f in findings):
        if not facts.scheduler_fresh:
            return WatchDecision(action=WatchAction.REFRESH_SCHEDULER, progress=facts.progress)
        if _stopped_from_outside(job, facts.last_restart_count):
            findings = ()
    # Every anomaly carries the ranks' progress back: the incident records the last step seen (the steps a restart
    # redoes), and the next watch keeps the learned timing.
    if findings:
        anomaly = build_anomaly(AnomalyKind.RANK_CRASH, now, job=job, findings=findings)
        return _anomaly(anomaly, findings=findings, progress=facts.progress)
    down = facts.unresponsive_nodes if job is None or not job.state.is_terminal() else ()
    if down:
        anomaly = build_anomaly(AnomalyKind.NODE_FAILURE, now, job=job, down_nodes=down)
        return _anomaly(anomaly, progress=facts.progress)
    if job is None:
        return WatchDecision(action=WatchAction.RETURN, outcome=WatchOutcome.GONE, progress=facts.progress)
    if job.restart_count != facts.last_restart_count or job.state is not facts.last_state:
        if job.state.is_failure():
            return _anomaly(build_anomaly(AnomalyKind.JOB_FAILED, now, job=job), progress=facts.progress)
        return WatchDecision(action=WatchAction.RETURN, outcome=WatchOutcome.CHANGED, progress=facts.progress)
    progress = facts.progress
    if job.state is JobState.RUNNING:
        # The verdict is built only when the job could be hung (most polls of a stepping job: not).
        silent = (
            assess_hang(progress, now, facts.hang, expected_ranks=range(job.task_count))
            if may_be_hung(progress, now, facts.hang)
            else None
        )
        if silent is not None and silent.hung:
            anomaly = build_anomaly(AnomalyKind.HANG, now, job=job, verdict=silent)
            return _anomaly(anomaly, progress=progress, hang=silent)
        if facts.straggler_action is not StragglerAction.OFF and not facts.progress_unchanged:
            # Judged every poll with new samples (the streaks count them); the verdict is built only to report.
            progress, judged = judge_stragglers(progress, facts.stragglers)
            if judged.flagged and judged.node_names - set(facts.reported_straggler_nodes):
                slow = judged.verdict()
                anomaly = build_anomaly(AnomalyKind.STRAGGLER, now, job=job, verdict=slow)
                return _anomaly(anomaly, progress=progress, stragglers=slow)
        if facts.sample_due and not _heard(progress):
            return WatchDecision(action=WatchAction.RETURN, outcome=WatchOutcome.SAMPLE, progress=progress)
    return WatchDecision(action=WatchAction.KEEP_WATCHING, progress=progress)


def _heard(progress: ProgressState) -> bool:
    """Whether the job ever showed a step line or a heartbeat (then the step-line hang rules watch it)."""
    return progress.ever_progressed or any(r.last_activity_at is not None for r in progress.ranks)


def _stopped_from_outside(job: SlurmJob | None, last_restart_count: int) -> bool:
    """Requeued (its restart count may lag), cancelled, or being torn down: the scheduler's next state says why."""
    return job is not None and (job.restart_count > last_restart_count or job.state in _STOPPED_STATES)


def _anomaly(
    anomaly: Anomaly,
    *,
    findings: Sequence[LogFinding] = (),
    progress: ProgressState | None = None,
    hang: HangVerdict | None = None,
    stragglers: StragglerVerdict | None = None,
) -> WatchDecision:
    return WatchDecision(
        action=WatchAction.RETURN,
        outcome=WatchOutcome.ANOMALY,
        anomaly=anomaly,
        findings=tuple(findings),
        progress=progress,
        hang=hang,
        stragglers=stragglers,
    )


class StepLine(Frozen):
    """A training step line, as the resume check needs it."""

    step: int
    at: datetime | None = None
    """The line's own time, if it has one."""


class ResumeFacts(Frozen):
    """One poll of the resume check: the job, and (once read) what its new log lines and files say."""

    job: SlurmJob | None
    expected_restart_count: int = 0
    not_before: datetime | None = None
    """See ``WaitResumeInput.not_before``."""
    logs_read: bool = False
    """Whether ``steps`` and ``findings`` hold this poll's new lines (the logs are read only if the job is there)."""
    steps: tuple[StepLine, ...] = ()
    findings: tuple[LogFinding, ...] = ()
    """Crash findings in the new lines (informational ones already dropped)."""
    checkpoint_loads: tuple[datetime | None, ...] = ()
    """The times of this poll's checkpoint load lines (None: the line has no time of its own)."""
    heartbeats: tuple[datetime, ...] = ()
    """The mtimes of the job's heartbeat files, one per rank."""
    latest_checkpoint: CheckpointRef | None = None
    """The newest valid checkpoint in the job's ``ckpt=`` directory now (None: none, or no directory)."""
    restart_checkpoint: CheckpointRef | None = None
    """The newest valid checkpoint when the job was restarted."""
    stacks_advancing: bool = False
    """The node agents' stack samples of the new attempt moved (``workflows.policy.stacks.stacks_progress``)."""


class ResumeDecision(Frozen):
    outcome: ResumeOutcome | None = None
    """None: not decided yet (read the logs if ``read_logs``, else wait and poll again)."""
    read_logs: bool = False
    first_step: StepLine | None = None
    """With ``RESUMED`` by a step line: the restarted attempt's first step line."""
    signal: ProgressSignal | None = None
    """With ``RESUMED``: the signal that decided."""
    new_checkpoint: CheckpointRef | None = None
    """With ``RESUMED`` by ``CHECKPOINT``: the checkpoint the new attempt saved."""
    signs_of_life: tuple[ProgressSignal, ...] = ()
    """The progress signals of the new attempt seen in this poll (a step line only with ``RESUMED``)."""
    findings: tuple[LogFinding, ...] = ()
    """This poll's findings of the new attempt (victims' lines too): the caller keeps them for ``FAILED_AGAIN``."""


def decide_resume(facts: ResumeFacts) -> ResumeDecision:
    """Whether the restarted job resumed, failed again, or went away (see the module docstring)."""
    job = facts.job
    if job is None:
        return ResumeDecision(outcome=ResumeOutcome.GONE)
    if job.state is JobState.CANCELLED:
        return ResumeDecision(outcome=ResumeOutcome.CANCELLED)
    if not facts.logs_read:
        return ResumeDecision(read_logs=True)
    # Any step line after the restart is the new attempt's: after a failure no data-parallel rank can complete a
    # step (it needs every peer), so the old attempt cannot print one.
    current = job.restart_count >= facts.expected_restart_count
    restarted = current and job.state is not JobState.PENDING
    steps = [s for s in facts.steps if _is_new(s.at, restarted, facts.not_before)]
    first_step = min(steps, key=lambda s: (s.at.timestamp() if s.at else float("inf"), s.step), default=None)
    signs = _signs_of_life(facts, restarted)
    if first_step is not None:
        return ResumeDecision(
            outcome=ResumeOutcome.RESUMED,
            first_step=first_step,
            signal=ProgressSignal.STEP_LINE,
            signs_of_life=(ProgressSignal.STEP_LINE, *signs),
        )
    saved = facts.latest_checkpoint
    if restarted and is_new_checkpoint(saved, facts.restart_checkpoint, facts.not_before):
        return ResumeDecision(
            outcome=ResumeOutcome.RESUMED, signal=ProgressSignal.CHECKPOINT, new_checkpoint=saved, signs_of_life=signs
        )
    if restarted and facts.stacks_advancing:
        return ResumeDecision(outcome=ResumeOutcome.RESUMED, signal=ProgressSignal.STACKS, signs_of_life=signs)
    # Until the successor runs, new lines are the previous attempt's last words (its peers' tracebacks, srun's
    # summary): they belong to the incident being recovered, not to a new one. Only a culprit's line proves the
    # successor failed: "Terminated" victims' lines are the old attempt being stopped (they can arrive after a
    # successor that started at once is already running).
    new = tuple(f for f in facts.findings if _is_new(f.at, restarted, facts.not_before))
    if (current and job.state.is_failure()) or (restarted and any(f.culprit for f in new)):
        return ResumeDecision(outcome=ResumeOutcome.FAILED_AGAIN, signs_of_life=signs, findings=new)
    return ResumeDecision(signs_of_life=signs, findings=new)


def is_new_checkpoint(latest: CheckpointRef | None, at_restart: CheckpointRef | None, since: datetime | None) -> bool:
    """Whether ``latest`` was saved by the restarted attempt: completed at or after ``since`` (the restart), and
    not the checkpoint that was already there. Without a completion time nothing is claimed: an old attempt that
    was still running when the directory was scanned may have saved it."""
    if latest is None or latest.saved_at is None or since is None or latest.saved_at < since:
        return False
    if at_restart is None:
        return True
    if latest.step is not None and at_restart.step is not None:
        return latest.step > at_restart.step
    return latest.path != at_restart.path


def _signs_of_life(facts: ResumeFacts, restarted: bool) -> tuple[ProgressSignal, ...]:
    """The new attempt's signs of life in this poll that do not prove a trained step on their own."""
    signs: list[ProgressSignal] = []
    if any(_is_new(at, restarted, facts.not_before) for at in facts.checkpoint_loads):
        signs.append(ProgressSignal.CHECKPOINT_LOAD)
    since = facts.not_before
    if any(since is None or at >= since for at in facts.heartbeats) and (restarted or since is not None):
        signs.append(ProgressSignal.HEARTBEAT)
    return tuple(signs)


def _is_new(at: datetime | None, restarted: bool, not_before: datetime | None) -> bool:
    """Whether a line can be the restarted attempt's (see ``WaitResumeInput.not_before``)."""
    if not_before is None:
        return True
    if at is not None:
        return at >= not_before
    return restarted
