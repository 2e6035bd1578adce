"""The injector's bookkeeping (rank lookup, ack wait, records) and the trainer's fault watcher, without torch."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.demo import inject
from deploy.demo.common import FaultAck, FaultRequest, RankEnv, RankInfo, RunPaths, atomic_write_json, utc_iso
from deploy.demo.faults import CRASH_EXIT_CODE, FaultWatcher, cuda_error_message
from deploy.demo.procs import proc_start_ticks, read_stat
from deploy.local.layout import LabLayout

ENV = RankEnv(rank=1, world_size=2, local_rank=1, node="n2", restart=0, job_id=7, gpu=1)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process standing in for a rank."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _register(layout: LabLayout, pid: int, *, rank: int = 1, restart: int = 0, start: int | None = None) -> RunPaths:
    paths = RunPaths(layout.run_dir("demo"))
    paths.ensure()
    info = RankInfo(
        pid=pid,
        rank=rank,
        world_size=2,
        node=f"n{rank + 1}",
        local_rank=0,
        restart=restart,
        job_id=7,
        gpu=rank,
        proc_start=proc_start_ticks(pid) if start is None else start,
        started_at=utc_iso(time.time()),
    )
    atomic_write_json(paths.rank_file(rank), info)
    return paths


def _fake_trainer(paths: RunPaths, env: RankEnv, stop: threading.Event, delay: float = 0.2) -> threading.Thread:
    """Acks requests the way the real trainer does, from a thread (no torch, no exit)."""
    watcher = FaultWatcher(paths, env, emit=lambda _: None, exit_fn=lambda _: None, hang_fn=lambda: None)

    def loop() -> None:
        time.sleep(delay)
        step = 1
        while not stop.is_set():
            watcher.check(step)
            step += 1
            time.sleep(0.01)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_proc_start_matches_stat() -> None:
    stat = read_stat(os.getpid())
    assert stat is not None and stat.start_ticks == proc_start_ticks(os.getpid())
    assert stat.ppid == os.getppid()


def test_trainer_side_fault_is_recorded_with_the_ack_time(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    layout = LabLayout(tmp_path)
    paths = _register(layout, sleeper.pid)
    stop = threading.Event()
    env = RankEnv(rank=1, world_size=2, local_rank=0, node="n2", restart=0, job_id=7, gpu=1)
    _fake_trainer(paths, env, stop)
    try:
        record = inject.inject(layout, "slow", run="demo", rank="1", delay_s=0.5)
    finally:
        stop.set()
    ack = FaultAck.model_validate_json(paths.ack_file(record.id, 1).read_bytes())
    assert record.t0_epoch == ack.t0_epoch and record.acked_at == record.t0
    assert record.t0_epoch - record.injected_at.timestamp() >= 0.15  # the ack, not the request, is the onset
    assert (record.kind, record.rank, record.node, record.delay_s, record.job_id) == ("slow", 1, "n2", 0.5, 7)
    assert record.pids == [os.getpid()]  # the thread acked from this process
    request = FaultRequest.model_validate_json(paths.fault_file(record.id).read_bytes())
    assert (request.rank, request.job_id, request.restart, request.delay_s) == (1, 7, 0, 0.5)
    [line] = layout.injections.read_text().splitlines()
    assert inject.InjectionRecord.model_validate_json(line) == record
    assert '"t0":"' in line and line.count("Z") >= 2  # ISO UTC timestamps


def test_ack_timeout_withdraws_the_request(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    layout = LabLayout(tmp_path)
    paths = _register(layout, sleeper.pid)
    started = time.monotonic()
    with pytest.raises(inject.AckTimeoutError, match="not applied within 0.3s"):
        inject.inject_crash(layout, "demo", 1, timeout_s=0.3)
    assert time.monotonic() - started < 2
    assert list(paths.control.glob("fault-*.json")) == []
    assert not layout.injections.exists()


def test_stale_and_recycled_pids_are_refused(tmp_path: Path) -> None:
    layout = LabLayout(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    _register(layout, dead.pid, start=1)
    with pytest.raises(inject.RankNotRunningError, match="stale pid"):
        inject.inject_segv(layout, "demo", 1)
    # A live pid with another start time is a recycled pid: never signal it.
    _register(layout, os.getpid(), start=(proc_start_ticks(os.getpid()) or 0) + 1)
    with pytest.raises(inject.RankNotRunningError, match="stale pid"):
        inject.inject_segv(layout, "demo", 1)


def test_lookup_errors(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    layout = LabLayout(tmp_path)
    with pytest.raises(inject.UnknownRunError, match="unknown run 'demo'.*known runs: none"):
        inject.inject_crash(layout, "demo", 0)
    _register(layout, sleeper.pid, rank=0)
    with pytest.raises(inject.RankNotRunningError, match=r"has no rank 3: .* \(present: rank-0.json\)"):
        inject.inject_hang(layout, "demo", 3)
    with pytest.raises(inject.InjectionError, match="node n1 has no fake NVML state"):
        inject.inject_gpu_fault(layout, "demo", 0)
    with pytest.raises(inject.NodeNotRunningError, match="node n3 has no running slurmd: pid file .* missing"):
        inject.inject_node_crash(layout, "n3")
    layout.run.mkdir(parents=True)
    layout.pid_file("slurmd-n3").write_text(f"{sleeper.pid}\n")
    with pytest.raises(inject.NodeNotRunningError, match=f"pid {sleeper.pid} .* is not slurmd"):
        inject.inject_node_crash(layout, "n3")


def test_dispatch_argument_checks(tmp_path: Path) -> None:
    layout = LabLayout(tmp_path)
    with pytest.raises(ValueError, match="needs a run"):
        inject.inject(layout, "crash", rank=1)
    with pytest.raises(ValueError, match="node-crash needs a node"):
        inject.inject(layout, "node-crash", run="demo")
    with pytest.raises(ValueError, match="needs one rank"):
        inject.inject(layout, "hang", run="demo", rank="all")
    with pytest.raises(ValueError, match="number or 'all'"):
        inject.inject(layout, "hang", run="demo", rank="one")
    assert [inject.parse_rank(r) for r in (2, "3", " all ", None)] == [2, 3, None, None]


def _request(paths: RunPaths, kind: str, **fields: object) -> FaultRequest:
    request = FaultRequest.model_validate(
        {"id": f"{kind}-{time.monotonic_ns()}", "kind": kind, "rank": 1, "job_id": 7, "restart": 0}
        | {"created_at": utc_iso(time.time())}
        | fields
    )
    atomic_write_json(paths.fault_file(request.id), request)
    return request


def test_watcher_applies_only_its_own_requests_once(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.ensure()
    exits: list[int] = []
    hangs: list[bool] = []
    lines: list[str] = []
    watcher = FaultWatcher(paths, ENV, emit=lines.append, exit_fn=exits.append, hang_fn=lambda: hangs.append(True))

    assert watcher.check(1).extra_delay_s == 0
    _request(paths, "slow", rank=0, delay_s=1.0)  # another rank
    _request(paths, "slow", restart=1, delay_s=2.0)  # another attempt
    _request(paths, "slow", job_id=8, delay_s=3.0)  # another job
    (paths.control / "fault-garbage.json").write_text("{not json")
    assert watcher.check(2).extra_delay_s == 0

    slow = _request(paths, "slow", delay_s=0.25)
    everyone = _request(paths, "user-bug", rank=None)
    state = watcher.check(3)
    assert (state.extra_delay_s, state.corrupt_next_batch) == (0.25, True)
    assert FaultAck.model_validate_json(paths.ack_file(slow.id, 1).read_bytes()).step == 3
    assert paths.ack_file(everyone.id, 1).exists()
    assert watcher.poll() == []  # each request is applied once

    crash = _request(paths, "crash")
    watcher.check(4)
    assert exits == [CRASH_EXIT_CODE]
    assert lines[-1].endswith(f"[ERROR] rank=1/2 node=n2 step=4 fatal error (fault {crash.id}): exiting with code 13")
    _request(paths, "hang")
    watcher.check(5)
    assert hangs == [True]
    gpu = _request(paths, "gpu-fault", xid=48)
    assert watcher.check(6).cuda_error == cuda_error_message(48)
    assert paths.ack_file(gpu.id, 1).exists()


def test_a_requeued_attempt_ignores_old_requests(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.ensure()
    _request(paths, "crash")  # aimed at restart 0
    later = RankEnv(rank=1, world_size=2, local_rank=1, node="n2", restart=1, job_id=7, gpu=1)
    exits: list[int] = []
    FaultWatcher(paths, later, emit=lambda _: None, exit_fn=exits.append).check(1)
    assert exits == []


def test_cuda_error_text() -> None:
    assert cuda_error_message(79).splitlines() == [
        "CUDA error: unspecified launch failure",
        "Search for `cudaErrorLaunchFailure' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html"
        " for more information.",
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be"
        " incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    ]
    assert cuda_error_message(13).startswith("CUDA error: an illegal memory access was encountered\n")
    assert cuda_error_message(48).startswith("CUDA error: uncorrectable ECC error encountered\n")
