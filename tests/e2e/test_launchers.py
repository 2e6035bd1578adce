"""End to end on the test lab: rank -> node from facts for the launchers people use (issue 11).

- torchrun under srun (one Slurm task per node, 2 workers each, everything in ``slurm-%j.out`` with torchrun's
  ``[rankN]:`` prefixes): Rebound places every rank from the node agents' view of the processes while the job
  trains, not by srun's layout over the tasks. Its faults (an XID on such a rank pinned on the node it ran on,
  only that node drained, the resume at the latest checkpoint) are the launcher matrix's
  (``test_launcher_matrix.py``).
- srun one task per rank with ``--distribution=cyclic``: the placement Rebound records is the cyclic one the
  ranks themselves report, not srun's default block layout.

The ground truth is the ranks' own word (``ranks/rank-R.json``: ``SLURMD_NODENAME`` of each rank's process).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from deploy.demo.injections import live_rank
from deploy.demo.submit import submit_demo
from tests.e2e.recovery_support import (
    DemoJob,
    Recovery,
    settle_leftovers,
    slurm_job,
)
from tests.lab_support import LabHandle, lab_rebound_settings
from workers.client import connect
from workflows.policy.attribution import block_rank_layout

pytestmark = pytest.mark.slow


@contextlib.asynccontextmanager
async def watched(
    lab: LabHandle, name: str, launcher: str, extra_sbatch_args: Sequence[str] = ()
) -> AsyncIterator[tuple[DemoJob, Recovery]]:
    """A demo job (2 nodes x 2 ranks) launched by ``launcher``, watched by Rebound, retired at the end."""
    client = await connect(lab_rebound_settings(lab).temporal)
    await settle_leftovers(lab, client)
    run = f"e2e-{name}-{int(time.time() * 1000) % 10**9}"
    job_id = submit_demo(
        lab.layout,
        run,
        nodes=2,
        tasks_per_node=2,
        gpus_per_node=2,
        steps=100000,
        checkpoint_every=10,
        extra_sbatch_args=extra_sbatch_args,
        env=lab.slurm_env,
        launcher=launcher,
    )
    job = DemoJob(lab, run, lab.track(job_id))
    rec = Recovery(lab, client, job)
    try:
        await rec.wait_watching(timeout_s=30)
        yield job, rec
    finally:
        await rec.retire()


def truth(lab: LabHandle, job: DemoJob) -> dict[int, str]:
    """Rank -> node, as each live rank process says (its SLURMD_NODENAME)."""
    lab.wait_for(lambda: all((job.run_dir / "ranks" / f"rank-{r}.json").exists() for r in range(4)), 90)
    return {r: live_rank(lab.layout, job.run, r).node for r in range(4)}


def placement(nodes: dict[int, str]) -> str:
    """The RANKS timeline entry's form: ``0-1@n1 2-3@n2``."""
    spans: list[tuple[int, int, str]] = []
    for r in sorted(nodes):
        if spans and spans[-1][1] == r - 1 and spans[-1][2] == nodes[r]:
            spans[-1] = (spans[-1][0], r, nodes[r])
        else:
            spans.append((r, r, nodes[r]))
    return " ".join(f"{a}-{b}@{n}" if b > a else f"{a}@{n}" for a, b, n in spans)


async def test_torchrun_ranks_are_placed_on_the_nodes_they_ran_on(lab: LabHandle) -> None:
    async with watched(lab, "torchrun-ranks", "torchrun") as (job, rec):
        where = truth(lab, job)
        slurm = await slurm_job(lab, job.job_id)
        assert slurm.task_count == 2, slurm  # one torchrun per node: Slurm's tasks are not the ranks
        st = await rec.wait_timeline("RANKS", "launcher per-node", timeout_s=90)
        entry = next(e for e in st.timeline if e.event == "RANKS")
        assert entry.detail.endswith(f": {placement(where)}"), (entry.detail, where)
        # A rank whose node srun's layout over the tasks would not give exists (rank 2: no such task; rank 1: task 1
        # is the second node, while torchrun put ranks 0-1 on its first group's node): the map is not that guess.
        guess = block_rank_layout(slurm.nodes, slurm.task_count)
        assert any(guess.get(r) != where[r] for r in (1, 2)), (guess, where)
        lab.wait_for((job.run_dir / f"slurm-{job.job_id}.out").exists, 30)
        assert not any((job.run_dir / "logs").glob("*.log"))


async def test_cyclic_distribution_is_placed_as_the_ranks_ran(lab: LabHandle) -> None:
    async with watched(lab, "cyclic", "srun", extra_sbatch_args=["--distribution=cyclic"]) as (job, rec):
        where = truth(lab, job)
        slurm = await slurm_job(lab, job.job_id)
        assert where != block_rank_layout(slurm.nodes, 4), f"srun did not lay the ranks out cyclically: {where}"
        st = await rec.wait_timeline("RANKS", "launcher srun", timeout_s=90)
        entry = next(e for e in st.timeline if e.event == "RANKS")
        assert entry.detail.endswith(f": {placement(where)}"), (entry.detail, where)
