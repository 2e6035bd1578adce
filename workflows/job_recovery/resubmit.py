"""JobRecovery's second restart strategy (ADR 014): capture how the job was submitted, submit it again.

``capture`` runs when the watch begins, for a job that may need it (``restart_strategy.needs_submission``).
``resubmit`` is ``steps.restart``'s other branch: it reserves the restart and an idempotency token in workflow
state *before* the activity is scheduled (the same workflow task), so a worker killed anywhere after that
leaves a token the retried activity finds on the one job it submitted; then the workflow follows the new id
(``Recorder.follow``). Both ship behind ``workflow.patched`` (ADR 012).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    import workflows.job_recovery.ledger as ledger
    import workflows.job_recovery.scheduler as scheduler
    import workflows.job_recovery.state as state
    from workflows.constants import isolation_request_id
    from workflows.domain.incident import ActionKind, ActionRecord
    from workflows.domain.recovery import MAX_RESUBMIT_TOKENS, RecoveryState
    from workflows.domain.slurm import JobState, SlurmJob
    from workflows.domain.submission import ResubmitInput, SubmissionFacts
    from workflows.job_recovery.recorder import Recorder
    from workflows.policy.recovery import Ending, cancelled_by_owner
    from workflows.policy.restart_strategy import (
        END_POLL_S,
        END_WAIT_S,
        needs_submission,
        resubmit_refused,
        still_running,
    )

__all__ = ["CAPTURE_PATCH", "RESUBMIT_PATCH", "capture", "resubmit"]

#: Patch ids (ADR 012): histories recorded before resubmission existed replay without these commands.
CAPTURE_PATCH = "resubmit-capture-submission"
RESUBMIT_PATCH = "resubmit-no-requeue"


async def capture(rec: Recorder, job: SlurmJob) -> None:
    """Capture the job's submission (script, options) when a resubmission may follow and none is kept yet."""
    if rec.state.submission is not None or not needs_submission(rec.inp.spec.restart, job.requeue_allowed):
        return
    if not workflow.patched(CAPTURE_PATCH):
        return
    try:
        result = await scheduler.capture_submission(rec.inp.cluster, rec.inp.job_id)
    except ActivityError as e:
        rec.record("CAPTURE", f"submission not captured ({e.cause or e}): the job cannot be resubmitted")
        return
    if result.facts is None:
        rec.record("CAPTURE", f"submission not captured ({result.note}): the job cannot be resubmitted")
        return
    rec.update(submission=result.facts)
    rec.record("CAPTURE", _describe(result.facts))


async def resubmit(rec: Recorder, number: int, job: SlurmJob, exclude: tuple[str, ...]) -> Ending | None:
    """Wait for the failed job to end, reserve (restart, token), resubmit, follow the new job; or an ending."""
    facts = rec.state.submission
    assert facts is not None, "choose_restart picks RESUBMIT only with a captured submission"
    ended = await _wait_for_end(rec, job)
    if ended is not None:
        return ended
    key = f"{isolation_request_id(workflow.info().workflow_id, number)}/resubmit"
    root = (rec.status.lineage or (rec.inp.job_id,))[0]
    # Deterministic (seeded by the run): a replayed or re-executed workflow task reserves the same token.
    token = f"{root}.{number}.{workflow.uuid4().hex[:16]}"
    now = workflow.now()
    decided = ActionRecord(key=key, kind=ActionKind.RESUBMIT, target=str(rec.inp.job_id), decided_at=now)
    rec.set_status(ledger.add_action(rec.status, number, decided))
    # Reserved before acting, in the task that schedules the activity: the budget is spent once, the token kept.
    rec.update_status(
        restarts_used=rec.status.restarts_used + 1,
        resubmit_tokens=(*rec.status.resubmit_tokens, token)[-MAX_RESUBMIT_TOKENS:],
    )
    rec.record("RESUBMIT", f"decided (key {key}, token {token}), restart {rec.status.restarts_used}", number)
    try:
        done = await scheduler.resubmit(
            ResubmitInput(facts=facts, exclude=exclude, token=token, reserved_at=now, key=key)
        )
    except ActivityError as e:
        cause = e.cause
        kind = cause.type if isinstance(cause, ApplicationError) else type(cause).__name__
        return resubmit_refused(str(kind), str(cause))
    previous = rec.inp.job_id
    rec.follow(done.job_id)
    adopted = " (adopted: an earlier attempt had submitted it)" if done.adopted else ""
    verified = decided.model_copy(
        update={
            "verified_at": done.verified_at,
            "result": f"job {done.job_id} {done.state.value}{adopted} excluded {','.join(done.excluded_nodes)} "
            f"token {token}",
        }
    )
    # Resolved: the job is in the lineage now; a copy of the token in another job's comment claims nothing.
    rec.update_status(job_state=done.state, resubmit_tokens=tuple(t for t in rec.status.resubmit_tokens if t != token))
    rec.record("RESUBMITTED", f"job {previous} -> job {done.job_id}{adopted}; {facts.environment_note}", number)
    rec.set_status(ledger.mark_restarted(ledger.replace_action(rec.status, number, verified), number, done.verified_at))
    rec.state = state.new_attempt(rec.state, workflow.now())
    return None


async def _wait_for_end(rec: Recorder, job: SlurmJob) -> Ending | None:
    """The failed job must have ended before a copy is submitted; a crashed rank ends it within seconds."""
    waited = 0.0
    current: SlurmJob | None = job
    if not job.state.is_terminal():
        rec.set_state(RecoveryState.RESTARTING, f"waiting for job {job.job_id} ({job.state.value}) to end")
    while current is not None and not current.state.is_terminal():
        if waited >= END_WAIT_S:
            return still_running(rec.inp.job_id, waited)
        await workflow.sleep(END_POLL_S, summary=f"wait for job {job.job_id} to end before resubmitting it")
        waited += END_POLL_S
        current = await scheduler.observe_job(job.job_id)
    if current is not None and current.state is JobState.CANCELLED:
        return cancelled_by_owner(during_recovery=True)  # never bring back what a person stopped
    return None


def _describe(facts: SubmissionFacts) -> str:
    o = facts.options
    shape = f"{o.nodes or '?'} node(s), {o.ntasks or '?'} task(s)" + (f", gres {o.gres}" if o.gres else "")
    return (
        f"submission captured for a resubmission: {facts.script_bytes} byte script, {shape}, uid {facts.user_id}, "
        f"in {facts.working_directory}; environment {facts.environment_note}"
    )
