"""The central Rebound worker: workflows plus cluster-level activities on the main task queue."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from temporalio.worker import Worker

from activities.slurm.activities import SlurmActivities
from workers.client import connect
from workers.lifecycle import stop_on_signals
from workers.settings import Settings
from workers.wiring import build_scheduler
from workflows.job_recovery import JobRecoveryWorkflow
from workflows.node_gpu_health import NodeGpuHealthWorkflow

log = logging.getLogger("rebound.worker")

WORKFLOWS = [JobRecoveryWorkflow, NodeGpuHealthWorkflow]


async def run_worker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT), then shut down gracefully.

    A graceful shutdown matters: after a SIGKILL the next worker waits ~10 s per cached workflow.
    """
    stop = stop or stop_on_signals()
    client = await connect(settings.temporal, identity=f"rebound-worker@{settings.cluster_name}")
    slurm = SlurmActivities(build_scheduler(settings.slurm))
    worker = Worker(
        client,
        task_queue=settings.temporal.task_queue,
        workflows=WORKFLOWS,
        activities=[slurm.observe_job, slurm.watch_job],
        graceful_shutdown_timeout=timedelta(seconds=10),
    )
    log.info("worker polling %s on %s", settings.temporal.task_queue, settings.temporal.address)
    async with worker:
        await stop.wait()
    log.info("worker stopped")
