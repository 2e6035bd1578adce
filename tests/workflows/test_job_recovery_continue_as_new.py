"""JobRecovery continues as new before its history grows large, carrying its state.

Runs on its own dev server whose continue-as-new suggestion comes after 40 events instead of ~4,000, so that a
handful of state changes is enough.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from tests.temporal_support import start_dev_env
from tests.workflows.test_job_recovery import Harness, until
from workflows.domain.recovery import RecoveryState
from workflows.domain.slurm import JobState
from workflows.job_recovery import JobRecoveryWorkflow


@pytest_asyncio.fixture
async def small_history_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_env("limit.historyCount.suggestContinueAsNew=40")
    yield env
    await env.shutdown()


async def test_state_survives_continue_as_new(small_history_env: WorkflowEnvironment, tmp_path: Path) -> None:
    h = Harness(small_history_env.client, f"tq-{uuid.uuid4().hex}", tmp_path)
    job = h.sched.submit(h.nodes[:2])
    async with h.worker():
        handle = await h.start(job.job_id)
        await until(handle, lambda s: s.state is RecoveryState.WATCHING)
        h.step(job.job_id, 0, 1, h.nodes[0])
        # Each suspend/resume is a state change the workflow records: enough of them fill the history.
        for _ in range(12):
            for state in (JobState.SUSPENDED, JobState.RUNNING):
                h.sched._update(job.job_id, state=state)  # an operator's scontrol suspend/resume
                await until(handle, lambda s, state=state: s.job_state is state)
        st = await until(handle, lambda s: s.runs >= 2, timeout=30)
        assert [e.event for e in st.timeline][0] == "WATCHING"  # the first run's timeline came along
        h.sched.finish_job(job.job_id)
        result = await asyncio.wait_for(handle.result(), 20)
        latest = small_history_env.client.get_workflow_handle(handle.id)
        final = await latest.query(JobRecoveryWorkflow.status)
    assert result.state is RecoveryState.FINISHED
    assert final.runs >= 2 and final.state is RecoveryState.FINISHED
    runs = [wf async for wf in small_history_env.client.list_workflows(f'WorkflowId = "{handle.id}"')]
    assert WorkflowExecutionStatus.CONTINUED_AS_NEW in {r.status for r in runs}


async def test_a_resubmitted_lineage_survives_continue_as_new(
    small_history_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """After a resubmission (ADR 014) the next run watches the new job, with the lineage and the budget spent."""
    h = Harness(small_history_env.client, f"tq-{uuid.uuid4().hex}", tmp_path)
    old = h.sched.submit(h.nodes[:2], requeue=False, comment="rebound", user_id=1000)
    async with h.worker():
        handle = await h.start(old.job_id)
        await until(handle, lambda s: any(e.event == "CAPTURE" for e in s.timeline))
        h.log(old.job_id, 2, f"rank=2/4 node={h.nodes[1]} step=8 fatal error: exiting with code 13")
        h.sched.fail_job(old.job_id, exit_code=13)
        st = await until(handle, lambda s: len(s.lineage) == 2, timeout=30)
        new_id = st.lineage[1]
        h.sched.schedule()
        h.step(new_id, 0, 9, h.sched.jobs[new_id].nodes[0])
        await until(handle, lambda s: s.state is RecoveryState.WATCHING and s.job_state is JobState.RUNNING)
        for _ in range(12):
            for state in (JobState.SUSPENDED, JobState.RUNNING):
                h.sched._update(new_id, state=state)
                await until(handle, lambda s, state=state: s.job_state is state)
        st = await until(handle, lambda s: s.runs >= 2, timeout=30)
        assert st.job_id == new_id and st.lineage == (old.job_id, new_id) and st.restarts_used == 1
        h.sched.finish_job(new_id)
        result = await asyncio.wait_for(handle.result(), 20)
    assert result.state is RecoveryState.FINISHED and result.job_id == new_id
