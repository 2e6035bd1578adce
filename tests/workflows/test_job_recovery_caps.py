"""What the operator's policy clamped of a job's comment is in the job's timeline and status from the start."""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.client import Client

from tests.workflows.test_job_recovery import Harness, until
from workflows.domain.recovery import JobRecoveryInput, RecoveryState
from workflows.domain.slurm import JobState, SlurmJob
from workflows.job_recovery import JobRecoveryWorkflow
from workflows.policy.optin import JobSelector, spec_for


async def test_the_clamp_is_in_the_timeline(temporal_client: Client, task_queue: str, tmp_path: Path) -> None:
    h = Harness(temporal_client, task_queue, tmp_path)
    job = h.sched.submit(h.nodes[:1], name="llm")
    comment = f"rebound: budget=100;logs={tmp_path}/job-%j-*.log"
    selector = JobSelector.model_validate({"spec": {"restart_budget": 3}})
    listed = SlurmJob(job_id=job.job_id, name="llm", user="alice", state=JobState.RUNNING, comment=comment)
    spec = spec_for(listed, [selector])
    assert spec is not None and spec.restart_budget == 3
    async with h.worker():
        handle = await temporal_client.start_workflow(
            JobRecoveryWorkflow.run,
            JobRecoveryInput(cluster=h.cluster, job_id=job.job_id, poll_interval_s=0.1, spec=spec),
            id=f"rebound/test/job/{job.job_id}/{uuid.uuid4().hex}",
            task_queue=task_queue,
        )
        # 60 s: on a loaded 2-core box (lab tests beside) the first workflow task took over 20 s once.
        st = await until(handle, lambda s: s.state is RecoveryState.WATCHING, timeout=60)
        await handle.terminate()
    capped = [e.detail for e in st.timeline if e.event == "CAPPED"]
    assert capped == ["budget=100 capped at 3 by operator policy (the job's selector)"]
    assert st.restart_budget == 3
