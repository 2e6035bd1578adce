"""The lab's own settings (``REBOUND_LAB_*``): sizes, ports and timeouts of the local stack."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from deploy.local.layout import LabLayout


class LabConfig(BaseSettings):
    """One lab on this host. Two labs with different state dirs and ports can run side by side."""

    model_config = SettingsConfigDict(env_prefix="REBOUND_LAB_", extra="forbid", frozen=True)

    state_dir: Path = Field(Path(".rebound-lab"), description="Everything of the lab lives here.")
    cluster_name: str = Field("lab", pattern=r"^[a-z][a-z0-9_]{0,39}$")
    nodes: int = Field(4, ge=1, le=64, description="Slurm nodes n1..nN, one slurmd each, all on this host.")
    cpus_per_node: int = Field(4, ge=1)
    gpus_per_node: int = Field(4, ge=0, le=8)
    hang_floor_s: float = Field(
        8.0, gt=0, description="Shortest hang window of the lab's worker (its demo steps take ~0.2 s)."
    )
    restart_backoff_s: tuple[float, ...] = Field(
        (0.0, 1.0),
        min_length=1,
        description="The lab worker's pause before restart n+1 of a job (production: 0, 10, 30, 60, 120, 300 s): "
        "the lab takes one job through several faults in a row, and each restart would otherwise wait longer.",
    )
    silent_default_s: float = Field(
        30.0,
        gt=0,
        description="The lab worker's hang window for a job without step lines before its checkpoint cadence is "
        "learned (production: 1800 s); such a job is sampled at a quarter of its window.",
    )
    full_poll_every_s: float = Field(
        0.0,
        ge=0,
        description="The lab worker's full polls (production: 5 s, quiet polls between; 0: every poll a full one). "
        "The lab's promises are counted in its demo steps of 0.2-0.5 s: a straggler reported within ten steps "
        "took 12 steps with 5 s and 11 with 2 s. make test's scale smoke test runs the production setting.",
    )
    silent_sample_min_s: float = Field(
        5.0, gt=0, description="The lab worker's shortest interval between two stack samples of a silent job."
    )
    memory_mb: int = Field(4000, ge=100)
    demo_port_slot: int = Field(
        0,
        ge=0,
        le=1,
        description="Which half of the demo jobs' rendezvous port ranges this lab's jobs use (deploy/demo/ports.py): "
        "two labs on one host number their jobs alike, so each needs its own half (make test's second lab: 1).",
    )
    slurmctld_port: int = Field(6817, ge=1024, le=65535)
    slurmd_port_base: int = Field(17001, ge=1024, le=65000)
    slurmrestd_port: int = Field(6820, ge=1024, le=65535)
    temporal_port: int = Field(7233, ge=1024, le=65535)
    temporal_ui_port: int = Field(8233, ge=1024, le=65535)
    temporal_namespace: str = "default"
    tls_proxy: bool = Field(
        True,
        description="Start the TLS proxy (nginx, mutual TLS) in front of Temporal and slurmrestd "
        "(deploy/local/tls_proxy.py).",
    )
    temporal_tls_port: int = Field(7234, ge=1024, le=65535, description="The TLS proxy's port for Temporal (gRPC).")
    slurmrestd_tls_port: int = Field(6821, ge=1024, le=65535, description="The TLS proxy's port for slurmrestd.")
    workers_via_proxy: bool = Field(
        False,
        description="Connect the lab's worker and node agents to Temporal through the TLS proxy, each with its "
        "role's client certificate and the API key. Off by default: the dev server still listens on loopback for "
        "every local user, so the detour protects nothing on one host and adds a hop to every benchmark.",
    )
    # Fast failure detection: a killed node is DOWN in ~6 s with 3/2 (measured, facts/slurm-lab.md §3).
    slurmd_timeout_s: int = Field(3, ge=2)
    message_timeout_s: int = Field(2, ge=1)
    # A requeued job is held for cred_expire + 1 s before it can start again.
    cred_expire_s: int = Field(5, ge=2)
    start_worker: bool = Field(True, description="Start the central Rebound worker.")
    start_agents: bool = Field(True, description="Start the node agents (every node's task queue is served).")
    nodes_per_agent: int = Field(
        1,
        ge=1,
        le=64,
        description="Nodes one node-agent process serves (their queues rebound-node-<node>). 1: one agent per "
        "node, production's shape; a large lab (64 nodes on a 2-core host) shares one process among many nodes.",
    )
    ready_timeout_s: float = Field(60.0, gt=0, description="How long `up` waits for every part to be ready.")

    @field_validator("state_dir")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        # slurm.conf cannot expand variables or relative paths: everything is written absolute.
        return v.expanduser().resolve()

    @model_validator(mode="after")
    def _ports_distinct(self) -> LabConfig:
        ports = self.all_ports()
        if len(set(ports.values())) != len(ports):
            raise ValueError(f"lab ports overlap: {ports}")
        return self

    @property
    def layout(self) -> LabLayout:
        return LabLayout(self.state_dir)

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def agent_groups(self) -> list[tuple[str, tuple[str, ...]]]:
        """Each node-agent process of the lab, as (service name, the nodes it serves): ``agent-n1`` when it
        serves one node, ``agent-n1-n64`` when it serves nodes n1..n64."""
        names = self.node_names
        groups = [tuple(names[i : i + self.nodes_per_agent]) for i in range(0, len(names), self.nodes_per_agent)]
        return [(f"agent-{g[0]}" if len(g) == 1 else f"agent-{g[0]}-{g[-1]}", g) for g in groups]

    def slurmd_port(self, node: str) -> int:
        return self.slurmd_port_base + self.node_names.index(node)

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def temporal_tls_address(self) -> str:
        """The TLS proxy in front of the dev server (its certificate names 127.0.0.1 and localhost)."""
        return f"127.0.0.1:{self.temporal_tls_port}"

    @property
    def slurmrestd_tls_url(self) -> str:
        return f"https://127.0.0.1:{self.slurmrestd_tls_port}"

    @property
    def temporal_ui_url(self) -> str:
        return f"http://127.0.0.1:{self.temporal_ui_port}"

    @property
    def slurmrestd_url(self) -> str:
        return f"http://127.0.0.1:{self.slurmrestd_port}"

    def all_ports(self) -> dict[str, int]:
        """Every TCP port the lab listens on, by owner."""
        ports = {
            "slurmctld": self.slurmctld_port,
            "slurmrestd": self.slurmrestd_port,
            "temporal": self.temporal_port,
            "temporal-ui": self.temporal_ui_port,
        }
        if self.tls_proxy:
            ports["temporal-tls"] = self.temporal_tls_port
            ports["slurmrestd-tls"] = self.slurmrestd_tls_port
        for i, node in enumerate(self.node_names):
            ports[f"slurmd-{node}"] = self.slurmd_port_base + i
        return ports
