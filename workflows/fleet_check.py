"""The Fleet's health checks of the nodes it drained, as workflow-side helpers (``workflows.fleet`` calls
``run_health_checks`` each round): the node agent's GPU read, then, behind ``NODE_CHECK_PATCH``, the check job in
a maintenance reservation (ADR 018), then the node returned to service or held for repair.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import workflows.policy.fleet as policy
    from activities.slurm.node_check import NodeCheckActivities
    from activities.temporal.fleet import FleetActivities, ResumeNodeInput
    from workflows import fleet_io
    from workflows.domain.errors import FailureKind
    from workflows.domain.fleet import FleetPolicy, FleetState, NodeLifecycle, NodeRecord
    from workflows.domain.fleet_view import FleetView
    from workflows.domain.node_check import (
        CheckOutcome,
        NodeCheckReleaseInput,
        NodeCheckReleaseResult,
        NodeCheckRunInput,
        NodeCheckRunResult,
        reservation_name,
    )
    from workflows.domain.slurm import ClusterSnapshot
    from workflows.options import CLUSTER_ACTION
    from workflows.policy.fleet.node_check import after_node_check, after_release, check_token, node_check_wanted

__all__ = ["NODE_CHECK_PATCH", "run_health_checks"]

#: A drained node whose GPU read passed gets the check job before it is resumed (issue 14); histories from
#: before resumed it on the GPU read alone.
NODE_CHECK_PATCH = "14-fleet-node-check-job"

_PERMANENT = [k.value for k in FailureKind if not k.retryable]
#: The check itself: bounded by the policy's timeout (added per call), heartbeating every poll, retried a few
#: times (each retry adopts the job the last one submitted).
_NODE_CHECK: dict[str, Any] = {
    "heartbeat_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=2),
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=3,
        non_retryable_error_types=_PERMANENT,
    ),
}

View = FleetView | ClusterSnapshot


async def run_health_checks(
    get: Callable[[], FleetState],
    put: Callable[[FleetState], None],
    fleet_policy: FleetPolicy,
    read_view: Callable[[], Awaitable[View]],
) -> None:
    """Check every node due (``policy.health_checks_due``), oldest first. The state is read again after every
    activity (``get``) and written at once (``put``): operators' updates handled meanwhile are kept, and a query
    shows a node CHECKING while its check runs."""
    for node in policy.health_checks_due(get(), fleet_policy, workflow.now()):
        record = get().nodes[node]
        _put_node(get, put, record.model_copy(update={"state": NodeLifecycle.CHECKING}))
        healthy, detail = await fleet_io.health_check(node, record.drained_at)
        if healthy and node_check_wanted(record, fleet_policy, workflow.now()) and workflow.patched(NODE_CHECK_PATCH):
            await _node_check(get, put, node, record, fleet_policy)
            continue
        view = await read_view()
        state, resume = policy.after_health_check(get(), node, healthy, detail, fleet_policy, workflow.now(), view)
        put(state)
        if resume:
            done = await workflow.execute_activity_method(
                FleetActivities.resume_node,
                ResumeNodeInput(node=node, expected_reason=record.drain_reason),
                summary=f"Return {node} to service: {detail[:60]}",
                **CLUSTER_ACTION,
            )
            if not done.resumed:
                view = await read_view()
                put(policy.sync_with_view(get(), view, workflow.now()))


def _put_node(get: Callable[[], FleetState], put: Callable[[FleetState], None], record: NodeRecord) -> None:
    state = get()
    put(state.model_copy(update={"nodes": {**state.nodes, record.node: record}}))


async def _node_check(
    get: Callable[[], FleetState],
    put: Callable[[FleetState], None],
    node: str,
    record: NodeRecord,
    fleet_policy: FleetPolicy,
) -> None:
    """The check job on ``node`` in its reservation, then the release the result calls for."""
    check = fleet_policy.node_check
    run = NodeCheckRunInput(
        node=node,
        drain_reason=record.drain_reason,
        token=check_token(workflow.info().workflow_id, workflow.info().run_id, node, record),
        timeout_s=check.timeout_s,
        ranks=check.ranks,
        reservation_minutes=check.reservation_minutes,
    )
    try:
        result: NodeCheckRunResult = await workflow.execute_activity_method(
            NodeCheckActivities.run,
            run,
            summary=f"Check job on drained node {node} (reservation {reservation_name(node)})",
            start_to_close_timeout=timedelta(seconds=check.timeout_s + 60),
            **_NODE_CHECK,
        )
    except ActivityError as e:
        # The node may be resumed inside its reservation by now: the release drains it again with our reason.
        result = NodeCheckRunResult(
            node=node,
            outcome=CheckOutcome.INCONCLUSIVE,
            detail=f"the check could not run: {e.cause or e}"[:240],
            reservation=reservation_name(node),
        )
    state, drain, release = after_node_check(get(), node, result, workflow.now())
    put(state)
    workflow.logger.info("node check of %s: %s (%s)", node, result.outcome.value, result.detail)
    if not release:
        return
    try:
        done: NodeCheckReleaseResult = await workflow.execute_activity_method(
            NodeCheckActivities.release,
            NodeCheckReleaseInput(node=node, drain_reason=drain, reservation=reservation_name(node)),
            summary=f"{'Hold' if drain else 'Release'} {node} after its check ({result.outcome.value})",
            **CLUSTER_ACTION,
        )
    except ActivityError as e:
        # The reservation stands (nothing but a check lands on the node): an operator finishes it (runbook).
        now = workflow.now()
        stuck = (
            get()
            .nodes[node]
            .model_copy(
                update={
                    "state": NodeLifecycle.HELD,
                    "since": now,
                    "reason": f"release after its check failed ({e.cause or e}); reservation {reservation_name(node)} "
                    "left: see docs/operations.md",
                }
            )
        )
        _put_node(get, put, stuck)
        return
    put(after_release(get(), node, drain, done, workflow.now()))
