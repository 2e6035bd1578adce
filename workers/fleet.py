"""Wiring of the cluster's Fleet workflow: its activities on the central worker, and its start at worker start."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from temporalio.client import Client

from activities.slurm.port import SchedulerPort
from activities.temporal import rebound_workflows
from activities.temporal.fleet import FleetActivities
from workers.settings import Settings
from workflows.domain.fleet import FleetInput

__all__ = ["build_fleet_activities", "start_fleet"]

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
    return [acts.request_isolation, acts.view, acts.cluster_view, acts.resume_node, acts.confirm_decision]


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
