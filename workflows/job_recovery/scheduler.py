"""JobRecovery's calls about the job itself: look it up, watch it, requeue it, wait for it to train again.

Each starts one activity (the scheduler adapter and the log watch do the I/O); the workflow records the results.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.logs.watch import WatchActivities
    from activities.slurm.actions import SlurmActionActivities
    from activities.slurm.activities import SlurmActivities
    from activities.slurm.resubmission import SubmissionActivities
    from workflows.domain.checkpoints import CheckpointRef
    from workflows.domain.errors import FailureKind
    from workflows.domain.loop import (
        JobWatchInput,
        JobWatchResult,
        LogAnchorInput,
        RequeueInput,
        RequeueResult,
        WaitResumeInput,
        WaitResumeResult,
    )
    from workflows.domain.recovery import JobRecoveryInput, JobRecoveryState, ObserveJobInput, ObserveJobResult
    from workflows.domain.slurm import SlurmJob
    from workflows.domain.submission import (
        CaptureSubmissionInput,
        CaptureSubmissionResult,
        ResubmitInput,
        ResubmitOutcome,
    )
    from workflows.options import CLUSTER_ACTION, JOB_WATCH, LOG_ANCHOR, SCHEDULER_READ, WAIT_RESUME
    from workflows.policy.recovery import hang_policy

__all__ = [
    "anchor_logs",
    "capture_submission",
    "observe_job",
    "requeue",
    "resubmit",
    "resume_queue",
    "start_wait_resume",
    "start_watch",
    "wait_resume",
    "wait_resume_input",
    "watch_input",
]


#: A lookup the scheduler refused for Rebound's credentials (SCHEDULER_AUTH) waits for an operator's fix instead of
#: failing the JobRecovery (ClusterWatch alerts them): AUTH_WAITS waits of AUTH_WAIT, then it fails as before.
#: Histories from before never took that branch.
SCHEDULER_AUTH_WAIT_PATCH = "13-observe-waits-out-scheduler-auth"
AUTH_WAIT = timedelta(minutes=1)
AUTH_WAITS = 30


async def observe_job(job_id: int, note: Callable[[str], None] | None = None) -> SlurmJob | None:
    """The scheduler's current word on the job; None when it does not list it.

    Args:
        job_id: The job.
        note: Told each time the scheduler refused Rebound's credentials and the lookup waits (the timeline).

    Raises:
        ActivityError: The lookup failed (after ``AUTH_WAITS`` waits, for refused credentials).
    """
    waits = 0
    while True:
        try:
            first: ObserveJobResult = await workflow.execute_activity_method(
                SlurmActivities.observe_job,
                ObserveJobInput(job_id=job_id),
                summary=f"Look up Slurm job {job_id}",
                **SCHEDULER_READ,
            )
        except ActivityError as e:
            cause = e.cause
            refused = isinstance(cause, ApplicationError) and cause.type == FailureKind.SCHEDULER_AUTH.value
            if not refused or waits >= AUTH_WAITS or not workflow.patched(SCHEDULER_AUTH_WAIT_PATCH):
                raise
            waits += 1
            detail = (
                f"the scheduler refused Rebound's credentials looking up job {job_id}: {cause}; nothing is read "
                f"as the job's state, waiting {AUTH_WAIT.total_seconds():.0f} s for the fix ({waits}/{AUTH_WAITS})"
            )
            workflow.logger.error(detail)
            if note is not None:
                note(detail)
            await workflow.sleep(AUTH_WAIT, summary="wait for the scheduler's credentials to be fixed")
            continue
        return first.job


async def anchor_logs(inp: JobRecoveryInput, job: SlurmJob) -> dict[str, int] | None:
    """The job's log offsets anchored to its current attempt (``WatchActivities.anchor``); None when the files
    could not be looked at (the watch then anchors them itself, as before)."""
    try:
        offsets: dict[str, int] = await workflow.execute_activity_method(
            WatchActivities.anchor,
            LogAnchorInput(job_id=inp.job_id, log_patterns=inp.spec.logs, job=job),
            summary=f"Note where job {inp.job_id}'s log files end now",
            **LOG_ANCHOR,
        )
    except ActivityError:
        return None
    return offsets


def watch_input(inp: JobRecoveryInput, state: JobRecoveryState, job: SlurmJob) -> JobWatchInput:
    """What the watch needs to pick up where the last one stopped: log offsets, progress, what was reported."""
    return JobWatchInput(
        job_id=inp.job_id,
        log_patterns=inp.spec.logs,
        offsets=state.status.log_offsets,
        poll_interval_s=inp.poll_interval_s,
        last_state=job.state,
        last_restart_count=job.restart_count,
        heartbeat_patterns=inp.spec.heartbeat,
        progress=state.progress,
        hang=hang_policy(inp.detection, inp.spec),
        stragglers=inp.detection.stragglers,
        straggler_action=inp.spec.stragglers,
        reported_straggler_nodes=state.reported_stragglers,
    )


def start_watch(watch: JobWatchInput, job: SlurmJob) -> workflow.ActivityHandle[JobWatchResult]:
    """The heartbeating watch (scheduler, rank logs, progress) until a change or an anomaly; cancellable."""
    return workflow.start_activity_method(
        WatchActivities.watch,
        watch,
        summary=f"Watch job {watch.job_id} ({job.state.value}): scheduler, rank logs, progress",
        **JOB_WATCH,
    )


async def requeue(
    job_id: int,
    *,
    exclude: tuple[str, ...],
    expected_restarts: int,
    previous_nodes: tuple[str, ...],
    key: str,
    user_excluded: tuple[str, ...] | None,
) -> RequeueResult:
    """Requeue the job without ``exclude`` and its owner's ``user_excluded`` (idempotent by ``key`` and the
    restart count it expects)."""
    return await workflow.execute_activity_method(
        SlurmActionActivities.requeue_job,
        RequeueInput(
            job_id=job_id,
            exclude=exclude,
            expected_restart_count=expected_restarts,
            previous_nodes=previous_nodes,
            key=key,
            user_excluded=user_excluded,
        ),
        summary=f"Requeue job {job_id} excluding {','.join(exclude) or 'nobody'}",
        **CLUSTER_ACTION,
    )


async def capture_submission(cluster: str, job_id: int) -> CaptureSubmissionResult:
    """The job's options and batch script, kept on the worker for a resubmission (ADR 014)."""
    return await workflow.execute_activity_method(
        SubmissionActivities.capture_submission,
        CaptureSubmissionInput(cluster=cluster, job_id=job_id),
        summary=f"Capture how job {job_id} was submitted (script, options)",
        **SCHEDULER_READ,
    )


async def resubmit(inp: ResubmitInput) -> ResubmitOutcome:
    """Submit the job again as its owner (idempotent by ``inp.token``: a retry adopts what an attempt submitted)."""
    return await workflow.execute_activity_method(
        SubmissionActivities.resubmit_job,
        inp,
        summary=f"Resubmit job {inp.facts.job_id} as uid {inp.facts.user_id} excluding {','.join(inp.exclude) or '-'}",
        **CLUSTER_ACTION,
    )


def wait_resume_input(
    inp: JobRecoveryInput,
    *,
    offsets: dict[str, int],
    expected_restarts: int,
    not_before: datetime | None,
    restart_checkpoint: CheckpointRef | None = None,
) -> WaitResumeInput:
    """What the resume check needs: where the logs were, the restart it verifies, the job's checkpoints."""
    return WaitResumeInput(
        job_id=inp.job_id,
        log_patterns=inp.spec.logs,
        offsets=offsets,
        expected_restart_count=expected_restarts,
        not_before=not_before,
        heartbeat_patterns=inp.spec.heartbeat,
        checkpoint_dir=inp.spec.checkpoint_dir,
        restart_checkpoint=restart_checkpoint,
    )


async def wait_resume(wait: WaitResumeInput, *, task_queue: str | None = None) -> WaitResumeResult:
    """Wait for the restarted job to train again: a step line, or a complete checkpoint newer than
    ``restart_checkpoint`` (or to fail again, be cancelled, vanish)."""
    return await start_wait_resume(wait, task_queue=task_queue)


def resume_queue(inp: JobRecoveryInput) -> str | None:
    """The resume checks' own task queue (ADR 015), for a job watched by the hub; None: the workflow's queue
    (runs started before it, whose recorded histories scheduled the check there)."""
    routing = inp.watch_hub
    return routing.resume_task_queue or None if routing is not None else None


def start_wait_resume(
    wait: WaitResumeInput, *, task_queue: str | None = None
) -> workflow.ActivityHandle[WaitResumeResult]:
    """The resume check as a handle: the workflow may sample the ranks meanwhile, and cancel it."""
    return workflow.start_activity_method(
        WatchActivities.wait_resume,
        wait,
        task_queue=task_queue,
        summary=f"Wait for job {wait.job_id} to train again",
        **WAIT_RESUME,
    )
