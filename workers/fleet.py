"""Wiring of the cluster's Fleet workflow: its activities on the central worker, and its start at worker start."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from temporalio.client import Client

from activities.slurm.cli import SlurmCliScheduler
from activities.slurm.maintenance import SlurmCliMaintenance
from activities.slurm.node_check import NodeCheckActivities
from activities.slurm.port import SchedulerPort
from activities.temporal import rebound_workflows
from activities.temporal.fleet import FleetActivities
from workers.settings import Settings
from workflows.domain.fleet import FleetInput

__all__ = ["build_fleet_activities", "build_node_check_activities", "start_fleet"]

log = logging.getLogger("rebound.fleet")


def build_fleet_activities(client: Client, scheduler: SchedulerPort, settings: Settings) -> list[Callable[..., Any]]:
    """``fleet_request_isolation``, ``fleet_view`` (and ``fleet_cluster_view`` for older Fleets), ``fleet_resume_node``,
    ``fleet_confirm_decision``
    for ``Worker(activities=...)``."""
    acts = FleetActivities(
        client,
        scheduler,
        cluster=settings.cluster_name,
        task_queue=settings.temporal.task_queue,
        policy=settings.fleet,
    )
    return [
        acts.request_isolation, acts.view, acts.cluster_view, acts.resume_node, acts.confirm_decision,
        *build_node_check_activities(scheduler, settings),
    ]  # fmt: skip


def build_node_check_activities(scheduler: SchedulerPort, settings: Settings) -> list[Callable[..., Any]]:
    """``slurm_node_check_run`` and ``slurm_node_check_release`` (ADR 018): reservations and the check job go
    through Slurm's commands (22.05's REST API has no reservation writes), with the scheduler's own settings."""
    slurm = settings.slurm
    cli = SlurmCliScheduler(env=slurm.command_env(), bin_dir=slurm.bin_dir, timeout_s=slurm.command_timeout_s)
    output_dir = settings.node_check.output_dir or settings.state_dir / "node-checks"
    output_dir.mkdir(parents=True, exist_ok=True)
    acts = NodeCheckActivities(
        scheduler, SlurmCliMaintenance(cli), command=settings.node_check.command, output_dir=output_dir.resolve()
    )
    return [acts.run, acts.release]


async def start_fleet(client: Client, settings: Settings) -> None:
    """Start the cluster's Fleet, or attach to the running one (which keeps its state: mode, breaker, approvals).

    Its policy is the one it was started with; a changed ``fleet.*`` setting takes effect when the Fleet is next
    started (``temporal workflow terminate`` it, or wait for its continue-as-new to pick up the same input).
    """
    handle = await rebound_workflows.start_fleet(
        client,
        FleetInput(cluster=settings.cluster_name, policy=settings.fleet),
        task_queue=settings.temporal.task_queue,
    )
    log.info("Fleet %s running (run %s)", handle.id, handle.result_run_id)
