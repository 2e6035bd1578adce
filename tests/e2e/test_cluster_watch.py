"""End to end on the real lab: a job opts in with its Slurm comment and the lab's own worker starts its recovery.

The lab's worker (task queue ``rebound``, cluster ``labtest``) starts ClusterWatch when it comes up; nothing here
calls ``rebound watch``.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from temporalio.client import Client

from tests.lab_support import LabHandle, lab_rebound_settings
from workers import jobs_cli
from workers.client import connect
from workers.settings import Settings
from workflows.cluster_watch import ClusterWatchWorkflow
from workflows.constants import cluster_watch_workflow_id, job_workflow_id
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.recovery import JobRecoveryInput, JobRecoveryStatus


async def _monitored(client: Client, settings: Settings, job_id: int, timeout_s: float) -> JobRecoveryStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await jobs_cli.query_status(client, settings, job_id)
        except ReboundError as e:
            if e.kind is not FailureKind.JOB_NOT_FOUND or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


async def test_comment_opts_a_job_in_and_only_that_job(lab: LabHandle) -> None:
    settings = lab_rebound_settings(lab)
    client = await connect(settings.temporal)
    # The plain job goes first: every snapshot that shows the opted-in job shows it too.
    plain = lab.submit_sleep_job(nodes=1)
    submitted = time.monotonic()
    opted = lab.submit_sleep_job(nodes=1, extra_args=["--comment", "team=e2e; rebound: budget=2"])

    # 60 s: a discovery that failed during an earlier test's outage (tests/e2e/test_chaos.py) backs off first.
    st = await _monitored(client, settings, opted, timeout_s=60)
    found_after = time.monotonic() - submitted
    assert st.job_id == opted
    print(f"\njob {opted} monitored {found_after:.1f} s after sbatch")

    handle = client.get_workflow_handle(job_workflow_id(settings.cluster_name, opted))
    history = await handle.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    [inp] = await client.data_converter.decode(started.input.payloads, [JobRecoveryInput])
    assert inp.spec.restart_budget == 2  # the spec from the comment reached the workflow

    with pytest.raises(ReboundError) as not_monitored:
        await jobs_cli.query_status(client, settings, plain)
    assert not_monitored.value.kind is FailureKind.JOB_NOT_FOUND

    watch = client.get_workflow_handle(cluster_watch_workflow_id(settings.cluster_name))
    status = await asyncio.wait_for(watch.query(ClusterWatchWorkflow.status), timeout=settings.temporal.query_timeout_s)
    assert opted in status.known and plain not in status.known
