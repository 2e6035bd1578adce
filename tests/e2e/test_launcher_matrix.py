"""End to end on the test lab: ``rebound bench launchers``' torchrun job (torchrun under srun, 2 nodes x 2 workers,
only ``slurm-%j.out``) through a node crash and then an XID, one after the other on the same job.

Each fault must blame its node, drain no healthy node, and resume at the latest valid checkpoint's step (the job's
own ``resumed from checkpoint`` line against the scanner's latest valid checkpoint when Rebound restarted it). The
test lab has 4 nodes: after the two faults the job keeps both faulted nodes excluded and runs on the other two.
"""

from __future__ import annotations

import time

import pytest

from deploy.bench.context import BenchContext, BenchOptions
from deploy.bench.launchers import format_table
from deploy.bench.launchers_run import LauncherOptions, run_launcher
from tests.e2e.recovery_support import settle_leftovers
from tests.lab_support import LabHandle, lab_rebound_settings
from workers.client import connect

pytestmark = pytest.mark.slow


async def test_torchrun_job_through_node_crash_then_xid(lab: LabHandle) -> None:
    settings = lab_rebound_settings(lab)
    client = await connect(settings.temporal)
    await settle_leftovers(lab, client)
    opts = LauncherOptions(launchers=("torchrun",), faults=("node-crash", "xid"), fault_timeout_s=90.0)
    ctx = BenchContext(lab=lab.lab, client=client, settings=settings, opts=BenchOptions(setup_timeout_s=120.0))
    results = await run_launcher(ctx, opts, "torchrun", time.strftime("e2e-%H%M%S"))
    print("\n" + format_table(results))
    assert [r.fault for r in results] == ["node-crash", "xid"]
    for r in results:
        assert r.passed, f"{r.fault}: {r.error}"
        assert r.implicated_nodes == (r.truth_node,)
        assert r.healthy_drained == ()
        assert r.resume_verified and r.resumed_step == r.checkpoint_step
        assert r.truth_node in r.excluded
