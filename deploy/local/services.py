"""Rebound's own processes in the lab: the central worker and the node agents (one per Slurm node, or one process
serving many nodes' queues in a large lab: ``LabConfig.nodes_per_agent``)."""

from __future__ import annotations

import getpass
import json
import os
import sys

from deploy.local.config import LabConfig
from deploy.local.fake_nvml_state import write_initial_state
from deploy.local.node_check_lab import check_command
from deploy.local.processes import LabError, kill_and_wait, read_owned_pid, run, spawn, wait_until
from deploy.local.temporal_server import temporal_binary
from deploy.local.tls_proxy import client_env
from workflows.constants import DEFAULT_TASK_QUEUE, node_task_queue


class ReboundServices:
    """Start/stop the worker and node agents; each is a `rebound` subcommand in its own session."""

    def __init__(self, cfg: LabConfig) -> None:
        self.cfg = cfg
        self.lay = cfg.layout

    def common_env(self, role: str = "worker") -> dict[str, str]:
        """Settings every Rebound process of this lab gets (see workers/settings.py); with
        ``workers_via_proxy``, the TLS proxy's address and ``role``'s client certificate."""
        via_proxy = client_env(self.cfg, role) if self.cfg.workers_via_proxy and self.cfg.tls_proxy else {}
        env = dict(
            os.environ,
            REBOUND_CLUSTER_NAME=self.cfg.cluster_name,
            REBOUND_STATE_DIR=str(self.lay.state_dir),
            REBOUND_TEMPORAL__ADDRESS=self.cfg.temporal_address,
            REBOUND_TEMPORAL__NAMESPACE=self.cfg.temporal_namespace,
            REBOUND_SLURM__SLURM_CONF=str(self.lay.slurm_conf),
            REBOUND_AUTH__MUNGE_SOCKET=str(self.lay.munge_socket),
            SLURM_CONF=str(self.lay.slurm_conf),
            # The demo's steps take ~0.2 s: a hang window floor of a minute (the production default, for steps of
            # seconds) would make a hang wait a minute; 8 s still sits far above the lab's worst pauses (~2 s).
            REBOUND_DETECTION__HANG__FLOOR_S=str(self.cfg.hang_floor_s),
            REBOUND_DETECTION__HANG__STARTUP_S="120",
            # One job is taken through several faults in a row (tests/e2e/test_launcher_matrix.py, the launchers
            # bench): production's growing restart backoff and half-hour silent window would make that minutes.
            REBOUND_DETECTION__RESTART_BACKOFF_S=json.dumps(list(self.cfg.restart_backoff_s)),
            REBOUND_DETECTION__HANG__SILENT_DEFAULT_S=str(self.cfg.silent_default_s),
            REBOUND_DETECTION__SILENT_SAMPLE_MIN_S=str(self.cfg.silent_sample_min_s),
            REBOUND_WATCH__FULL_POLL_EVERY_S=str(self.cfg.full_poll_every_s),
            # Jobs' logs are read only inside the lab (where the demo writes them), and only their user's files.
            REBOUND_WATCH__LOG_ROOTS=json.dumps([str(self.lay.state_dir.resolve())]),
            # The lab acts (production starts in observe mode); its operator is whoever runs it (the Unix user, as
            # MUNGE proves it). The breaker keeps its default (10 % of 4 nodes: one drain per hour); tests reset it.
            REBOUND_FLEET__MODE="act",
            # The operator list is live configuration: it lives in the lab's TOML file (``write_rebound_config``),
            # which the worker re-reads at every operator action; the environment would freeze it.
            REBOUND_CONFIG=str(self.lay.rebound_config),
            REBOUND_FLEET__HEALTH_CHECK_AFTER_S="600",
            # The node check job's ranks go through the lab's fault wrapper (deploy/local/node_check_lab.py).
            REBOUND_NODE_CHECK__COMMAND=json.dumps(check_command(self.lay.state_dir)),
        )
        env.update(via_proxy)  # the proxy's address replaces the dev server's
        return env

    def write_rebound_config(self) -> None:
        """The lab's TOML settings: its operator is whoever runs the lab (kept if the file exists: a test may
        have changed it, and a change must apply without restarting anything)."""
        path = self.lay.rebound_config
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"[fleet]\noperators = [{json.dumps(getpass.getuser())}]\n")
            path.chmod(0o644)

    def agent_env(self, node: str) -> dict[str, str]:
        """A node agent reads its own node's fake NVML: the library first on the loader path, its state file."""
        lib_dir = str(self.lay.fake_nvml_lib_dir)
        return dict(
            self.common_env("agent"),
            REBOUND_NODE_AGENT__NODE_NAME=node,
            # Two labs (demo and test) share this host: job ids repeat across them, so scope the rank scan.
            REBOUND_NODE_AGENT__SLURM_CLUSTER=self.cfg.cluster_name,
            LD_LIBRARY_PATH=f"{lib_dir}:{os.environ['LD_LIBRARY_PATH']}"
            if os.environ.get("LD_LIBRARY_PATH")
            else lib_dir,
            FAKE_NVML_STATE=str(self.lay.nvml_state(node)),
            REBOUND_NODE_AGENT__KERNEL_LOG=self.kernel_log_setting(),
        )

    def shared_agent_env(self) -> dict[str, str]:
        """A process serving several nodes reads their state files itself: no fake library, no node name."""
        return dict(
            self.common_env("agent"),
            REBOUND_NODE_AGENT__SLURM_CLUSTER=self.cfg.cluster_name,
            REBOUND_NODE_AGENT__KERNEL_LOG=self.kernel_log_setting(),
        )

    def kernel_log_setting(self) -> str:
        """Every lab node's agent reads its own file-backed kernel log (the nodes share one kernel)."""
        return str(self.lay.kernel_dir / "{node}.log")

    def prepare_gpus(self) -> None:
        """Build the fake NVML library and give every node a healthy state file (kept if it exists)."""
        from deploy.local.fake_nvml import build_fake_nvml  # needs gcc and nvml.h: only when agents start

        build_fake_nvml(self.lay.fake_nvml_lib_dir)
        for node in self.cfg.node_names:
            state = self.lay.nvml_state(node)
            if not state.exists():
                write_initial_state(state, node, self.cfg.gpus_per_node)

    def reset_gpus(self, node: str) -> None:
        """Give a node healthy GPUs again (after an injected GPU fault was repaired)."""
        write_initial_state(self.lay.nvml_state(node), node, self.cfg.gpus_per_node)

    def start(self) -> None:
        rebound = [sys.executable, "-m", "workers.cli"]
        self.write_rebound_config()
        if self.cfg.start_agents:
            self.prepare_gpus()
            for service, nodes in self.cfg.agent_groups():
                if self.pid(service) is None:
                    spawn(
                        self.agent_argv(nodes),
                        log_file=self.lay.log_file(service),
                        pid_file=self.lay.pid_file(service),
                        env=self.agent_env(nodes[0]) if len(nodes) == 1 else self.shared_agent_env(),
                    )
        if self.cfg.start_worker and self.pid("worker") is None:
            spawn(
                [*rebound, "worker"],
                log_file=self.lay.log_file("worker"),
                pid_file=self.lay.pid_file("worker"),
                env=self.common_env(),
            )
        queues = []
        if self.cfg.start_worker:
            queues.append(("worker", DEFAULT_TASK_QUEUE))
        if self.cfg.start_agents:
            queues += [(service, node_task_queue(n)) for service, nodes in self.cfg.agent_groups() for n in nodes]
        for service, queue in queues:
            wait_until(
                lambda s=service, q=queue: self._polling(s, q),
                self.cfg.ready_timeout_s,
                f"{service} to poll task queue {queue} (see {self.lay.log_file(service)})",
                0.3,
            )

    def agent_argv(self, nodes: tuple[str, ...]) -> list[str]:
        """One node: the real agent (``rebound node-agent``) over the fake NVML library. Several nodes: one process
        serving each node's queue with the same agent code, each node's GPUs read from its fake NVML state file
        (``deploy.local.node_agents``: NVML is one library per process, so one process cannot load 64 of them)."""
        if len(nodes) == 1:
            return [sys.executable, "-m", "workers.cli", "node-agent"]
        return [
            sys.executable,
            "-m",
            "deploy.local.node_agents",
            "--nodes",
            ",".join(nodes),
            "--nvml-state-dir",
            str(self.lay.nvml_dir),
            "--gpus",
            str(max(1, self.cfg.gpus_per_node)),
        ]

    def _polling(self, service: str, queue: str) -> bool:
        if self.pid(service) is None:
            raise LabError(f"{service} exited during start-up; see {self.lay.log_file(service)}")
        try:
            out = run(
                [
                    temporal_binary(),
                    "task-queue",
                    "describe",
                    "--task-queue",
                    queue,
                    "--address",
                    self.cfg.temporal_address,
                    "--namespace",
                    self.cfg.temporal_namespace,
                    "-o",
                    "json",
                ],
                timeout=10,
            )
        except LabError:
            return False
        return _has_pollers(out)

    def pid(self, service: str) -> int | None:
        return read_owned_pid(self.lay.pid_file(service), self.lay.state_dir)

    def services(self) -> list[str]:
        return ["worker", *[service for service, _ in self.cfg.agent_groups()]]

    def stop(self) -> None:
        # SIGTERM lets each worker shut down gracefully (a SIGKILLed worker costs the next one ~10 s per workflow).
        # Every agent with a pid file, not only the configured ones: an earlier `up` may have started more.
        services = sorted({*self.services(), *self.lay.started("agent-")})
        pids = [p for p in (self.pid(s) for s in services) if p is not None]
        kill_and_wait(pids, term_timeout_s=15)
        for s in services:
            self.lay.pid_file(s).unlink(missing_ok=True)


def _has_pollers(describe_json: str) -> bool:
    try:
        data = json.loads(describe_json)
    except json.JSONDecodeError:
        return False
    # The shape differs across CLI versions; any non-empty "pollers" list anywhere means someone polls.
    stack: list[object] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("pollers") or item.get("pollerInfo"):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
