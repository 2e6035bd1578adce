"""The central Rebound worker: workflows plus cluster-level activities on the main task queue."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from temporalio.worker import Worker

from activities.attribution import AttributionActivities
from activities.slurm.actions import SlurmActionActivities
from activities.slurm.activities import SlurmActivities
from activities.watch import LogPolicy, WatchActivities
from workers.client import connect
from workers.discovery import build_discovery_activities, start_cluster_watch
from workers.lifecycle import stop_on_signals
from workers.settings import Settings
from workers.wiring import build_gpu_activities, build_scheduler, build_snapshot_cache
from workflows.cluster_watch import ClusterWatchWorkflow
from workflows.job_recovery import JobRecoveryWorkflow
from workflows.node_gpu_health import NodeGpuHealthWorkflow

log = logging.getLogger("rebound.worker")

WORKFLOWS = [JobRecoveryWorkflow, NodeGpuHealthWorkflow, ClusterWatchWorkflow]


async def run_worker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT), then shut down gracefully.

    A graceful shutdown matters: after a SIGKILL the next worker waits ~10 s per cached workflow.
    """
    stop = stop or stop_on_signals()
    client = await connect(settings.temporal, identity=f"rebound-worker@{settings.cluster_name}")
    scheduler = build_scheduler(settings.slurm)
    slurm = SlurmActivities(scheduler)
    # Opt-in discovery. `snapshots` is the worker's one shared snapshot cache: every watcher must use this object.
    snapshots = build_snapshot_cache(scheduler, settings.watch)
    discovery = build_discovery_activities(client, snapshots, settings)
    logs = LogPolicy(settings.watch.log_roots, require_owner=settings.watch.log_require_owner)
    watch = WatchActivities(snapshots, logs)
    attribution = AttributionActivities(scheduler, logs)
    actions = SlurmActionActivities(scheduler)
    worker = Worker(
        client,
        task_queue=settings.temporal.task_queue,
        workflows=WORKFLOWS,
        activities=[
            slurm.observe_job,
            slurm.watch_job,
            watch.watch,
            watch.wait_resume,
            attribution.attribute_failure,
            actions.drain_node,
            actions.requeue_job,
            *discovery,
            *build_gpu_activities(settings.gpu),
        ],
        graceful_shutdown_timeout=timedelta(seconds=10),
    )
    log.info("worker polling %s on %s", settings.temporal.task_queue, settings.temporal.address)
    async with worker:
        if settings.watch.enabled:
            await start_cluster_watch(client, settings)
        await stop.wait()
    log.info("worker stopped")
