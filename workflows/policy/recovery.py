"""JobRecovery's decisions: when the loop ends, when to give up, what follows observe mode or a restart. Pure.

The workflow (``workflows.job_recovery``) sequences activities and records; each branch it takes is decided
here, from typed facts, so that every answer has a unit test without Temporal. An ``Ending`` says how the
workflow ends (its result) and what the incident's outcome reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from workflows.domain.anomaly import build_anomaly
from workflows.domain.base import Frozen
from workflows.domain.fleet import FleetMode, IsolationDecision
from workflows.domain.gpu import GpuEvent, GpuHealthReport
from workflows.domain.hang import HangPolicy
from workflows.domain.incident import Anomaly, AnomalyKind, Attribution, LogFinding
from workflows.domain.loop import ResumeOutcome, WaitResumeResult
from workflows.domain.progress import ProgressSignal
from workflows.domain.recovery import DetectionPolicy, RecoverySpec, RecoveryState, StragglerAction
from workflows.domain.slurm import JobState
from workflows.domain.straggler import StragglerVerdict
from workflows.policy.budget import budget_spent
from workflows.policy.implicit import slowdown_reasons
from workflows.policy.straggler import restart_pays_off

__all__ = [
    "AfterResume",
    "Ending",
    "ObserveNext",
    "StragglerChoice",
    "after_observe",
    "after_requeue",
    "after_resume",
    "attempt_gpu_events",
    "cancelled_by_owner",
    "expected_restart_count",
    "failed_again_summary",
    "fleet_silent",
    "give_up_before_isolating",
    "hang_policy",
    "job_over",
    "note_unread_agents",
    "requeue_refused",
    "restart_rejected",
    "resumed_note",
    "scheduler_forgot",
    "straggler_choice",
    "throttled_gpus",
    "unknown_job",
    "verify_signals",
]

CANCELLED_OUTCOME = "cancelled by its owner"
FAILED_AGAIN_OUTCOME = "failed again before resuming"
RESUMED_OUTCOME = "resumed"


class Ending(Frozen):
    """The workflow ends: in which state, why (its result's reason), and the incident's outcome."""

    state: RecoveryState
    reason: str
    outcome: str = ""
    """What the open incident's outcome becomes; empty: the incident is left as it is."""


def unknown_job(job_id: int) -> Ending:
    """The scheduler never knew the job the workflow was started for."""
    return Ending(state=RecoveryState.GAVE_UP, reason=f"Slurm does not know job {job_id}")


def scheduler_forgot() -> Ending:
    """The scheduler no longer lists a job it knew: nothing left to watch or restart."""
    return Ending(state=RecoveryState.GAVE_UP, reason="the scheduler no longer lists the job")


def job_over(state: JobState) -> Ending | None:
    """Between incidents: whether the job is over (completed, or cancelled by its owner)."""
    if state is JobState.COMPLETED:
        return Ending(state=RecoveryState.FINISHED, reason="the job completed")
    if state is JobState.CANCELLED:
        return Ending(state=RecoveryState.FINISHED, reason="the job was cancelled by its owner")
    return None


def cancelled_by_owner(*, during_recovery: bool) -> Ending:
    """The owner cancelled the job: not an incident to recover from."""
    reason = "the job was cancelled by its owner" + (" during recovery" if during_recovery else "")
    return Ending(state=RecoveryState.FINISHED, reason=reason, outcome=CANCELLED_OUTCOME)


def expected_restart_count(kind: AnomalyKind, recorded: int, observed: int) -> int:
    """The restart count the requeue should find before it acts (its idempotency check).

    A node failure may already have been requeued by Slurm itself (``--requeue`` on node failure): the count the
    watch observed then runs ahead of the one Rebound recorded, and the lower one is the attempt that failed.
    """
    return min(recorded, observed) if kind is AnomalyKind.NODE_FAILURE else recorded


def give_up_before_isolating(attribution: Attribution, restarts_used: int, budget: int) -> Ending | None:
    """Whether to give up before asking the Fleet: a failure a restart cannot fix, or no restart left."""
    if not attribution.retryable:
        return Ending(
            state=RecoveryState.GAVE_UP,
            reason=f"not retryable ({attribution.cause}): {attribution.explanation}",
            outcome="not retryable",
        )
    if budget_spent(restarts_used, budget):
        return Ending(
            state=RecoveryState.GAVE_UP,
            reason=f"restart budget spent ({restarts_used}/{budget})",
            outcome="budget spent",
        )
    return None


def fleet_silent(request_id: str, timeout_s: float) -> IsolationDecision:
    """No answer from the Fleet in time counts as observe mode.

    A Rebound that cannot reach its own safety limits acts on nothing rather than on everything.
    """
    return IsolationDecision(
        request_id=request_id,
        mode=FleetMode.OBSERVE,
        act=False,
        reasons=(f"the Fleet did not answer within {timeout_s:.0f} s",),
    )


class ObserveNext(Frozen):
    """What follows a Fleet answer that says not to act (observe mode, outside the canary)."""

    outcome: str
    ending: Ending | None = None
    """The job already failed: the workflow ends; None: it goes on watching."""
    note: str = ""
    """The timeline's note when it goes on watching."""


def after_observe(decision: IsolationDecision, job_state: JobState, last_state: JobState | None) -> ObserveNext:
    """Observe mode: the incident is recorded, nothing is drained or restarted.

    A job that ended (by the incident's observation or the latest one) is not coming back: the workflow ends. One
    still running (a hang, a silent fault) is watched again.
    """
    mode = decision.mode.value
    outcome = f"observed only ({mode} mode)"
    if job_state.is_terminal() or (last_state is not None and last_state.is_terminal()):
        ending = Ending(state=RecoveryState.FINISHED, reason=f"the job failed; {mode} mode: not restarted")
        return ObserveNext(outcome=outcome, ending=ending)
    return ObserveNext(outcome=outcome, note=f"{mode} mode: nothing done")


def restart_rejected(decision: IsolationDecision) -> Ending | None:
    """The Fleet acts but an operator rejected the restart (or its approval expired to rejection)."""
    if decision.restart_allowed:
        return None
    return Ending(
        state=RecoveryState.GAVE_UP,
        reason=f"the restart was not approved: {'; '.join(decision.reasons)}",
        outcome="restart rejected",
    )


def requeue_refused(kind: str, cause: str) -> Ending:
    """A permanent refusal of the requeue (a ``--no-requeue`` job, a job Slurm forgot): say so and stop."""
    return Ending(
        state=RecoveryState.GAVE_UP,
        reason=f"the job cannot be requeued ({kind}): {cause}",
        outcome=f"requeue refused: {kind}",
    )


def after_requeue(job_state: JobState | None) -> Ending | None:
    """The requeue was done; the owner may have cancelled the job meanwhile."""
    return cancelled_by_owner(during_recovery=True) if job_state is JobState.CANCELLED else None


class AfterResume(Frozen):
    """What the restart's verification leads to."""

    outcome: str = ""
    """The incident's outcome (empty: left as it is)."""
    ending: Ending | None = None
    """The workflow ends (cancelled, or the scheduler forgot the job)."""
    failed_again: Anomaly | None = None
    """The restarted job failed again: the next incident, at once."""
    findings: tuple[LogFinding, ...] = ()
    """With ``failed_again``: the restarted attempt's crash lines, handed to the next incident's attribution."""

    @property
    def resumed(self) -> bool:
        return self.ending is None and self.failed_again is None


def after_resume(resumed: WaitResumeResult) -> AfterResume:
    """Verification's answer: trains again, failed again (a new incident), or the job is gone.

    A job that failed again is judged on its own evidence: the anomaly carries the restarted attempt's crash lines
    (the next incident attributes them), and its summary says "before it trained a step" only when the attempt
    showed no progress signal at all (no load line, heartbeat, checkpoint, stack movement).
    """
    if resumed.outcome is ResumeOutcome.CANCELLED:
        ending = cancelled_by_owner(during_recovery=True)
        return AfterResume(outcome=ending.outcome, ending=ending)
    if resumed.outcome is ResumeOutcome.GONE:
        return AfterResume(ending=scheduler_forgot())
    if resumed.outcome is ResumeOutcome.FAILED_AGAIN:
        again = build_anomaly(
            AnomalyKind.RANK_CRASH,
            resumed.observed_at,
            job=resumed.job,
            findings=resumed.findings,
            summary=failed_again_summary(resumed),
        )
        return AfterResume(outcome=FAILED_AGAIN_OUTCOME, failed_again=again, findings=resumed.findings)
    return AfterResume(outcome=RESUMED_OUTCOME)


def failed_again_summary(resumed: WaitResumeResult) -> str:
    """What the restarted attempt did before it failed, from the signals it showed, and its first culprit line."""
    culprit = next((f for f in resumed.findings if f.culprit), None) or next(iter(resumed.findings), None)
    because = f": {culprit.text[:200]}" if culprit is not None else ""
    if not resumed.signs_of_life:
        return f"the restarted job failed before it trained a step{because}"
    shown = ", ".join(_SIGN_WORDS[s] for s in resumed.signs_of_life)
    return f"the restarted job failed again after it started ({shown}){because}"


def verify_signals(spec: RecoverySpec) -> str:
    """The signals the resume check will accept for this job, for the VERIFYING timeline entry."""
    signals = ["a step line"]
    if spec.checkpoint_dir:
        signals.append(f"a new complete checkpoint in {spec.checkpoint_dir}")
    return " or ".join(signals)


def resumed_note(resumed: WaitResumeResult) -> str:
    """How the restarted job showed it trains again, naming the signal that decided (for the timeline)."""
    where = f" from {resumed.checkpoint}" if resumed.checkpoint else ""
    saved = resumed.new_checkpoint
    if resumed.signal is ProgressSignal.CHECKPOINT and saved is not None:
        at = f" (step {saved.step})" if saved.step is not None else ""
        return f"training again{where}: it saved a new complete checkpoint {saved.path}{at} [signal: checkpoint]"
    if resumed.signal is ProgressSignal.STACKS:
        return f"training again{where}: its ranks' stacks move between samples [signal: stacks]"
    return f"training again at step {resumed.step}{where} [signal: step line]"


_SIGN_WORDS = {
    ProgressSignal.STEP_LINE: "logged a step",
    ProgressSignal.CHECKPOINT: "saved a checkpoint",
    ProgressSignal.STACKS: "its stacks moved",
    ProgressSignal.HEARTBEAT: "touched its heartbeat",
    ProgressSignal.CHECKPOINT_LOAD: "logged a checkpoint load",
}


def hang_policy(detection: DetectionPolicy, spec: RecoverySpec) -> HangPolicy:
    """The hang window the watch applies: the job's own ``hang_after_s`` overrides the learned one."""
    if spec.hang_after_s is None:
        return detection.hang
    return detection.hang.model_copy(update={"override_s": spec.hang_after_s})


def attempt_gpu_events(
    anomaly: Anomaly,
    signalled: Iterable[GpuEvent],
    reports: Iterable[GpuHealthReport | None],
    start: datetime | None,
) -> tuple[GpuEvent, ...]:
    """The GPU events attribution weighs: the anomaly's, the signalled ones, and the nodes' of this attempt.

    Only this attempt's events from the nodes' reads: an XID from before it started is another job's story (and
    evidence for the node's history, not for this failure). Each event once, in the order first seen.
    """
    events = list(anomaly.gpu_events) + [e for e in signalled if e not in anomaly.gpu_events]
    for report in reports:
        if report is None:
            continue
        events += [
            e for e in report.events
            if (start is None or e.observed_at is None or e.observed_at >= start) and e not in events
        ]  # fmt: skip
    return tuple(events)


def note_unread_agents(
    attribution: Attribution, nodes: Sequence[str], reports: Sequence[GpuHealthReport | None]
) -> Attribution:
    """The attribution, saying which job nodes' agents gave no GPU read (a dead agent is no evidence either way,
    but an operator reading "rank-crash, exclude" must know that the node's hardware was not looked at)."""
    unread = [node for node, report in zip(nodes, reports, strict=True) if report is None]
    if not unread:
        return attribution
    note = "; ".join(f"{node}: node agent did not answer (no GPU read)" for node in unread)
    explanation = f"{attribution.explanation}; {note}" if attribution.explanation else note
    return attribution.model_copy(update={"explanation": explanation})


def throttled_gpus(nodes: Sequence[str], reports: Sequence[GpuHealthReport | None]) -> dict[str, list[str]]:
    """Per straggling node, its GPUs that slowed themselves down (thermal or power brake, hardware slowdown)."""
    throttled: dict[str, list[str]] = {}
    for node, report in zip(nodes, reports, strict=True):
        for sample in report.samples if report is not None else ():
            reasons = slowdown_reasons(sample.clocks_event_reasons)
            if reasons:
                throttled.setdefault(node, []).append(
                    f"GPU {sample.index}: {'+'.join(reasons)} (clocks_event_reasons="
                    f"{sample.clocks_event_reasons:#x}, {sample.temperature_c} C)"
                )
    return throttled


class StragglerChoice(Frozen):
    """Restart the job without the straggler's node, or report the straggler and touch nothing."""

    restart: bool
    outcome: str = ""
    """The reported incident's outcome (when not restarting)."""


def straggler_choice(verdict: StragglerVerdict, action: StragglerAction, detection: DetectionPolicy) -> StragglerChoice:
    """Restart only when the job asks for it (``stragglers=restart``) and the projected loss repays a restart."""
    worst = max((r.slowdown for r in verdict.stragglers), default=1.0)
    if action is not StragglerAction.RESTART:
        return StragglerChoice(restart=False, outcome="reported (straggler action: report)")
    if restart_pays_off(worst, detection.straggler_horizon_s, detection.straggler_restart_cost_s):
        return StragglerChoice(restart=True)
    return StragglerChoice(restart=False, outcome=f"reported: a {worst:.2f}x slowdown does not repay a restart")
