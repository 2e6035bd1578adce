"""JobRecovery's exchange with its cluster's Fleet, the single writer of node quarantine.

The job asks (an activity that signals the Fleet), the Fleet answers with the ``isolation_decided`` signal; the
workflow keeps the answers in its state and these helpers wait for the one they need.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.temporal.fleet import FleetActivities
    from workflows.constants import isolation_request_id
    from workflows.domain.fleet import IsolationDecision, IsolationRequest
    from workflows.domain.incident import ActionRung, Attribution, Incident
    from workflows.options import FLEET_REQUEST
    from workflows.policy.action_ladder import describe_evidence
    from workflows.policy.recovery import fleet_silent

__all__ = ["Placement", "await_decision", "isolation_request", "send_request"]


class Placement(NamedTuple):
    """What the Fleet weighs before excluding a suspect: the nodes the job needs, the ones it already avoids."""

    node_count: int
    excluded: tuple[str, ...]
    """Rebound's standing exclusion of the job."""
    owner_excluded: tuple[str, ...] = ()
    """The job owner's own exclusion."""
    gpus_per_node: int | None = None
    """GPUs the job needs on each node (None: unknown)."""
    cpus_per_node: int = 0
    """CPUs the job needs on each node (0: unknown)."""


def isolation_request(
    *,
    workflow_id: str,
    job_id: int,
    partition: str,
    incident: Incident,
    attribution: Attribution,
    restart_number: int,
    now: datetime,
    placement: Placement | None = None,
    user: str = "",
) -> IsolationRequest:
    """The request for one incident: drain the implicated nodes (or, on the ladder's ``exclude`` rung, only keep
    them out of the job's next placement and record a suspicion), restart the job (its ``restart_number``-th).

    ``placement``: what the job needs and already avoids; None builds the request as it was before the ladder
    (every request a drain request: what replayed histories sent). ``user``: the job's owner from the scheduler's
    record of the job (``SlurmJob.user``, which Slurm authenticated, never from the job's output): the Fleet drains
    a node implicated again only when jobs of different users implicate it; empty: unknown.
    """
    ladder: dict[str, Any] = {}
    if placement is not None:
        ladder = {
            "rung": attribution.action or ActionRung.DRAIN,
            "evidence": describe_evidence(attribution.basis),
            "node_count": placement.node_count,
            "excluded_before": placement.excluded,
            "owner_excluded": placement.owner_excluded,
            "gpus_per_node": placement.gpus_per_node,
            "cpus_per_node": placement.cpus_per_node,
        }
    return IsolationRequest(
        request_id=isolation_request_id(workflow_id, incident.number),
        reply_to=workflow_id,
        job_id=job_id,
        partition=partition,
        incident=incident.id,
        cause=attribution.cause,
        failure_class=attribution.failure_class.value,
        confidence=attribution.confidence,
        nodes=attribution.implicated_nodes,
        restart_number=restart_number,
        requested_at=now,
        user=user,
        **ladder,
    )


async def send_request(req: IsolationRequest) -> None:
    """Hand the request to the Fleet (it answers by signal, possibly after an operator's approval)."""
    await workflow.execute_activity_method(
        FleetActivities.request_isolation,
        req,
        summary=f"Ask the Fleet: {req.cause} on {','.join(req.nodes) or 'no node'}",
        **FLEET_REQUEST,
    )


async def await_decision(
    req: IsolationRequest, answer: Callable[[], IsolationDecision | None], *, timeout_s: float, number: int
) -> IsolationDecision:
    """The Fleet's answer to ``req`` (``answer`` reads it from the workflow's state); none in time: observe mode."""
    try:
        await workflow.wait_condition(
            lambda: answer() is not None,
            timeout=timeout_s,
            timeout_summary=f"the Fleet's answer to incident {number} (may wait for an operator)",
        )
    except TimeoutError:
        return fleet_silent(req.request_id, timeout_s)
    decision = answer()
    return decision if decision is not None else fleet_silent(req.request_id, timeout_s)  # None: not after the wait
