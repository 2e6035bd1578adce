"""The central Rebound worker: workflows plus cluster-level activities on the main task queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from temporalio.worker import Worker

from activities.checkpoints.activities import CheckpointActivities
from activities.logs.attribution import AttributionActivities
from activities.logs.watch import WatchActivities
from activities.slurm.actions import SlurmActionActivities
from activities.slurm.activities import SlurmActivities
from activities.slurm.resubmission import SubmissionActivities
from activities.webhooks.notify import NotifyActivities
from workers.audit_schedule import build_audit_activities, start_audit_schedule
from workers.client import connect
from workers.discovery import build_discovery_activities, start_cluster_watch
from workers.fleet import build_fleet_activities, start_fleet
from workers.gc_tuning import tune_gc
from workers.lifecycle import stop_on_signals
from workers.log_policy import build_log_policy
from workers.settings import Settings
from workers.telemetry import Telemetry, install_telemetry
from workers.watch_hub import build_scheduler_feed, build_watch_shards, start_watch_shards, watch_workers
from workers.wiring import build_gpu_activities, build_operator_verifier, build_scheduler, build_snapshot_cache
from workflows.audit import AuditWorkflow
from workflows.cluster_watch import ClusterWatchWorkflow
from workflows.fleet import FleetWorkflow
from workflows.job_recovery import JobRecoveryWorkflow
from workflows.node_gpu_health import NodeGpuHealthWorkflow
from workflows.scheduler_feed import SchedulerFeedWorkflow, ShardFeedWorkflow
from workflows.watch_shard import WatchShardWorkflow

log = logging.getLogger("rebound.worker")

WORKFLOWS = [
    JobRecoveryWorkflow,
    NodeGpuHealthWorkflow,
    ClusterWatchWorkflow,
    AuditWorkflow,
    FleetWorkflow,
    WatchShardWorkflow,
    SchedulerFeedWorkflow,
    ShardFeedWorkflow,
]


async def run_worker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT), then shut down gracefully.

    A graceful shutdown matters: after a SIGKILL the next worker waits ~10 s per cached workflow.
    """
    build_log_policy(settings)  # refuses to start without watch.log_roots, before connecting to anything
    stop = stop or stop_on_signals()
    telemetry = install_telemetry(settings, role="worker")
    try:
        await _serve(settings, stop, telemetry)
    finally:
        telemetry.shutdown()
    log.info("worker stopped")


async def _serve(settings: Settings, stop: asyncio.Event, telemetry: Telemetry) -> None:
    client = await connect(
        settings.temporal,
        identity=f"rebound-worker@{settings.cluster_name}",
        runtime=telemetry.runtime,
        interceptors=telemetry.interceptors,
    )
    scheduler = build_scheduler(settings.slurm)
    # Opt-in discovery. `snapshots` is the worker's one shared snapshot cache: every watcher must use this object.
    snapshots = build_snapshot_cache(scheduler, settings.watch)
    slurm = SlurmActivities(scheduler, snapshots)
    discovery = build_discovery_activities(client, snapshots, settings)
    logs = build_log_policy(settings)  # watch.log_roots (required), watch.log_require_owner, logs.*
    checkpoints = CheckpointActivities(logs)  # a job's ckpt= directory is bounded like its log files
    # The resume check looks for a new complete checkpoint of a job that prints no step line (same policy).
    watch = WatchActivities(snapshots, logs, checkpoints=checkpoints.scan)
    attribution = AttributionActivities(scheduler, logs)
    actions = SlurmActionActivities(scheduler)
    submissions = SubmissionActivities(scheduler, settings.state_dir)
    notify = NotifyActivities(
        settings.notify.webhook_url,
        timeout_s=settings.notify.timeout_s,
        max_attempts=settings.notify.max_attempts,
        kinds=settings.notify.kinds,
        ui_base_url=settings.notify.ui_base_url,
    )
    worker = Worker(
        client,
        task_queue=settings.temporal.task_queue,
        workflows=WORKFLOWS,
        activities=[
            slurm.observe_job,
            watch.anchor,
            watch.watch,
            watch.wait_resume,
            attribution.attribute_failure,
            actions.drain_node,
            actions.requeue_job,
            submissions.capture_submission,
            submissions.resubmit_job,
            notify.notify_webhook,
            checkpoints.checkpoint_scan,
            checkpoints.checkpoint_quarantine,
            *discovery,
            *build_gpu_activities(settings.gpu),
            *build_audit_activities(client, settings),
            *build_fleet_activities(client, scheduler, settings),
            build_operator_verifier(settings),
        ],
        max_concurrent_activities=settings.temporal.max_concurrent_activities,
        max_concurrent_workflow_tasks=settings.temporal.max_concurrent_workflow_tasks,
        max_cached_workflows=settings.temporal.max_cached_workflows,
        graceful_shutdown_timeout=timedelta(seconds=10),
    )
    # Watching and resume checks on their own queues and slots: an action never waits behind a watch (ADR 015).
    shared = settings.watch.scheduler_feed == "shared"
    shards = build_watch_shards(
        client,
        snapshots,
        logs,
        shared_feed=scheduler if shared else None,
        full_poll_every_s=settings.watch.full_poll_every_s,
    )
    feed = build_scheduler_feed(client, snapshots, task_queue=settings.temporal.task_queue) if shared else None
    others = watch_workers(client, settings, shards, watch, feed)
    tune_gc()  # everything above lives as long as the process (workers.gc_tuning)
    log.info("worker polling %s on %s", settings.temporal.task_queue, settings.temporal.address)
    async with contextlib.AsyncExitStack() as workers:
        for w in (worker, *others):
            await workers.enter_async_context(w)
        await start_fleet(client, settings)
        await start_watch_shards(client, settings)
        if settings.watch.enabled:
            await start_cluster_watch(client, settings)
        await start_audit_schedule(client, settings)
        await stop.wait()
