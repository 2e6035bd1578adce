"""Every trainer-side fault, injected for real into a local 2-rank run through the injector."""

from __future__ import annotations

import signal
import time

import pytest

from deploy.demo import inject
from deploy.demo.faults import CRASH_EXIT_CODE
from deploy.local.fake_nvml_state import write_initial_state
from deploy.local.layout import LabLayout
from tests.demo.conftest import Launcher, LocalRun

pytestmark = pytest.mark.timeout(60)


def _started(run: LocalRun, step: int = 3) -> None:
    for rank in range(len(run.procs)):
        run.wait_step(rank, step)


def _peer_gone(run: LocalRun, rank: int) -> None:
    """A survivor of a dead peer fails inside all_reduce (gloo sees the closed connection) and exits 1."""
    assert run.procs[rank].wait(timeout=30) == 1
    assert "Traceback (most recent call last)" in run.log(rank)


def test_slow_then_crash(launch: Launcher, layout: LabLayout) -> None:
    run = launch(step_sleep=0.02)
    _started(run)

    slow = inject.inject_slow(layout, "demo", 1, 0.3)
    assert (slow.kind, slow.rank, slow.node, slow.delay_s, slow.job_id, slow.restart) == ("slow", 1, "n2", 0.3, 7, 0)
    assert slow.pids == [run.procs[1].pid]
    assert slow.injected_at.timestamp() <= slow.t0_epoch <= time.time()
    slowed_from = run.last_step(1) + 1
    run.wait_step(1, slowed_from + 3)
    late = [t for s, _, t in run.steps(1) if s > slowed_from]
    assert late and min(late) >= 0.3, run.steps(1)
    # The straggler slows its peer too: rank 0 waits for it inside all_reduce.
    assert min(t for s, _, t in run.steps(0) if s > slowed_from) >= 0.25

    crash = inject.inject_crash(layout, "demo", 1)
    assert run.procs[1].wait(timeout=30) == CRASH_EXIT_CODE
    assert f"[ERROR] rank=1/2 node=n2 step={run.last_step(1) + 1} fatal error (fault {crash.id})" in run.log(1)
    _peer_gone(run, 0)

    records = inject.read_injections(layout)
    assert [r.id for r in records] == [slow.id, crash.id]
    assert records[1].t0 == crash.t0 and records[1].acked_at == crash.t0
    with pytest.raises(inject.RankNotRunningError, match="stale pid"):
        inject.inject_crash(layout, "demo", 1)


def test_hang_then_segv(launch: Launcher, layout: LabLayout) -> None:
    run = launch(step_sleep=0.02)
    _started(run)

    hang = inject.inject_hang(layout, "demo", 1)
    time.sleep(1.0)  # let in-flight lines land
    frozen = (run.last_step(0), run.last_step(1))
    time.sleep(1.5)
    assert (run.last_step(0), run.last_step(1)) == frozen
    assert abs(frozen[0] - frozen[1]) <= 1
    assert all(p.poll() is None for p in run.procs), "a hang must not kill anyone"
    assert hang.t0_epoch < time.time() - 2

    # SIGSEGV the hung rank: faulthandler prints its (hung) stack, the process dies by signal 11.
    segv = inject.inject_segv(layout, "demo", 1)
    assert (segv.kind, segv.rank, segv.pids) == ("segv", 1, [run.procs[1].pid])
    assert run.procs[1].wait(timeout=30) == -signal.SIGSEGV
    log1 = run.log(1)
    assert "Fatal Python error: Segmentation fault" in log1 and "_hang_forever" in log1
    _peer_gone(run, 0)


def test_user_bug_on_all_ranks(launch: Launcher, layout: LabLayout) -> None:
    run = launch(step_sleep=0.02)
    _started(run)

    record = inject.inject(layout, "user-bug", run="demo", rank="all")
    assert (record.kind, record.rank, record.node) == ("user-bug", None, None)
    assert run.wait(30) == [1, 1]
    for rank in (0, 1):
        log = run.log(rank)
        assert "Traceback (most recent call last)" in log
        assert "in check_batch" in log
        assert "ValueError: shape mismatch: expected inputs of shape [batch, 32]" in log
    acks = sorted((layout.run_dir("demo") / "control").glob(f"ack-{record.id}-rank-*.json"))
    assert len(acks) == 2


def test_gpu_fault(launch: Launcher, layout: LabLayout) -> None:
    run = launch(step_sleep=0.02, nodes=("n1", "n1"), env={"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1"})
    write_initial_state(layout.nvml_state("n1"), "n1", 4)
    _started(run)

    record = inject.inject_gpu_fault(layout, "demo", 1)
    assert (record.kind, record.rank, record.node, record.gpu, record.xid) == ("gpu-fault", 1, "n1", 1, 79)
    assert record.acked_at is not None and record.t0 <= record.acked_at
    assert layout.nvml_state("n1").read_text().splitlines()[-1] == "xid 1 79"
    assert run.procs[1].wait(timeout=30) == 1
    log = run.log(1)
    assert "in synchronize_device" in log
    assert "RuntimeError: CUDA error: unspecified launch failure\n" in log
    assert "CUDA kernel errors might be asynchronously reported at some other API call" in log
    assert "For debugging consider passing CUDA_LAUNCH_BLOCKING=1" in log
    _peer_gone(run, 0)
