"""Wiring of the cluster's Fleet workflow: its activities on the central worker, and its start at worker start."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy

from activities.fleet import FleetActivities
from activities.slurm.port import SchedulerPort
from workers.settings import Settings
from workflows.constants import CLUSTER, fleet_workflow_id
from workflows.domain.fleet import FleetInput
from workflows.fleet import FleetWorkflow

__all__ = ["build_fleet_activities", "start_fleet"]

log = logging.getLogger("rebound.fleet")


def build_fleet_activities(client: Client, scheduler: SchedulerPort, settings: Settings) -> list[Callable[..., Any]]:
    """``fleet_request_isolation``, ``fleet_cluster_view``, ``fleet_resume_node`` for ``Worker(activities=...)``."""
    acts = FleetActivities(
        client,
        scheduler,
        cluster=settings.cluster_name,
        task_queue=settings.temporal.task_queue,
        policy=settings.fleet,
    )
    return [acts.request_isolation, acts.cluster_view, acts.resume_node]


async def start_fleet(client: Client, settings: Settings) -> None:
    """Start the cluster's Fleet, or attach to the running one (which keeps its state: mode, breaker, approvals).

    Its policy is the one it was started with; a changed ``fleet.*`` setting takes effect when the Fleet is next
    started (``temporal workflow terminate`` it, or wait for its continue-as-new to pick up the same input).
    """
    handle = await client.start_workflow(
        FleetWorkflow.run,
        FleetInput(cluster=settings.cluster_name, policy=settings.fleet),
        id=fleet_workflow_id(settings.cluster_name),
        task_queue=settings.temporal.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=TypedSearchAttributes([SearchAttributePair(CLUSTER, settings.cluster_name)]),
        static_summary=f"Rebound Fleet of {settings.cluster_name}: node quarantine, breaker, approvals",
    )
    log.info("Fleet %s running (run %s)", handle.id, handle.result_run_id)
