"""One process serving many fake nodes' agents: the real node agent (``workers.node_agent.serve_node``) once per
node, over one Temporal client (``serve_nodes``), each node's GPUs read from its fake NVML state file
(``deploy.local.fake_gpus``).

A real node runs one agent over NVML. A lab with many slurmds on one host (64 nodes), or the scale benchmark's
thousands of synthetic nodes, cannot afford a Python process per node; this serves them all from one, through the
same task queues (``rebound-node-<node>``), the same activities and the same GPU push path (ADR 004, ADR 008).
Each node polls its queue with one poller (the SDK's default is five per worker).

    python -m deploy.local.node_agents --nodes 'n[1-64]' --nvml-state-dir DIR [--gpus 8] [--push-poll-s 0.1]

Settings come from the environment like every Rebound process (``REBOUND_TEMPORAL__ADDRESS``,
``REBOUND_SLURM__*``, ``REBOUND_NODE_AGENT__SLURM_CLUSTER``...); ``node_agent.node_name`` is ignored. A node whose
state file is missing gets a healthy one (``DIR/<node>.state``, as the lab names them), so ``rebound lab inject
xid`` and the benchmark's injector append to the file this process reads.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from activities.slurm.hostlist import HostlistError, expand
from deploy.local.fake_gpus import StateFileGpuSource
from deploy.local.fake_nvml_state import write_initial_state
from workers.lifecycle import stop_on_signals
from workers.node_agent import serve_nodes
from workers.settings import Settings, load_settings

__all__ = ["fake_node_settings", "main", "run_node_agents", "state_file"]

log = logging.getLogger("rebound.node_agents")


def state_file(state_dir: Path, node: str) -> Path:
    """Where a node's fake NVML state lives (the lab's ``LabLayout.nvml_state`` names them the same way)."""
    return state_dir / f"{node}.state"


def fake_node_settings(settings: Settings) -> Settings:
    """The settings the fake nodes' agents run with: a kernel log only where it is per node (``{node}``).

    Fake nodes share this host's kernel: its ``/dev/kmsg`` is none of theirs (every fake node would report the host's
    lines as its own, and thousands of followers of one device would only load the host). The lab names a file per
    node (``$STATE/kernel/{node}.log``); the scale benchmark names none, and reads no kernel log.
    """
    if "{node}" in settings.node_agent.kernel_log:
        return settings
    return settings.model_copy(update={"node_agent": settings.node_agent.model_copy(update={"kernel_log": ""})})


async def run_node_agents(
    settings: Settings,
    nodes: Sequence[str],
    state_dir: Path,
    *,
    gpus_per_node: int = 8,
    push_poll_s: float = 0.1,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve every node of ``nodes`` until stopped (SIGTERM/SIGINT, or ``stop``)."""
    stop = stop or stop_on_signals()
    settings = fake_node_settings(settings)
    for node in nodes:
        path = state_file(state_dir, node)
        if not path.exists():
            write_initial_state(path, node, gpus_per_node)
    log.info("serving %d nodes' agents (%s ... %s)", len(nodes), nodes[0], nodes[-1])
    await serve_nodes(
        settings,
        [StateFileGpuSource(node, state_file(state_dir, node)) for node in nodes],
        identity=f"rebound-agents@{settings.cluster_name}",
        stop=stop,
        activity_pollers=1,
        push_poll_s=push_poll_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local.node_agents", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", required=True, help="Slurm hostlist of the nodes to serve, e.g. 'n[1-64]'")
    parser.add_argument("--nvml-state-dir", type=Path, required=True, help="directory of the nodes' state files")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs of a node whose state file is missing (default 8)")
    parser.add_argument("--push-poll-s", type=float, default=0.1, help="how often each node looks for GPU events")
    args = parser.parse_args(argv)
    try:
        nodes = expand(args.nodes)
    except HostlistError as e:
        parser.error(f"--nodes: {e}")
    if not nodes or args.gpus < 1 or args.push_poll_s <= 0:
        parser.error("--nodes must name a node, --gpus >= 1, --push-poll-s > 0")
    settings = load_settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.nvml_state_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(
        run_node_agents(settings, nodes, args.nvml_state_dir, gpus_per_node=args.gpus, push_poll_s=args.push_poll_s)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
