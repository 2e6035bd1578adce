"""End to end on the real lab: JobRecovery watches a real Slurm job through the lab's own worker process."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from temporalio.client import WorkflowExecutionStatus

from tests.lab_support import LabHandle, lab_rebound_settings
from workers import jobs_cli
from workers.client import connect
from workflows.constants import job_workflow_id
from workflows.domain.recovery import JobRecoveryResult, RecoveryState
from workflows.domain.slurm import JobState
from workflows.job_recovery import JobRecoveryWorkflow


async def test_workflow_watches_a_running_slurm_job(lab: LabHandle) -> None:
    settings = lab_rebound_settings(lab)
    job_id = lab.submit_sleep_job(nodes=2)
    lab.wait_for(lambda: "RUNNING" in lab.slurm("squeue", "-h", "-j", str(job_id), "-o", "%T"), 20)

    await jobs_cli.watch(settings, job_id, poll_interval_s=0.5)
    await jobs_cli.watch(settings, job_id, poll_interval_s=0.5)  # a second start is a no-op
    client = await connect(settings.temporal)
    handle = client.get_workflow_handle(job_workflow_id(settings.cluster_name, job_id), result_type=JobRecoveryResult)

    for _ in range(100):
        st = await jobs_cli.query_status(client, settings, job_id)
        if st.state is RecoveryState.WATCHING:
            break
        await asyncio.sleep(0.1)
    assert st.state is RecoveryState.WATCHING
    assert st.job_state is JobState.RUNNING
    assert len(st.nodes) == 2 and set(st.nodes) <= set(lab.nodes)

    runs = [wf async for wf in client.list_workflows(f'WorkflowId = "{handle.id}"')]
    assert len(runs) == 1, "the second watch must not start another run"

    lab.slurm("scancel", str(job_id))
    result = await asyncio.wait_for(handle.result(), timeout=30)
    assert result.state is RecoveryState.FINISHED
    assert "cancelled" in result.reason
    assert (await handle.describe()).status is WorkflowExecutionStatus.COMPLETED
    final = await handle.query(JobRecoveryWorkflow.status)
    assert final.job_state is JobState.CANCELLED


def _cli(lab: LabHandle, *args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    settings = lab_rebound_settings(lab)
    env = {
        **lab.slurm_env,
        "REBOUND_CLUSTER_NAME": settings.cluster_name,
        "REBOUND_TEMPORAL__ADDRESS": settings.temporal.address,
        "REBOUND_TEMPORAL__QUERY_TIMEOUT_S": "5",
        "REBOUND_TEMPORAL__CONNECT_TIMEOUT_S": "3",
        **(env_extra or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_cli_status_of_an_unknown_job_exits_4(lab: LabHandle) -> None:
    done = _cli(lab, "status", "999999")
    assert done.returncode == 4, done.stderr
    assert "not monitored" in done.stderr


def test_cli_with_temporal_down_exits_3(lab: LabHandle) -> None:
    done = _cli(lab, "status", env_extra={"REBOUND_TEMPORAL__ADDRESS": "127.0.0.1:1"})
    assert done.returncode == 3, done.stderr
    assert "cannot reach Temporal" in done.stderr


def test_cli_status_lists_monitored_jobs(lab: LabHandle) -> None:
    job_id = lab.submit_sleep_job(nodes=1)
    assert _cli(lab, "watch", str(job_id)).returncode == 0
    done = _cli(lab, "status", "--json")
    assert done.returncode == 0, done.stderr
    assert f'"job_id": "{job_id}"' in done.stdout
