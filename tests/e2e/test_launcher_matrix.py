"""End to end on the test lab: issue 11's matrix, each launcher x its faults, on the launchers bench's own code.

One job per launcher (``deploy.bench.launchers.SUBMIT``: srun per rank, torchrun under srun, a real PyTorch
Lightning job, a real Hugging Face Trainer job) is taken through faults one after the other
(``deploy.bench.launchers_run.run_launcher``, the code of ``rebound bench launchers``), each scored by
``deploy.bench.launchers.score_fault``: the right node or none, zero healthy nodes drained, and the job's own load
line at the latest valid checkpoint's step; on top, Rebound's own resume verdict must be ``verified``. Between
faults the bench repairs what an operator would.

``make test`` runs the cells in ``IN_MAKE_TEST`` (all four for torchrun and HF; Lightning's XID and rank kill only in
the bench, where its hang cell after them fails: docs/benchmarks/launchers.md; on top of the
single-fault e2e tests of ``test_recovery_scenarios.py`` and ``test_detection_scenarios.py`` for the srun demo);
``REBOUND_E2E_MATRIX=all`` runs all 16, as ``rebound bench launchers`` does with timings
(``docs/benchmarks/launchers.md`` says which cells are where). The lab's restart backoff and silent-job window are
shortened for this (``deploy/local/config.py``: ``restart_backoff_s``, ``silent_default_s``).
"""

from __future__ import annotations

import os
import time

import pytest

from deploy.bench.context import BenchContext, BenchOptions
from deploy.bench.launchers import FAULTS, LAUNCHERS, Fault, Launcher, failures, format_table
from deploy.bench.launchers_run import LauncherOptions, run_launcher
from tests.e2e.recovery_support import settle_leftovers
from tests.lab_support import LabHandle, lab_rebound_settings
from workers.client import connect

pytestmark = pytest.mark.slow

#: The cells ``make test`` runs (all 16 took 690 s on the 2-core lab, too long for its budget): every launcher
#: through a node crash and at least one fault more. The srun demo's row is not repeated here: its four faults are
#: ``make test``'s single-fault e2e tests (``test_recovery_scenarios.py``: node crash, XID 79, rank crash;
#: ``test_detection_scenarios.py``: hung rank), whose histories the replay tests also record.
IN_MAKE_TEST: dict[Launcher, tuple[Fault, ...]] = {
    "srun": (),
    "torchrun": FAULTS,
    "lightning": ("node-crash", "hang"),
    "hf": FAULTS,
}
#: The Python modules a launcher's job needs (the trainers extra).
_NEEDS: dict[Launcher, str] = {"lightning": "lightning", "hf": "transformers"}


def faults_for(launcher: Launcher) -> tuple[Fault, ...]:
    """``IN_MAKE_TEST``'s cells, or all four with ``REBOUND_E2E_MATRIX=all``."""
    return FAULTS if os.environ.get("REBOUND_E2E_MATRIX") == "all" else IN_MAKE_TEST[launcher]


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_launcher_job_through_its_faults(lab: LabHandle, launcher: Launcher) -> None:
    faults = faults_for(launcher)
    if not faults:
        pytest.skip(f"{launcher}: not in make test's matrix (IN_MAKE_TEST); REBOUND_E2E_MATRIX=all runs it")
    if launcher in _NEEDS:
        pytest.importorskip(_NEEDS[launcher])
    settings = lab_rebound_settings(lab)
    client = await connect(settings.temporal)
    await settle_leftovers(lab, client)
    ctx = BenchContext(lab=lab.lab, client=client, settings=settings, opts=BenchOptions(setup_timeout_s=180.0))
    opts = LauncherOptions(launchers=(launcher,), faults=faults)
    started = time.monotonic()
    results = await run_launcher(ctx, opts, launcher, f"e2e-{int(time.time() * 1000) % 10**9}")
    print(f"\n{format_table(results)}\n{launcher}: {len(results)} faults in {time.monotonic() - started:.0f} s")
    for r in results:
        if r.job_id is not None:
            lab.track(r.job_id)
    assert [r.fault for r in results] == list(opts.faults)
    assert all(r.passed for r in results), "\n".join(failures(results))
    assert not any(r.healthy_drained for r in results)
    # Rebound itself verified each resume against the checkpoint it recorded before the restart.
    unverified = [
        f"{r.fault}: {r.rebound_resume_point or 'no verdict'}" for r in results if r.rebound_resume_point != "verified"
    ]
    assert not unverified, unverified
