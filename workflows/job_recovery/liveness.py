"""Progress without step lines: JobRecovery samples a running job that has shown no step line (nor heartbeat).

When the watch returns ``SAMPLE`` (``JobWatchInput.sample_after_s``), the workflow asks every node's agent for
the job's rank processes and stacks (the hang evidence activities) and the scanner for its checkpoints, folds
them into ``JobRecoveryState.liveness`` (``workflows.policy.stacks.note_liveness``) and judges them
(``workflows.policy.hang.assess_silent_hang``): a hang is an anomaly like any other, its verdict saying which
window applied (the job's ``hang=``, its checkpoint cadence, or the operator's default) and why. Behind
``workflow.patched(PATCH_LIVENESS)``: the watch's early return and these activities are new commands.
"""

from __future__ import annotations

import asyncio
import contextlib

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import workflows.job_recovery.checkpoints as checkpoints
    import workflows.job_recovery.evidence as evidence
    import workflows.job_recovery.scheduler as scheduler
    from workflows.domain.anomaly import build_anomaly
    from workflows.domain.incident import Anomaly, AnomalyKind
    from workflows.domain.liveness import LivenessState, StackMotion
    from workflows.domain.loop import ResumeOutcome, WaitResumeInput, WaitResumeResult
    from workflows.domain.progress import ProgressSignal
    from workflows.domain.slurm import SlurmJob
    from workflows.job_recovery.evidence import MAX_STACKS
    from workflows.job_recovery.recorder import Recorder
    from workflows.policy.hang import assess_silent_hang, silent_sample_interval
    from workflows.policy.recovery import hang_policy
    from workflows.policy.stacks import note_liveness, stack_motion

__all__ = [
    "PATCH_ANCHOR_AFTER_STACKS",
    "PATCH_LIVENESS",
    "PATCH_VERIFY_STACKS",
    "interval",
    "sample",
    "wait_resume_or_stacks",
]

PATCH_LIVENESS = "liveness-sampling"
#: The resume check runs as a handle while the workflow samples the restarted ranks' stacks.
PATCH_VERIFY_STACKS = "verify-stacks"
#: A resume seen by stacks anchors the log offsets to the new attempt (``job_log_anchor``) before the watch resumes.
PATCH_ANCHOR_AFTER_STACKS = "11-anchor-logs-after-stacks-resume"


def interval(rec: Recorder, state: LivenessState | None) -> tuple[float, str]:
    """How often to sample this job (``workflows.policy.hang.silent_sample_interval``): a fraction of its hang
    window, so a silent job's hang is seen within about that window, bounded by the operator's settings."""
    detection = rec.inp.detection
    return silent_sample_interval(
        hang_policy(detection, rec.inp.spec),
        state.checkpoint_times if state is not None else (),
        least_s=detection.silent_sample_min_s,
        most_s=detection.silent_sample_s,
    )


async def sample(rec: Recorder, job: SlurmJob) -> Anomaly | None:
    """One liveness sample of ``job``; the hang anomaly when the samples say it is hung, else None."""
    nodes = job.nodes or rec.status.nodes
    found = await evidence.hang_evidence(rec.inp.job_id, nodes, rec.inp.detection.stack_dump_timeout_s)
    saved = None
    if rec.inp.spec.checkpoint_dir:
        report = await checkpoints.scan(rec.inp.spec.checkpoint_dir, job)
        latest = report.latest_valid if report is not None and not report.error else None
        saved = (latest.path, latest.saved_at) if latest is not None else None
    state = rec.state.liveness
    if state is None or state.restart_count != job.restart_count:
        # A new attempt's ranks are sampled afresh; the job's checkpoint cadence (its hang window) carries over.
        kept = state.checkpoint_times if state is not None else ()
        state = LivenessState(restart_count=job.restart_count, checkpoint_times=kept)
    now = workflow.now()
    state = note_liveness(state, now, found.stacks, found.processes, saved)
    policy = hang_policy(rec.inp.detection, rec.inp.spec)
    verdict = assess_silent_hang(state, now, policy, expected_ranks=min(job.task_count, MAX_STACKS))
    if verdict.window_detail != state.window_note:
        state = state.model_copy(update={"window_note": verdict.window_detail})
        _, sampled = interval(rec, state)
        rec.record(
            "LIVENESS",
            f"no step lines: hang window {verdict.window_s:.0f} s, {verdict.window_detail}; sampled {sampled}",
        )
    rec.update(liveness=state)
    if not verdict.hung:
        return None
    rec.update(hang=verdict)
    return build_anomaly(AnomalyKind.HANG, now, job=job, verdict=verdict)


async def wait_resume_or_stacks(rec: Recorder, wait: WaitResumeInput) -> WaitResumeResult:
    """The resume check, while every ``detection.silent_sample_s`` the restarted ranks' stacks are sampled: stacks
    that move between two samples mean the job trains again (``ProgressSignal.STACKS``), for a job that prints no
    step line and saves rarely. A job with step lines answers long before the first sample."""
    handle = scheduler.start_wait_resume(wait, task_queue=scheduler.resume_queue(rec.inp))
    state = LivenessState(restart_count=wait.expected_restart_count)
    # Every silent_sample_s, not at the hang sampling's pace: a resume seen by stacks cancels the resume check,
    # whose offsets are lost with it (below), so lines the old attempt's steps wrote late (slurmstepd's "CANCELLED
    # ... DUE TO NODE FAILURE") were read again as the new attempt's (seen on the lab at a 15 s pace).
    every = rec.inp.detection.silent_sample_s
    while True:
        with contextlib.suppress(asyncio.TimeoutError):
            await workflow.wait_condition(handle.done, timeout=every, timeout_summary="sample the restarted ranks")
        if handle.done():
            return await handle
        # Where the restarted attempt runs now (the requeue placed it elsewhere); not running: nothing to sample.
        job = await scheduler.observe_job(rec.inp.job_id)
        if job is None or not job.nodes:
            continue
        found = await evidence.hang_evidence(rec.inp.job_id, job.nodes, rec.inp.detection.stack_dump_timeout_s)
        state = note_liveness(state, workflow.now(), found.stacks, found.processes)
        motion, _ = stack_motion(state)
        if motion is StackMotion.ADVANCING and not handle.done():
            handle.cancel()
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await handle
            # The cancelled check hands back no offsets, and the watch would start where it began: before what
            # the old attempt wrote while it was torn down (torch elastic's SIGTERM traceback, srun's "Exited
            # with exit code 1"), read again as the running job's crash. The new attempt's files as they end now
            # (a file it began: from its start) are where its watch starts.
            offsets = wait.offsets
            if workflow.patched(PATCH_ANCHOR_AFTER_STACKS):
                anchored = await scheduler.anchor_logs(rec.inp, job)
                offsets = anchored if anchored is not None else offsets
            return WaitResumeResult(
                outcome=ResumeOutcome.RESUMED,
                observed_at=workflow.now(),
                offsets=offsets,
                job=job,
                signal=ProgressSignal.STACKS,
                signs_of_life=(ProgressSignal.STACKS,),
            )
