"""The node agent: a small worker on each GPU node, on task queue ``rebound-node-<node>``.

Workflows send node-local work (NVML reads, XID events, rank listings and stack dumps of hung ranks) to exactly
the node that must do it. The agent keeps one NVML session open so events are not missed between reads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from activities.gpu.activities import GpuActivities
from activities.gpu.nvml import NvmlSource
from activities.gpu.port import GpuSource
from activities.kernel.follow import KernelLogFollower, follow_kernel_log
from activities.kernel.readers import FileKernelLog, KernelLogReader, KmsgReader, PositionStore
from activities.kernel.sxid_catalog import default_sxid_catalog
from activities.procs.activities import ProcsActivities
from workers.client import connect
from workers.gpu_push import push_gpu_events
from workers.lifecycle import stop_on_signals
from workers.settings import Settings
from workers.telemetry import install_telemetry
from workers.wiring import build_scheduler
from workflows.constants import node_task_queue
from workflows.domain.errors import FailureKind, ReboundError

log = logging.getLogger("rebound.node_agent")


def node_name(settings: Settings) -> str:
    """This node's scheduler name: configured, else Slurm's SLURMD_NODENAME; never ``hostname``."""
    name = settings.node_agent.node_name or os.environ.get("SLURMD_NODENAME")
    if not name:
        raise ReboundError(FailureKind.CONFIGURATION, "set REBOUND_NODE_AGENT__NODE_NAME to this node's Slurm name")
    return name


def kernel_log_follower(settings: Settings, source: GpuSource) -> KernelLogFollower | None:
    """The follower of this node's kernel log into ``source``'s event stream, or None when none is configured.

    ``/dev/kmsg`` (any character device) is read record by record; anything else is a file of kernel-style lines
    (the lab's, ``{node}`` in the setting replaced by the node's name). The position lives in the state directory.
    """
    configured = settings.node_agent.kernel_log.strip()
    if not configured:
        return None
    node = source.host
    path = Path(configured.replace("{node}", node))
    store = PositionStore(settings.state_dir / "kernel-log" / f"{node}.position.json")
    position = store.load()
    try:
        is_device = stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        is_device = str(path) == "/dev/kmsg"  # a missing lab file is created later; a missing /dev/kmsg stays one
    reader: KernelLogReader = (
        KmsgReader(path=path, position=position) if is_device else FileKernelLog(path=path, position=position)
    )
    try:
        sxids = default_sxid_catalog()
    except ReboundError as e:
        log.warning("kernel log of %s not followed: %s", node, e)
        return None
    log.info("following the kernel log of %s at %s (from %s)", node, path, position or "the start of the buffer")
    return KernelLogFollower(node, reader, source, sxids, store)


async def run_node_agent(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Serve this node's activities until stopped."""
    stop = stop or stop_on_signals()
    node = node_name(settings)
    await serve_nodes(settings, [NvmlSource(host=node)], identity=f"rebound-agent@{node}", stop=stop)


async def serve_nodes(
    settings: Settings,
    sources: Sequence[GpuSource],
    *,
    identity: str,
    stop: asyncio.Event | None = None,
    activity_pollers: int = 5,
    push_poll_s: float = 0.1,
) -> None:
    """Connect to Temporal as ``identity``, with the node agent's telemetry, and serve every node of ``sources``
    (``serve_node``, over that one client) until stopped (SIGTERM/SIGINT, or ``stop``).

    A real node serves one, over NVML (``run_node_agent``); the lab's and the scale benchmark's fake nodes are
    served many to a process (``deploy/local/node_agents.py``). ``activity_pollers`` and ``push_poll_s`` are
    ``serve_node``'s, for every node.
    """
    stop = stop or stop_on_signals()
    telemetry = install_telemetry(settings, role="node_agent")
    try:
        client = await connect(
            settings.temporal,
            identity=identity,
            runtime=telemetry.runtime,
            interceptors=telemetry.interceptors,
        )
        served = (
            serve_node(client, settings, source, stop, activity_pollers=activity_pollers, push_poll_s=push_poll_s)
            for source in sources
        )
        await asyncio.gather(*served)
    finally:
        telemetry.shutdown()


async def serve_node(
    client: Client,
    settings: Settings,
    source: GpuSource,
    stop: asyncio.Event,
    *,
    activity_pollers: int = 5,
    push_poll_s: float = 0.1,
) -> None:
    """Serve one node's task queue (``rebound-node-<source.host>``) and push its GPU events until ``stop`` is set.

    One process may serve many nodes by running this once per node over one client (``serve_nodes``: the lab's and
    the scale benchmark's fake nodes, ``deploy/local/node_agents.py``); a real node runs it once, over NVML.

    Args:
        client: The process's Temporal client.
        settings: The process's settings (the scheduler to list jobs with, the rank scan's cluster, py-spy).
        source: This node's GPUs; opened here and closed when the node stops being served.
        stop: Set to stop serving.
        activity_pollers: Concurrent polls of the node's task queue (the SDK's default is 5; a process serving
            many nodes keeps it at 1 so its poll count stays one per node).
        push_poll_s: How often new GPU events are looked for.
    """
    node = source.host
    try:
        # Open now, not on the first read: the event thread must be listening before the first fault happens.
        await asyncio.to_thread(source.open)
    except ReboundError as e:
        log.warning("GPUs of %s not readable yet (%s); every read will retry", node, e)
    gpu = GpuActivities(source)
    procs = ProcsActivities(node, cluster=settings.node_agent.slurm_cluster, py_spy=settings.node_agent.py_spy_path)
    queue = node_task_queue(node)
    follower = kernel_log_follower(settings, source)
    pusher = asyncio.create_task(
        push_gpu_events(
            source,
            build_scheduler(settings.slurm),
            client,
            settings.cluster_name,
            node,
            stop,
            poll_s=push_poll_s,
            kernel_log_followed=follower is not None,
        )
    )
    kernel = (
        asyncio.create_task(follow_kernel_log(follower, stop, poll_s=settings.node_agent.kernel_log_poll_s))
        if follower is not None
        else None
    )
    try:
        async with Worker(
            client,
            task_queue=queue,
            activities=[gpu.read_gpu_health, gpu.health_check, procs.rank_processes, procs.dump_stacks],
            max_concurrent_activity_task_polls=activity_pollers,
            graceful_shutdown_timeout=timedelta(seconds=5),
        ):
            log.info("node agent for %s polling %s", node, queue)
            await stop.wait()
    finally:
        stop.set()
        await pusher
        if kernel is not None:
            await kernel
        source.close()
