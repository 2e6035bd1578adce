"""The owner's pause, read from the job's comment before Rebound acts (``workflows.policy.owner_steering``)."""

from __future__ import annotations

from typing import NamedTuple

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import workflows.job_recovery.ledger as ledger
    import workflows.job_recovery.scheduler as scheduler
    import workflows.job_recovery.state as state
    from workflows.domain.recovery import JobRecoveryResult, RecoveryState
    from workflows.job_recovery.recorder import Recorder
    from workflows.policy.owner_steering import owner_pause
    from workflows.policy.recovery import Ending

__all__ = ["PATCH", "Paused", "paused_by_owner"]

#: Every action for a job is preceded by a fresh read of its comment (issue 13); histories from before acted.
PATCH = "13-owner-pause-in-comment"


class Paused(NamedTuple):
    """The owner paused Rebound: how the workflow goes on (``result`` None: back to watching)."""

    result: JobRecoveryResult | None


async def paused_by_owner(rec: Recorder, number: int) -> Paused | None:
    """None when Rebound may act for the job; otherwise the incident is closed as not acted on, and the workflow
    ends (the job is over) or watches again (it still runs)."""
    fresh = await scheduler.observe_job(rec.inp.job_id)
    why = owner_pause(fresh) if fresh is not None else None
    if fresh is None or why is None:
        return None  # a job the scheduler forgot: the usual path says so
    rec.record("OWNER_PAUSED", why, number)
    rec.set_status(ledger.set_outcome(rec.status, number, f"not acted on: {why}"))
    if fresh.state.is_terminal():
        return Paused(rec.end(Ending(state=RecoveryState.FINISHED, reason=f"the job ended; {why}: not restarted")))
    rec.state = state.restart_hang_clock(rec.state, workflow.now())
    rec.set_state(RecoveryState.WATCHING, f"nothing done: {why}", number)
    return Paused(None)
