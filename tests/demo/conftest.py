"""Launching the demo trainer locally, without Slurm: one subprocess per rank with the SLURM_* variables srun sets."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deploy.local.layout import LabLayout

REPO_ROOT = Path(__file__).resolve().parents[2]
STEP_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) \[INFO\] rank=(?P<rank>\d+)/(?P<world>\d+) "
    r"node=(?P<node>\S+) step=(?P<step>\d+) loss=(?P<loss>\d+\.\d{4}) step_time=(?P<step_time>\d+\.\d{3})s "
    r"compute_time=(?P<compute_time>\d+\.\d{3})s$"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LocalRun:
    """A local multi-rank launch of ``python -m deploy.demo.train``, one log file per rank."""

    layout: LabLayout
    name: str
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]
    started: float = field(default_factory=time.monotonic)

    def log(self, rank: int) -> str:
        return self.logs[rank].read_text(errors="replace") if self.logs[rank].exists() else ""

    def steps(self, rank: int) -> list[tuple[int, float, float]]:
        """(step, loss, step_time) of every step line of ``rank``."""
        out = []
        for line in self.log(rank).splitlines():
            m = STEP_LINE.match(line)
            if m:
                out.append((int(m["step"]), float(m["loss"]), float(m["step_time"])))
        return out

    def last_step(self, rank: int) -> int:
        steps = self.steps(rank)
        return steps[-1][0] if steps else 0

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if all(p.poll() is not None for p in self.procs) and not predicate():
                break
            time.sleep(0.05)
        if not predicate():
            tails = "\n".join(f"--- rank {r}\n{self.log(r)[-2000:]}" for r in range(len(self.procs)))
            raise AssertionError(f"timed out waiting for {what}\n{tails}")

    def wait_step(self, rank: int, step: int, timeout: float = 30.0) -> None:
        self.wait_until(lambda: self.last_step(rank) >= step, timeout, f"rank {rank} at step {step}")

    def wait(self, timeout: float = 30.0) -> list[int]:
        """Exit codes of every rank (negative: killed by that signal)."""
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                tails = "\n".join(f"--- rank {r}\n{self.log(r)[-2000:]}" for r in range(len(self.procs)))
                raise AssertionError(f"ranks still running after {timeout}s\n{tails}") from None
        return codes

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait(timeout=10)


Launcher = Callable[..., LocalRun]


@pytest.fixture
def layout(tmp_path: Path) -> LabLayout:
    return LabLayout(tmp_path / "lab")


@pytest.fixture
def launch(layout: LabLayout) -> Iterator[Launcher]:
    """Start a local run; every run started is killed at teardown, so a failing test never leaks ranks."""
    runs: list[LocalRun] = []

    def _launch(
        name: str = "demo",
        *,
        world: int = 2,
        steps: int = 1000,
        checkpoint_every: int = 5,
        step_sleep: float = 0.05,
        job_id: int = 7,
        restart: int = 0,
        nodes: tuple[str, ...] | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> LocalRun:
        run_dir = layout.run_dir(name)
        log_dir = run_dir / "local-logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        node_names = nodes or tuple(f"n{r + 1}" for r in range(world))
        procs, logs = [], []
        for rank in range(world):
            rank_env = {
                **os.environ,
                "PYTHONPATH": str(REPO_ROOT),
                "SLURM_PROCID": str(rank),
                "SLURM_NTASKS": str(world),
                "SLURM_LOCALID": str(node_names[:rank].count(node_names[rank])),
                "SLURMD_NODENAME": node_names[rank],
                "SLURM_JOB_ID": str(job_id),
                "SLURM_RESTART_COUNT": str(restart),
                "MASTER_PORT": str(port),
                **(env or {}),
            }
            log = log_dir / f"restart-{restart}-rank-{rank}.log"
            cmd = [sys.executable, "-m", "deploy.demo.train", "--run-dir", str(run_dir), "--steps", str(steps)]
            cmd += ["--checkpoint-every", str(checkpoint_every), "--step-sleep", str(step_sleep), *extra_args]
            with log.open("wb") as out:
                procs.append(subprocess.Popen(cmd, env=rank_env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT))
            logs.append(log)
        run = LocalRun(layout=layout, name=name, procs=procs, logs=logs)
        runs.append(run)
        return run

    yield _launch
    for run in runs:
        run.kill()
