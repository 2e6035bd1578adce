"""JobRecovery and the job's checkpoints: recorded before every restart, a partial newest save set aside when the
policy asks (``ckpt_fallback=quarantine``), the resume judged against them afterwards.

The decisions are ``workflows.policy.resume_point``; here the activities (``activities.checkpoints``:
``checkpoint_scan``, ``checkpoint_quarantine``, on the central worker) are started and the results recorded. A scan or
quarantine that fails is noted and the recovery goes on: a failed lookup is never read as "no checkpoint". These
calls add commands, so the workflow makes them only behind ``workflow.patched`` (ids in ``PATCH_*``).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import workflows.job_recovery.ledger as ledger
    from activities.checkpoints.activities import CheckpointActivities
    from workflows.constants import isolation_request_id
    from workflows.domain.checkpoints import (
        CheckpointQuarantineInput,
        CheckpointReport,
        CheckpointScanInput,
        QuarantineAction,
    )
    from workflows.domain.incident import ActionKind, ActionRecord, Attribution, FailureClass, LogFinding
    from workflows.domain.loop import WaitResumeResult
    from workflows.domain.notify import NotificationKind, Severity
    from workflows.domain.resume_point import ResumePoint
    from workflows.domain.slurm import SlurmJob
    from workflows.job_recovery.recorder import Recorder
    from workflows.options import CHECKPOINT_IO
    from workflows.policy.optin import checkpoint_fallback
    from workflows.policy.resume_point import (
        corrupt_checkpoint_retry,
        from_scratch_anomaly,
        judge_resume_point,
        last_seen_step,
        restart_checkpoint,
        should_quarantine,
    )

__all__ = [
    "PATCH_RECORD",
    "PATCH_VERIFY",
    "judge_resume",
    "quarantine",
    "record_before_restart",
    "scan",
]

#: ``workflow.patched`` ids: the scan (and quarantine) before a restart; the resume judged against the checkpoint.
PATCH_RECORD = "ckpt-record-before-restart"
PATCH_VERIFY = "verify-resume-point"


async def record_before_restart(
    rec: Recorder, number: int, job: SlurmJob, attribution: Attribution, findings: tuple[LogFinding, ...]
) -> Attribution:
    """Scan the job's ``ckpt=`` directory, record what the restart will find, and return the attribution (a
    corrupt checkpoint's load failure with an older valid one there is retryable: ``corrupt_checkpoint_retry``)."""
    directory = rec.inp.spec.checkpoint_dir
    if not directory:
        return attribution
    report = await scan(directory, job)
    found = restart_checkpoint(
        report, directory=directory, last_step=last_seen_step(rec.state.progress), now=workflow.now()
    )
    rec.set_status(ledger.set_checkpoint(rec.status, number, found))
    rec.record("CHECKPOINT", found.summary, number)
    earlier = [i for i in rec.status.incidents if i.number != number]
    return corrupt_checkpoint_retry(attribution, findings, found, checkpoint_fallback(rec.inp.spec), earlier)


async def quarantine(rec: Recorder, number: int, job: SlurmJob) -> None:
    """With ``ckpt_fallback=quarantine``: set the partial newest save aside before the restart (once per incident:
    the action is recorded with its key first, and the activity is idempotent)."""
    found = rec.incident(number).checkpoint
    if found is None or found.partial_newest is None or not should_quarantine(checkpoint_fallback(rec.inp.spec), found):
        return
    key = f"{isolation_request_id(workflow.info().workflow_id, number)}/quarantine"
    target = found.partial_newest.path
    decided = ActionRecord(key=key, kind=ActionKind.QUARANTINE, target=target, decided_at=workflow.now())
    if not any(a.key == key for a in rec.incident(number).actions):
        rec.set_status(ledger.add_action(rec.status, number, decided))
        rec.record("QUARANTINE", f"decided (key {key}): set {target} aside", number)
    try:
        done = await workflow.execute_activity_method(
            CheckpointActivities.checkpoint_quarantine,
            CheckpointQuarantineInput(dir=found.dir, expected_owner_uid=job.user_id),
            summary=f"Set the partial checkpoint {target} aside",
            **CHECKPOINT_IO,
        )
    except ActivityError as e:
        why = e.cause or e
        rec.record("QUARANTINE", f"failed: {why}; the restart goes on, the framework may load {target}", number)
        return
    moved = done.action is QuarantineAction.QUARANTINED
    result = f"{done.action.value}: {', '.join(done.set_aside) or '-'} ({done.reason})"
    verified = decided.model_copy(update={"verified_at": workflow.now() if moved else None, "result": result})
    rec.set_status(ledger.replace_action(rec.status, number, verified))
    if moved:
        rec.set_status(
            ledger.set_checkpoint(rec.status, number, found.model_copy(update={"quarantined": done.set_aside}))
        )
    rec.record("QUARANTINE", f"{target}: {result}", number)


async def judge_resume(rec: Recorder, number: int, resumed: WaitResumeResult) -> None:
    """Where the restarted job started, against the recorded checkpoint; from scratch with a valid checkpoint there
    is an incident of its own (reported, nothing restarted: a restart would start from scratch again)."""
    found = rec.incident(number).checkpoint
    if found is None:
        return
    point, note = judge_resume_point(found, resumed)
    rec.set_status(ledger.set_checkpoint(rec.status, number, found, point))
    rec.record("RESUME_POINT", f"{point.value}: {note}", number)
    if point is not ResumePoint.FROM_SCRATCH:
        return
    anomaly = from_scratch_anomaly(found, note, resumed.observed_at)
    attribution = Attribution(
        failure_class=FailureClass.UNKNOWN,
        cause="restarted-from-scratch",
        retryable=False,
        confidence=0.9,
        explanation=f"{note}; check the job's resume path (ckpt_path, resume_from_checkpoint, --load)",
    )
    status, opened = ledger.open_incident(
        rec.status, anomaly=anomaly, attribution=attribution, outcome="restarted from scratch"
    )
    rec.set_status(ledger.set_checkpoint(status, opened, found, point))
    rec.record("FROM_SCRATCH", anomaly.summary, opened)
    await rec.tell(
        NotificationKind.INCIDENT,
        f"Job {rec.inp.job_id} restarted from scratch",
        anomaly.summary,
        Severity.WARNING,
    )


async def scan(directory: str, job: SlurmJob) -> CheckpointReport | None:
    """The scanner's report; None when it did not answer (recorded as unknown, never as "no checkpoint"). The job's
    uid goes with it: the worker's access policy scans only the job user's own directory."""
    try:
        report: CheckpointReport = await workflow.execute_activity_method(
            CheckpointActivities.checkpoint_scan,
            CheckpointScanInput(dir=directory, expected_owner_uid=job.user_id),
            summary=f"Check the checkpoints of job {job.job_id} in {directory}",
            **CHECKPOINT_IO,
        )
    except ActivityError:
        return None
    return report
