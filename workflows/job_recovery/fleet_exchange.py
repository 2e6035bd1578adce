"""JobRecovery's exchange with its cluster's Fleet, the single writer of node quarantine.

The job asks (an activity that signals the Fleet), the Fleet answers with the ``isolation_decided`` signal; the
workflow keeps the answers in its state and these helpers wait for the one they need.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
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

__all__ = ["CONFIRM_DECISION_PATCH", "Placement", "await_decision", "isolation_request", "send_request"]

#: Every signalled decision is confirmed against the Fleet's own record before the job acts on it (issue 13);
#: histories from before acted on the signal.
CONFIRM_DECISION_PATCH = "13-confirm-fleet-decision"


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
    req: IsolationRequest,
    answer: Callable[[], IsolationDecision | None],
    *,
    timeout_s: float,
    number: int,
    confirmed: Callable[[IsolationDecision | None, IsolationDecision], None] | None = None,
) -> IsolationDecision:
    """The Fleet's answer to ``req`` (``answer`` reads it from the workflow's state); none in time: observe mode.

    With ``confirmed`` (patch ``CONFIRM_DECISION_PATCH``), each signalled answer is confirmed against the Fleet's
    own record (a query): anyone who can reach Temporal can signal ``isolation_decided``. ``confirmed(record,
    signalled)`` stores the Fleet's record in place of the signal (None: the Fleet made no such decision, and the
    signal is dropped); the wait goes on until a confirmed answer or the timeout.
    """
    deadline = workflow.now() + timedelta(seconds=timeout_s)
    while True:
        left = (deadline - workflow.now()).total_seconds()
        try:
            await workflow.wait_condition(
                lambda: answer() is not None,
                timeout=max(left, 0.001),
                timeout_summary=f"the Fleet's answer to incident {number} (may wait for an operator)",
            )
        except TimeoutError:
            return fleet_silent(req.request_id, timeout_s)
        signalled = answer()
        if signalled is None:  # not after the wait
            return fleet_silent(req.request_id, timeout_s)
        if confirmed is None or not workflow.patched(CONFIRM_DECISION_PATCH):
            return signalled
        record: IsolationDecision | None = await workflow.execute_activity_method(
            FleetActivities.confirm_decision,
            req.request_id,
            summary=f"Confirm the Fleet's answer to incident {number}",
            **FLEET_REQUEST,
        )
        confirmed(record, signalled)
        if record is not None:
            return record
        # A forged answer may have come before the request was ever sent (its id is predictable): ask (again; the
        # Fleet answers a repeated request id with the decision it already made).
        await send_request(req)
