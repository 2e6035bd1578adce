"""JobRecovery: one durable workflow per monitored job (id ``rebound/{cluster}/job/{job_id}``).

This first slice watches the job through the scheduler port and answers ``status``; the detect -> attribute ->
isolate -> resume loop is built on this skeleton.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.slurm.activities import SlurmActivities
    from workflows.constants import JOB_ID, RECOVERY_STATE, RESTART_COUNT
    from workflows.domain.recovery import (
        JobRecoveryInput,
        JobRecoveryResult,
        JobRecoveryStatus,
        ObserveJobInput,
        RecoveryState,
        TimelineEntry,
        WatchJobInput,
    )
    from workflows.domain.slurm import JobState, SlurmJob
    from workflows.options import SCHEDULER_READ, SCHEDULER_WATCH


@workflow.defn(name="JobRecovery")
class JobRecoveryWorkflow:
    """Keeps one training job making progress."""

    @workflow.init
    def __init__(self, inp: JobRecoveryInput) -> None:
        self._inp = inp
        self._status = JobRecoveryStatus(cluster=inp.cluster, job_id=inp.job_id, state=RecoveryState.STARTING)

    @workflow.run
    async def run(self, inp: JobRecoveryInput) -> JobRecoveryResult:
        first = await workflow.execute_activity_method(
            SlurmActivities.observe_job,
            ObserveJobInput(job_id=inp.job_id),
            summary=f"Look up Slurm job {inp.job_id}",
            **SCHEDULER_READ,
        )
        if first.job is None:
            return self._end(RecoveryState.GAVE_UP, f"Slurm does not know job {inp.job_id}")
        self._observe(first.job)
        self._set_state(RecoveryState.WATCHING, f"watching job {inp.job_id} ({first.job.state.value})")

        job = first.job
        while not job.state.is_terminal():
            watched = await workflow.execute_activity_method(
                SlurmActivities.watch_job,
                WatchJobInput(
                    job_id=inp.job_id,
                    poll_interval_s=inp.poll_interval_s,
                    last_state=job.state,
                    last_restart_count=job.restart_count,
                ),
                summary=f"Watch job {inp.job_id} ({job.state.value}) for a change",
                **SCHEDULER_WATCH,
            )
            if watched.job is None:
                return self._end(RecoveryState.GAVE_UP, "the scheduler no longer lists the job")
            if watched.job.restart_count != job.restart_count:
                self._record(
                    "REQUEUED", f"restart {watched.job.restart_count} ({watched.job.state_reason or 'by Slurm'})"
                )
            job = watched.job
            self._observe(job)
        if job.state is JobState.COMPLETED:
            return self._end(RecoveryState.FINISHED, "the job completed")
        if job.state is JobState.CANCELLED:
            return self._end(RecoveryState.FINISHED, "the job was cancelled by its owner")
        self._set_state(RecoveryState.DETECTED, f"job ended {job.state.value} (exit {job.exit_code})")
        return self._end(RecoveryState.GAVE_UP, f"job ended {job.state.value}; no recovery action is enabled")

    @workflow.query(description="Where the job is in the recovery loop, with its incident timeline.")
    def status(self) -> JobRecoveryStatus:
        return self._status

    # ----- helpers: record, never decide -------------------------------------------------------------------
    def _observe(self, job: SlurmJob) -> None:
        self._status = self._status.model_copy(
            update={
                "job_state": job.state,
                "job_name": job.name,
                "nodes": job.nodes,
                "restart_count": job.restart_count,
                "last_observed_at": workflow.now(),
            }
        )
        workflow.upsert_search_attributes(
            [JOB_ID.value_set(str(job.job_id)), RESTART_COUNT.value_set(job.restart_count)]
        )

    def _record(self, event: str, detail: str) -> None:
        entry = TimelineEntry(at=workflow.now(), event=event, detail=detail)
        self._status = self._status.model_copy(update={"note": detail, "timeline": (*self._status.timeline, entry)})
        workflow.set_current_details(self._details_markdown())

    def _set_state(self, state: RecoveryState, detail: str) -> None:
        self._status = self._status.model_copy(update={"state": state})
        workflow.upsert_search_attributes([RECOVERY_STATE.value_set(state.value)])
        self._record(state.value, detail)

    def _end(self, state: RecoveryState, reason: str) -> JobRecoveryResult:
        self._set_state(state, reason)
        return JobRecoveryResult(job_id=self._inp.job_id, state=state, reason=reason)

    def _details_markdown(self) -> str:
        st = self._status
        rows = "\n".join(f"| {e.at:%H:%M:%S} | {e.event} | {e.detail} |" for e in st.timeline)
        return (
            f"## Job {st.job_id} ({st.job_name or 'unnamed'}): **{st.state.value}**\n\n"
            f"- Slurm state: {st.job_state.value if st.job_state else 'unknown'}\n"
            f"- nodes: {', '.join(st.nodes) or '-'}; restarts: {st.restart_count}\n\n"
            f"| time (UTC) | event | detail |\n|---|---|---|\n{rows}\n"
        )
