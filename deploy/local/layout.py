"""Where everything of one lab lives under its state directory. Pure paths: no I/O here.

$STATE/etc/        slurm.conf, gres.conf, jwt_hs256.key
$STATE/munge/      munge key, socket, log
$STATE/dev/        fake GPU character devices nvidia0..N
$STATE/state/      slurmctld state, slurmd spools (one per node)
$STATE/run/        pid files of everything `up` started, slurmrestd socket
$STATE/log/        every daemon's log
$STATE/temporal/   the dev server's SQLite file
$STATE/nvml/       fake NVML state file per node; lib/ holds the compiled fake library
$STATE/kernel/     file-backed kernel log per node (the agents read it as their /dev/kmsg)
$STATE/runs/<run>/ demo training runs: logs/, checkpoints/, control/ (fault files), ranks/ (pid files)
$STATE/injections.jsonl   every injected fault with its true onset time
$STATE/lab.env     shell exports for using the lab's Slurm and Temporal by hand
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LabLayout:
    """Paths of one lab. ``state_dir`` must be absolute: slurm.conf cannot expand variables."""

    state_dir: Path

    @property
    def etc(self) -> Path:
        return self.state_dir / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def jwt_key(self) -> Path:
        return self.etc / "jwt_hs256.key"

    @property
    def munge_dir(self) -> Path:
        return self.state_dir / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket.2"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def dev(self) -> Path:
        return self.state_dir / "dev"

    @property
    def spool(self) -> Path:
        return self.state_dir / "state"

    @property
    def run(self) -> Path:
        return self.state_dir / "run"

    @property
    def log(self) -> Path:
        return self.state_dir / "log"

    @property
    def temporal_db(self) -> Path:
        return self.state_dir / "temporal" / "temporal.db"

    @property
    def nvml_dir(self) -> Path:
        return self.state_dir / "nvml"

    @property
    def fake_nvml_lib_dir(self) -> Path:
        return self.nvml_dir / "lib"

    @property
    def runs(self) -> Path:
        return self.state_dir / "runs"

    @property
    def injections(self) -> Path:
        return self.state_dir / "injections.jsonl"

    @property
    def rebound_config(self) -> Path:
        """The lab's Rebound TOML file (``REBOUND_CONFIG``): what is live configuration (the operator list)."""
        return self.etc / "rebound.toml"

    @property
    def env_file(self) -> Path:
        return self.state_dir / "lab.env"

    @property
    def rest_socket(self) -> Path:
        return self.run / "slurmrestd.sock"

    def pid_file(self, service: str) -> Path:
        """Pid file of a service `up` started: ``slurmctld``, ``slurmd-n1``, ``temporal``, ``agent-n1``, ..."""
        return self.run / f"{service}.pid"

    def started(self, prefix: str) -> list[str]:
        """The services named ``prefix...`` that have a pid file: what an earlier `up` started, whatever the
        configuration says now (a lab brought up with ``REBOUND_LAB_NODES=5`` and taken down without it)."""
        return sorted(p.name.removesuffix(".pid") for p in self.run.glob(f"{prefix}*.pid"))

    def log_file(self, service: str) -> Path:
        return self.log / f"{service}.log"

    def slurmd_log(self, node: str) -> Path:
        """slurmd's log: its slurmstepds keep it open, which is how a node's job steps are found."""
        return self.log / f"slurmd-{node}.log"

    def nvml_state(self, node: str) -> Path:
        return self.nvml_dir / f"{node}.state"

    @property
    def kernel_dir(self) -> Path:
        return self.state_dir / "kernel"

    def kernel_log(self, node: str) -> Path:
        """The node's file-backed kernel log: the lab's nodes share one kernel, so each agent reads its own file
        (``REBOUND_NODE_AGENT__KERNEL_LOG``), which ``rebound lab inject kernel`` appends to."""
        return self.kernel_dir / f"{node}.log"

    def run_dir(self, run: str) -> Path:
        return self.runs / run
