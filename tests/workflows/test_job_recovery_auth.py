"""JobRecovery when the scheduler refuses Rebound's credentials: it waits for the fix (bounded), says so in the job's
timeline, reads nothing as the job's state, and picks up once the scheduler answers again."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

import workflows.job_recovery.scheduler as recovery_scheduler
from tests.munge_support import MungeLab
from tests.workflows.test_job_recovery import Harness, until
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.recovery import RecoveryState
from workflows.job_recovery import JobRecoveryWorkflow

_REFUSED = ReboundError(FailureKind.SCHEDULER_AUTH, "GET /slurm/v0.0.38/job/1: JWT refused. Fix slurm.rest_token_file.")


@pytest.fixture
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    # Module attributes read by the workflow: only an unsandboxed worker sees the patched values.
    monkeypatch.setattr(recovery_scheduler, "AUTH_WAIT", timedelta(seconds=0.2))
    monkeypatch.setattr(recovery_scheduler, "AUTH_WAITS", 3)


@pytest.mark.usefixtures("short_waits")
async def test_refused_credentials_wait_for_the_fix_in_the_timeline(
    temporal_client: Client, task_queue: str, tmp_path: Path, munge_lab: MungeLab
) -> None:
    h = Harness(temporal_client, task_queue, tmp_path, munge_lab)
    job = h.sched.submit(h.nodes[:2])
    h.sched.fail_next("get_job", _REFUSED, times=2)
    async with h.worker(workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await h.start(job.job_id)
        st = await until(handle, lambda s: s.state is RecoveryState.WATCHING)
        refused = [e for e in st.timeline if e.event == "SCHEDULER_AUTH"]
        assert len(refused) == 2
        assert "slurm.rest_token_file" in refused[0].detail and "(1/3)" in refused[0].detail
        assert st.incidents == ()  # a refused read is no incident and no state
        history = await handle.fetch_history()
        await handle.terminate("test over")
    replayer = Replayer(
        workflows=[JobRecoveryWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    await replayer.replay_workflow(history)


@pytest.mark.usefixtures("short_waits")
async def test_refused_credentials_are_not_waited_out_forever(
    temporal_client: Client, task_queue: str, tmp_path: Path, munge_lab: MungeLab
) -> None:
    h = Harness(temporal_client, task_queue, tmp_path, munge_lab)
    job = h.sched.submit(h.nodes[:2])
    h.sched.fail_next("get_job", _REFUSED, times=10)
    async with h.worker(workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await h.start(job.job_id)
        with pytest.raises(WorkflowFailureError) as caught:
            await asyncio.wait_for(handle.result(), 30)
    activity_error = caught.value.cause  # the workflow failed with the lookup's ActivityError
    assert isinstance(activity_error, ActivityError)
    failure = activity_error.cause  # the activity's own error
    assert isinstance(failure, ApplicationError) and failure.type == FailureKind.SCHEDULER_AUTH.value
    calls = [c for c in h.sched.calls if c.method == "get_job"]
    assert len(calls) == 4  # the first try and three waits: bounded
