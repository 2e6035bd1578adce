"""The real processes of a scale run: the Temporal dev server (the lab's binary, its own free ports and database),
Rebound's worker(s) (``rebound worker``, production settings) and one process serving every synthetic node's agent
(``deploy/local/node_agents.py``), all started in their own sessions and stopped by pid (SIGTERM, then SIGKILL).

Settings differ from the defaults only where the benchmark's cluster needs it: the cluster's name, the state
directory, the Temporal address, ``slurm.bin_dir`` (the fake Slurm commands), a free Prometheus port per process,
and ``fleet.mode=act`` (the default, ``observe``, records isolation decisions and requeues nothing; the lab runs
``act`` too). Detection, hangs and stragglers, the audit and the Fleet's rules keep their production defaults.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deploy.local.temporal_server import search_attribute_args, temporal_binary

__all__ = ["CLUSTER", "Stack", "free_port", "poll_limit"]

CLUSTER = "scale"

#: Temporal's frontend admits ``frontend.namespaceCount`` concurrent long polls per namespace and poller type
#: (1,200 by default in the dev server's version). Every node agent holds one on its own task queue (ADR 004), so
#: at 1,000 jobs (1,240 synthetic nodes) the agents took them all and the worker's own activity pollers were refused
#: ("namespace concurrent poller limit exceeded", ResourceExhausted): no JobRecovery started in 3 minutes. A real
#: cluster of that many nodes needs the same setting (docs/operations.md); this is the headroom above one per node.
POLL_HEADROOM = 1_000


def poll_limit(nodes: int) -> int:
    """``frontend.namespaceCount`` for a cluster of ``nodes`` node agents and a few Rebound workers."""
    return max(1_200, nodes + POLL_HEADROOM)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Stack:
    """Started processes by name; ``stop`` ends them all."""

    work: Path
    bin_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    temporal_port: int = 0
    metrics_port: int = 0
    worker_env: dict[str, str] = field(default_factory=dict)
    """Settings for the worker(s) beyond the benchmark's own (``REBOUND_...``); empty: production settings."""
    worker_metrics: dict[str, str] = field(default_factory=dict)
    """Each started worker's Prometheus page (``/metrics``) by process name."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
        log = (self.work / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        self.procs[name] = proc
        return proc.pid

    def start_temporal(self, nodes: int) -> int:
        self.temporal_port, self.metrics_port = free_port(), free_port()
        argv = [
            temporal_binary(),
            "server",
            "start-dev",
            "--headless",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.temporal_port),
            "--http-port",
            str(free_port()),
            "--metrics-port",
            str(self.metrics_port),
            "--db-filename",
            str(self.work / "temporal.db"),
            "--sqlite-pragma",
            "journal_mode=wal",
            "--sqlite-pragma",
            "synchronous=normal",
            "--namespace",
            "default",
            "--log-level",
            "warn",
            "--dynamic-config-value",
            f"frontend.namespaceCount={poll_limit(nodes)}",
            *search_attribute_args(),
        ]
        return self.spawn("temporal", argv)

    def rebound_env(self, state_dir: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("REBOUND_") and k != "SLURM_CONF"}
        repo = str(Path(__file__).resolve().parents[2])
        env.update(
            PYTHONPATH=os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p),
            REBOUND_CLUSTER_NAME=CLUSTER,
            REBOUND_STATE_DIR=str(state_dir),
            REBOUND_TEMPORAL__ADDRESS=self.address,
            REBOUND_SLURM__BIN_DIR=str(self.bin_dir),
            REBOUND_FLEET__MODE="act",
            REBOUND_TELEMETRY__PROMETHEUS_BIND=f"127.0.0.1:{free_port()}",
        )
        return env

    def start_worker(self, index: int, state_dir: Path) -> int:
        env = {**self.rebound_env(state_dir), **self.worker_env}
        name = f"worker-{index}"
        self.worker_metrics[name] = f"http://{env['REBOUND_TELEMETRY__PROMETHEUS_BIND']}/metrics"
        return self.spawn(name, [sys.executable, "-m", "workers.cli", "worker"], env)

    def kill(self, name: str) -> None:
        """SIGKILL one process (a crash: no clean-up of its own) and forget it, so ``check_alive`` does not name it."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()
        self.worker_metrics.pop(name, None)

    def start_agents(self, hostlist: str, nvml_dir: Path, gpus: int, push_poll_s: float, state_dir: Path) -> int:
        argv = [
            sys.executable,
            "-m",
            "deploy.local.node_agents",
            "--nodes",
            hostlist,
            "--nvml-state-dir",
            str(nvml_dir),
            "--gpus",
            str(gpus),
            "--push-poll-s",
            str(push_poll_s),
        ]
        return self.spawn("agents", argv, self.rebound_env(state_dir))

    def check_alive(self) -> None:
        """Raise naming the first process that exited (with its log's tail)."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.work / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}; its log ends:\n{tail}")

    def stop(self, names: Sequence[str] | None = None, term_timeout_s: float = 20.0) -> None:
        chosen = [n for n in (names or list(self.procs)) if n in self.procs]
        for name in chosen:
            with contextlib.suppress(ProcessLookupError):
                self.procs[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + term_timeout_s
        for name in chosen:
            proc = self.procs.pop(name)
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
