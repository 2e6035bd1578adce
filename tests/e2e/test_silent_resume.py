"""End to end on the test lab: a job Rebound reads no step line of (its ``logs=`` names files it never writes, as
for a Lightning job under Slurm without a TTY) is recovered from a node crash, its checkpoints recorded before the
restart, and its resume verified by the new complete checkpoint it saves (the scanner reads the demo's layout)."""

from __future__ import annotations

import time

import pytest

from deploy.demo.inject import inject
from deploy.demo.submit import submit_demo
from tests.e2e.recovery_support import (
    DemoJob,
    Recovery,
    baseline,
    incident_of,
    latency_report,
    settle_leftovers,
    slurm_job,
)
from tests.lab_support import LabHandle, lab_rebound_settings
from workers.client import connect

pytestmark = pytest.mark.slow


async def test_a_job_without_step_lines_is_verified_by_its_new_checkpoint(lab: LabHandle) -> None:
    client = await connect(lab_rebound_settings(lab).temporal)
    await settle_leftovers(lab, client)
    run = f"e2e-silent-{int(time.time() * 1000) % 10**9}"
    run_dir = lab.layout.run_dir(run)
    # The later --comment wins over the one submit_demo writes: the checkpoints, and logs Rebound never sees.
    comment = f"--comment=rebound: ckpt={run_dir / 'checkpoints'};logs={run_dir / 'logs'}/quiet-%j-*.log"
    job_id = submit_demo(
        lab.layout,
        run,
        nodes=2,
        tasks_per_node=2,
        gpus_per_node=2,
        steps=100000,
        checkpoint_every=10,
        extra_sbatch_args=(comment,),
        env=lab.slurm_env,
    )
    job = DemoJob(lab, run, lab.track(job_id))
    rec = Recovery(lab, client, job)
    try:
        await rec.wait_watching(timeout_s=30)
        lab.wait_for(job.has_checkpoint, 60)
        base = await baseline(lab, job)
        slurm = await slurm_job(lab, job.job_id)
        node = next(n for n in base.nodes if n != slurm.batch_host)
        try:
            record = inject(lab.layout, "node-crash", node=node, run=job.run)
            st = await rec.wait_resumed(timeout_s=120)
        finally:
            lab.lab.slurm.start()
        inc = incident_of(st, 1)
        assert inc is not None and inc.checkpoint is not None, rec.describe()
        latest = inc.checkpoint.latest_valid
        assert latest is not None and latest.step is not None and latest.path.startswith(str(run_dir))
        assert inc.checkpoint.last_seen_step is None  # Rebound never saw a step line
        checkpoint_notes = [e.detail for e in st.timeline if e.event == "CHECKPOINT" and e.incident == 1]
        assert checkpoint_notes and f"(step {latest.step})" in checkpoint_notes[0]
        watching = [e.detail for e in st.timeline if e.event == "WATCHING" and e.incident == 1]
        assert watching and watching[-1].endswith("[signal: checkpoint]"), watching
        print(latency_report("node crash, no step lines", st, inc, record.t0_epoch))
    finally:
        await rec.retire()
