"""Which way a failed job is brought back: requeued under its id, or resubmitted as a new job. Pure.

Two strategies sit behind one seam (ADR 014):

* **requeue** (ADR 009): the job keeps its id, Slurm restarts it; only possible for a requeueable job.
* **resubmit**: the job's own batch script and options, captured when Rebound began watching it, are submitted
  again as its owner, excluding the bad nodes; the new id joins the same logical job (one JobRecovery, one
  budget).

The job's ``restart`` setting (opt-in key ``restart=auto|requeue|resubmit``, or an operator selector's spec)
chooses; ``auto`` (the default) requeues what Slurm lets requeue and resubmits the rest.
"""

from __future__ import annotations

from enum import StrEnum

from workflows.domain.base import Frozen
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState, RestartSetting
from workflows.policy.recovery import Ending

__all__ = [
    "END_POLL_S",
    "END_WAIT_S",
    "RestartChoice",
    "RestartStrategy",
    "cannot_restart",
    "choose_restart",
    "in_lineage",
    "needs_submission",
    "resubmit_refused",
    "still_running",
]


class RestartStrategy(StrEnum):
    REQUEUE = "requeue"
    RESUBMIT = "resubmit"


class RestartChoice(Frozen):
    """The strategy, or None when the job cannot be restarted at all; ``reason`` says why, for the timeline."""

    strategy: RestartStrategy | None
    reason: str


def needs_submission(setting: RestartSetting, requeue_allowed: bool) -> bool:
    """Whether the job's submission must be captured when the watch begins (a resubmission may follow)."""
    return setting is RestartSetting.RESUBMIT or (setting is RestartSetting.AUTO and not requeue_allowed)


def choose_restart(setting: RestartSetting, *, requeue_allowed: bool, submission_captured: bool) -> RestartChoice:
    """The restart strategy for a job, from its setting, what Slurm allows, and what Rebound captured.

    Args:
        setting: The job's ``restart`` setting.
        requeue_allowed: Slurm lets the job be requeued (not ``--no-requeue``, ``JobRequeue`` not 0).
        submission_captured: The job's script and options were captured when its watch began.
    """
    if setting is RestartSetting.REQUEUE or (setting is RestartSetting.AUTO and requeue_allowed):
        # A job that refuses a requeue is told so by the requeue itself (an ending, as before resubmission).
        return RestartChoice(strategy=RestartStrategy.REQUEUE, reason=f"restart={setting.value}")
    if not submission_captured:
        return RestartChoice(
            strategy=None,
            reason=f"restart={setting.value} needs a resubmission, but the job's batch script and options were not "
            "captured when its watch began",
        )
    why = "the job cannot be requeued" if not requeue_allowed else "restart=resubmit"
    return RestartChoice(strategy=RestartStrategy.RESUBMIT, reason=why)


#: How long a job chosen for resubmission may take to end by itself (a crashed rank ends a ``--no-requeue`` job
#: within seconds, once srun and the batch script exit); one still running after this is not resubmitted.
END_WAIT_S = 180.0
END_POLL_S = 5.0


def cannot_restart(reason: str) -> Ending:
    """No strategy can bring the job back (``choose_restart`` said why)."""
    return Ending(state=RecoveryState.GAVE_UP, reason=f"the job cannot be restarted: {reason}", outcome="not restarted")


def resubmit_refused(kind: str, cause: str) -> Ending:
    """sbatch (or the capture's copy) refused the resubmission for good."""
    return Ending(
        state=RecoveryState.GAVE_UP,
        reason=f"the job could not be resubmitted ({kind}): {cause}",
        outcome=f"resubmission refused: {kind}",
    )


def still_running(job_id: int, waited_s: float) -> Ending:
    """The job to resubmit has not ended: a second copy beside it would run the same training twice."""
    return Ending(
        state=RecoveryState.GAVE_UP,
        reason=f"job {job_id} was still running {waited_s:.0f} s after its failure; Rebound resubmits only a job "
        "that has ended (cancel it to let Rebound resubmit it, or allow requeue)",
        outcome="not resubmitted: still running",
    )


def in_lineage(status: JobRecoveryStatus, job_id: int, token: str) -> bool:
    """Whether a JobRecovery's own record makes ``job_id`` (whose comment carries ``token``) part of its lineage.

    Rebound's record decides, never the comment: the JobRecovery lists the job, or reserved this very token
    (the job may be seen before the resubmission's answer is recorded: the token was reserved first).
    """
    return job_id in status.lineage or (bool(token) and token in status.resubmit_tokens)
