"""JobRecovery and the job's log offsets: what a watch cancelled by a node agent's GPU signal leaves behind.

Temporal hands a workflow nothing from a cancelled activity (a TRY_CANCEL resolves in the workflow at once; and the
Python SDK answers a cancel it honoured with a bare ``CancelledError("Cancelled")``, no heartbeat details), so the
offsets the first watch anchored would be lost, and the attribution would anchor afresh at the files' sizes. The
workflow anchors them before the first watch (``scheduler.anchor_logs``) instead.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ActivityError, CancelledError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.workflows.test_job_recovery import Harness, h, until
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.recovery import JobRecoveryInput, JobRecoveryResult, RecoverySpec, RecoveryState
from workflows.job_recovery import JobRecoveryWorkflow

__all__ = ["h"]  # the fixture, re-exported for pytest


async def _start_slow_watch(h: Harness, job_id: int) -> WorkflowHandle[JobRecoveryWorkflow, JobRecoveryResult]:
    """A watch that polls once, then sleeps a minute: whatever is logged after its first poll only the
    attribution can read, from the offsets the workflow holds."""
    spec = RecoverySpec(logs=(str(h.tmp / "job-%j-*.log"),))
    return await h.client.start_workflow(
        JobRecoveryWorkflow.run,
        JobRecoveryInput(cluster=h.cluster, job_id=job_id, poll_interval_s=60, spec=spec),
        id=f"rebound/test/job/{job_id}/{uuid.uuid4().hex}",
        task_queue=h.task_queue,
    )


async def test_a_first_watch_cancelled_by_a_gpu_signal_keeps_its_anchor(h: Harness) -> None:
    job = h.sched.submit(h.nodes[:2], start=False)
    # A log file older than this run (the job appends to it across runs), ending in an old run's crash line.
    h.log(job.job_id, 3, "RuntimeError: CUDA error: an illegal memory access was encountered")
    await asyncio.sleep(0.3)  # the file's birth (where the file system keeps one) is well before the start
    h.sched.schedule()
    handle = await _start_slow_watch(h, job.job_id)
    st = await until(handle, lambda s: s.state is RecoveryState.WATCHING and s.log_offsets)
    anchored = {k: v for k, v in st.log_offsets.items() if not k.startswith("\x00")}
    assert anchored == {str(h.tmp / f"job-{job.job_id}-rank-3.log"): 67}  # at the old content's end
    await asyncio.sleep(0.5)  # the watch's first poll is done: it sleeps now

    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    h.log(job.job_id, 3, f"{ts} [ERROR] rank=3/4 node={h.nodes[1]} step=8 fatal error: exiting with code 13")
    # About a node the job does not run on (it moved there, the agent's view lags): the watch is cancelled all the
    # same, and the attribution has only the logs to go by.
    event = GpuEvent(kind=GpuEventKind.XID, host=h.nodes[3], index=1, xid=79, observed_at=datetime.now(UTC), sequence=1)
    await handle.signal(JobRecoveryWorkflow.gpu_fault_reported, event)

    st = await until(handle, lambda s: bool(s.incidents) and s.incidents[0].attribution is not None)
    attribution = st.incidents[0].attribution
    assert attribution is not None
    texts = " ".join(e.text for e in attribution.evidence)
    assert "exiting with code 13" in texts, attribution  # written after the anchor, before the signal: read
    assert "illegal memory access" not in texts  # the old run's line: never
    assert attribution.implicated_ranks == (3,)
    await handle.terminate()


@activity.defn(name="test_heartbeats_offsets")
async def _heartbeats_offsets() -> None:
    while True:
        activity.heartbeat({"offsets": {"/runs/x.log": 7}})
        await asyncio.sleep(0.1)


@workflow.defn(name="TestCancelsAHeartbeatingActivity", sandboxed=False)
class _CancelsAHeartbeatingActivity:
    @workflow.run
    async def run(self, wait: bool) -> str:
        handle = workflow.start_activity(
            _heartbeats_offsets,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=2),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
            if wait
            else workflow.ActivityCancellationType.TRY_CANCEL,
        )
        await workflow.sleep(1)
        handle.cancel()
        try:
            await handle
        except ActivityError as e:
            assert isinstance(e.cause, CancelledError)
            return repr(e.cause.details)
        return "completed"


@pytest.mark.parametrize("wait", [False, True])
async def test_the_sdk_hands_a_workflow_no_details_of_a_cancelled_activity(
    temporal_client: Client, task_queue: str, wait: bool
) -> None:
    # The premise of anchoring before the watch (module docstring): temporalio 1.35 drops the heartbeat details.
    async with Worker(
        temporal_client,
        task_queue=task_queue,
        workflows=[_CancelsAHeartbeatingActivity],
        activities=[_heartbeats_offsets],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        details = await temporal_client.execute_workflow(
            _CancelsAHeartbeatingActivity.run, wait, id=f"test-cancel-{uuid.uuid4().hex}", task_queue=task_queue
        )
    assert details == "()"
