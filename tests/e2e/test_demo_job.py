"""End to end: the demo torch.distributed job trains under srun, checkpoints, and resumes after a requeue."""

from __future__ import annotations

import re
import time
from pathlib import Path

from activities.slurm.cli import SlurmCliScheduler
from deploy.demo.submit import submit_demo
from tests.lab_support import LabHandle
from workflows.domain.slurm import JobState

STEP = re.compile(
    r"^\S+Z \[INFO\] rank=(\d+)/4 node=(n\d) step=(\d+) loss=[\d.]+ step_time=[\d.]+s compute_time=[\d.]+s$"
)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_demo_trains_checkpoints_and_resumes_after_requeue(lab: LabHandle) -> None:
    run = f"e2e-demo-{int(time.time())}"
    job_id = lab.track(submit_demo(lab.layout, run, steps=100000, checkpoint_every=10, env=lab.slurm_env))
    logs = lab.layout.run_dir(run) / "logs"
    ckpts = lab.layout.run_dir(run) / "checkpoints"

    # Every one of the 4 ranks (2 nodes x 2) trains and logs like a real trainer.
    def all_ranks_step() -> bool:
        return all(any(STEP.match(line) for line in _lines(logs / f"job-{job_id}-rank-{r}.log")) for r in range(4))

    lab.wait_for(all_ranks_step, 90)
    matches = [STEP.match(line) for r in range(4) for line in _lines(logs / f"job-{job_id}-rank-{r}.log")]
    nodes = {m.group(2) for m in matches if m}
    assert len(nodes) == 2
    lab.wait_for(lambda: (ckpts / "step_000010" / "COMPLETE").exists(), 60)

    sched = SlurmCliScheduler(env=lab.slurm_env, bin_dir=None, timeout_s=15)
    before = await sched.get_job(job_id)
    assert before is not None and before.state is JobState.RUNNING
    await sched.requeue_job(job_id, expected_restart_count=before.restart_count)

    rank0 = logs / f"job-{job_id}-rank-0.log"

    def resumed_and_stepped() -> bool:
        lines = _lines(rank0)
        idx = [i for i, line in enumerate(lines) if "resumed from checkpoint step_" in line]
        return bool(idx) and any(STEP.match(line) for line in lines[idx[-1] :])

    lab.wait_for(resumed_and_stepped, 90)
    after = await sched.get_job(job_id)
    assert after is not None and after.restart_count == before.restart_count + 1
    resumed = [line for line in _lines(rank0) if "resumed from checkpoint" in line][-1]
    step = int(re.search(r"\(step (\d+)\)", resumed).group(1))  # type: ignore[union-attr]
    assert step >= 10 and step % 10 == 0
