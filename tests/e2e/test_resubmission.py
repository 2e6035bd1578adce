"""End to end on the test lab (ADR 014): a ``--no-requeue`` demo job whose rank crashes is resubmitted, as its
owner, from its own script, options and saved environment, off the crashed rank's node; the one JobRecovery
follows the new job, ClusterWatch starts no second one, and exactly one new job exists."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from temporalio.service import RPCError

from activities.slurm.submission import token_in
from deploy.demo.inject import inject
from tests.e2e.recovery_support import actions_of, baseline, monitored_demo, scheduler, slurm_job
from tests.lab_support import LabHandle
from workflows.cluster_watch import ClusterWatchWorkflow
from workflows.constants import cluster_watch_workflow_id, job_workflow_id
from workflows.domain.incident import ActionKind

pytestmark = pytest.mark.slow


async def test_no_requeue_job_is_resubmitted_once_as_its_owner_off_the_bad_node(lab: LabHandle) -> None:
    async with monitored_demo(lab, "resubmit", extra_sbatch_args=("--no-requeue",)) as (job, rec):
        base = await baseline(lab, job)
        st = await rec.wait_timeline("CAPTURE", "captured from slurmctld", timeout_s=30)
        record = inject(lab.layout, "crash", run=job.run, rank=3)
        assert record.node in base.nodes

        st = await rec.wait(lambda s: len(s.lineage) == 2, 120, "the job resubmitted")
        new_id = lab.track(st.lineage[1])
        t_resubmitted = time.time()
        st = await rec.wait_resumed(timeout_s=120)
        print(f"\nresubmission: fault -> resubmitted {t_resubmitted - record.t0_epoch:.1f} s; {rec.describe()}")

        inc = st.incidents[0]
        assert actions_of(inc, ActionKind.RESUBMIT) == [str(job.job_id)], rec.describe()
        assert not actions_of(inc, ActionKind.REQUEUE), rec.describe()
        assert st.job_id == new_id and st.restarts_used == 1
        assert inc.resumed_from.startswith("step_"), inc.resumed_from  # the new job loaded the run's checkpoint

        old, new = await slurm_job(lab, job.job_id), await slurm_job(lab, new_id)
        assert new.user_id == old.user_id and new.working_directory == old.working_directory
        assert not new.requeue_allowed, "the resubmission keeps the job's own --no-requeue"
        assert record.node in new.excluded_nodes and new.nodes and record.node not in new.nodes, new

        # Exactly one new job carries this lineage's token (a fresh squeue).
        carrying = [
            j.job_id
            for j in await scheduler(lab).list_jobs()
            if (token_in(j.comment) or "").startswith(f"{job.job_id}.")
        ]
        assert carrying == [new_id], carrying

        # ClusterWatch saw the new job, asked its lineage, and started no second JobRecovery for it.
        watch = rec.client.get_workflow_handle(cluster_watch_workflow_id(lab.cfg.cluster_name))
        deadline = time.monotonic() + 30
        while new_id not in (await watch.query(ClusterWatchWorkflow.status)).known:
            assert time.monotonic() < deadline, "ClusterWatch never considered the resubmitted job"
            await asyncio.sleep(0.5)
        with pytest.raises(RPCError):
            await rec.client.get_workflow_handle(job_workflow_id(lab.cfg.cluster_name, new_id)).describe()
    with contextlib.suppress(Exception):
        lab.slurm("scancel", str(new_id), check=False)
