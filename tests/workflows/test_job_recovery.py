"""JobRecovery against a real (in-memory) Temporal dev server, with the FakeScheduler behind the real activities."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from activities.slurm.activities import SlurmActivities
from tests.fakes.scheduler import FakeScheduler
from workflows.constants import JOB_ID, RECOVERY_STATE
from workflows.domain.errors import FailureKind
from workflows.domain.recovery import JobRecoveryInput, JobRecoveryResult, RecoveryState
from workflows.domain.slurm import JobState
from workflows.job_recovery import JobRecoveryWorkflow


def _worker(client: Client, task_queue: str, scheduler: FakeScheduler) -> Worker:
    acts = SlurmActivities(scheduler)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[JobRecoveryWorkflow],
        activities=[acts.observe_job, acts.watch_job],
    )


async def _start(
    client: Client, task_queue: str, job_id: int
) -> WorkflowHandle[JobRecoveryWorkflow, JobRecoveryResult]:
    return await client.start_workflow(
        JobRecoveryWorkflow.run,
        JobRecoveryInput(cluster="test", job_id=job_id, poll_interval_s=0.1),
        id=f"rebound/test/job/{job_id}/{uuid.uuid4().hex}",
        task_queue=task_queue,
    )


async def _until_state(handle: WorkflowHandle[JobRecoveryWorkflow, JobRecoveryResult], state: RecoveryState) -> None:
    for _ in range(100):
        if (await handle.query(JobRecoveryWorkflow.status)).state is state:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never reached {state}")


async def test_watches_a_running_job_and_answers_status(temporal_client: Client, task_queue: str) -> None:
    sched = FakeScheduler()
    job = sched.submit(2, name="llm")
    async with _worker(temporal_client, task_queue, sched):
        handle = await _start(temporal_client, task_queue, job.job_id)
        await _until_state(handle, RecoveryState.WATCHING)
        st = await handle.query(JobRecoveryWorkflow.status)
        assert st.job_state is JobState.RUNNING
        assert st.job_name == "llm"
        assert len(st.nodes) == 2
        assert [e.event for e in st.timeline] == ["WATCHING"]

        sched.finish_job(job.job_id)
        result = await asyncio.wait_for(handle.result(), timeout=20)
    assert result.state is RecoveryState.FINISHED
    desc = await handle.describe()
    assert desc.typed_search_attributes.get(RECOVERY_STATE) == "FINISHED"
    assert desc.typed_search_attributes.get(JOB_ID) == str(job.job_id)


async def test_failed_job_is_detected(temporal_client: Client, task_queue: str) -> None:
    sched = FakeScheduler()
    job = sched.submit(2)
    async with _worker(temporal_client, task_queue, sched):
        handle = await _start(temporal_client, task_queue, job.job_id)
        await _until_state(handle, RecoveryState.WATCHING)
        sched.fail_job(job.job_id, exit_code=13)
        result = await asyncio.wait_for(handle.result(), timeout=20)
        st = await handle.query(JobRecoveryWorkflow.status)
    assert result.state is RecoveryState.GAVE_UP
    assert "FAILED" in result.reason
    assert [e.event for e in st.timeline] == ["WATCHING", "DETECTED", "GAVE_UP"]
    assert st.job_state is JobState.FAILED


async def test_unknown_job_gives_up_at_once(temporal_client: Client, task_queue: str) -> None:
    async with _worker(temporal_client, task_queue, FakeScheduler()):
        handle = await _start(temporal_client, task_queue, 4242)
        result = await asyncio.wait_for(handle.result(), timeout=20)
    assert result.state is RecoveryState.GAVE_UP
    assert "4242" in result.reason


async def test_scheduler_outage_is_ridden_out(temporal_client: Client, task_queue: str) -> None:
    """A transient scheduler failure is retried by Temporal; the watch still ends on the job's real end."""
    sched = FakeScheduler()
    job = sched.submit(1)
    sched.fail_next("get_job", FailureKind.SCHEDULER_UNREACHABLE, times=2)
    async with _worker(temporal_client, task_queue, sched):
        handle = await _start(temporal_client, task_queue, job.job_id)
        await _until_state(handle, RecoveryState.WATCHING)
        sched.finish_job(job.job_id)
        result = await asyncio.wait_for(handle.result(), timeout=30)
    assert result.state is RecoveryState.FINISHED
    assert sum(c.method == "get_job" for c in sched.calls) >= 3  # two injected failures, then real reads


async def test_permanent_scheduler_error_is_not_retried(temporal_client: Client, task_queue: str) -> None:
    sched = FakeScheduler()
    job = sched.submit(1)
    sched.fail_next("get_job", FailureKind.SCHEDULER_BAD_RESPONSE, times=5)
    async with _worker(temporal_client, task_queue, sched):
        handle = await _start(temporal_client, task_queue, job.job_id)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), timeout=20)
    cause = failure.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
    assert cause.cause.type == "SCHEDULER_BAD_RESPONSE"
    assert sum(c.method == "get_job" for c in sched.calls) == 1  # non-retryable: exactly one attempt


async def test_status_follows_the_job_and_records_requeues(temporal_client: Client, task_queue: str) -> None:
    sched = FakeScheduler()
    job = sched.submit(2, start=False)
    async with _worker(temporal_client, task_queue, sched):
        handle = await _start(temporal_client, task_queue, job.job_id)
        await _until_state(handle, RecoveryState.WATCHING)
        assert (await handle.query(JobRecoveryWorkflow.status)).job_state is JobState.PENDING

        sched.schedule()
        for _ in range(50):
            st = await handle.query(JobRecoveryWorkflow.status)
            if st.job_state is JobState.RUNNING:
                break
            await asyncio.sleep(0.1)
        assert st.job_state is JobState.RUNNING and len(st.nodes) == 2

        sched.requeue_by_slurm(job.job_id)
        for _ in range(50):
            st = await handle.query(JobRecoveryWorkflow.status)
            if st.restart_count == 1:
                break
            await asyncio.sleep(0.1)
        assert st.restart_count == 1
        assert "REQUEUED" in [e.event for e in st.timeline]
        sched.schedule()
        sched.finish_job(job.job_id)
        result = await asyncio.wait_for(handle.result(), timeout=20)
    assert result.state is RecoveryState.FINISHED
