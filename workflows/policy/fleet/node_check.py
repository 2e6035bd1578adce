"""The Fleet's side of the active node check (ADR 018): whether a drained node gets one, and what its result does
to the node's record (pure).

The check runs only where its pass could return the node (the node agent's GPU read passed, not a lemon,
``return_healthy_nodes`` on). Its outcome moves the record: passed -> HEALTHY (the release ends the
reservation and the node is in service); failed -> HELD, drained again with a reason naming the check's job;
inconclusive -> DRAINED again with Rebound's own reason, checked again after ``health_check_after_s``; not
ours -> someone else's drain (an NHC ``HealthCheckProgram``, an administrator) is evidence, never overwritten.
"""

from __future__ import annotations

from datetime import datetime

from workflows.domain.fleet import FleetPolicy, FleetState, NodeLifecycle, NodeRecord
from workflows.domain.names import DRAIN_REASON_PREFIX
from workflows.domain.node_check import CheckOutcome, NodeCheckReleaseResult, NodeCheckRunResult
from workflows.domain.progress import aware
from workflows.policy.fleet.lifecycle import MAX_CHECKS_PER_NODE, is_lemon

__all__ = ["after_node_check", "after_release", "check_token", "held_reason", "node_check_wanted"]

_MAX_REASON = 200


def node_check_wanted(record: NodeRecord, policy: FleetPolicy, now: datetime) -> bool:
    """Run the check job: it is on, and a pass would return the node (a lemon, or a Fleet that returns no node,
    holds it whatever the check says)."""
    return policy.node_check.enabled and policy.return_healthy_nodes and not is_lemon(record, policy, now)


def check_token(fleet_id: str, run_id: str, node: str, record: NodeRecord) -> str:
    """This check's id: the same on every retry of it (its job is adopted), new for the node's next check and for
    another Fleet run (a Fleet started afresh forgets its checks: Slurm still lists their jobs for ``MinJobAge``)."""
    return f"{fleet_id}/{run_id}/check-{node}-{len(record.checks)}"


def held_reason(result: NodeCheckRunResult) -> str:
    """Slurm's reason for a node that failed its check: Rebound's, naming the check's job (the evidence)."""
    text = f"{DRAIN_REASON_PREFIX} held for repair: node check job {result.job_id} failed: {result.detail}"
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


def after_node_check(
    state: FleetState, node: str, result: NodeCheckRunResult, now: datetime
) -> tuple[FleetState, str, bool]:
    """Record the check; returns the state, the drain reason the release must leave on the node ("" to return it
    to service) and whether a release is needed at all (something was changed in Slurm)."""
    record = state.nodes.get(node)
    if record is None:
        return state, "", bool(result.reservation)
    checks = (*record.checks, f"{aware(now).isoformat()} {result.outcome.value}: {result.detail}")
    update: dict[str, object] = {"checks": checks[-MAX_CHECKS_PER_NODE:], "since": now}
    drain = ""
    if result.outcome is CheckOutcome.PASSED:
        update |= {"state": NodeLifecycle.HEALTHY, "reason": f"returned to service: {result.detail}"}
        update["returned_at"] = now
    elif result.outcome is CheckOutcome.FAILED:
        drain = held_reason(result)
        update |= {"state": NodeLifecycle.HELD, "reason": f"failed node check: {result.detail}", "drain_reason": drain}
    elif result.outcome is CheckOutcome.INCONCLUSIVE:
        drain = record.drain_reason
        # Checked again after health_check_after_s from now, not at once in a loop.
        update |= {"state": NodeLifecycle.DRAINED, "reason": f"check inconclusive: {result.detail}", "drained_at": now}
    elif result.current_reason:
        update |= {"state": NodeLifecycle.EXTERNAL, "reason": f"drained by someone else: {result.current_reason!r}"}
    else:
        update |= {"state": NodeLifecycle.HEALTHY, "reason": f"resumed by someone else ({result.detail})"}
        update["returned_at"] = now
    nodes = {**state.nodes, node: record.model_copy(update=update)}
    return state.model_copy(update={"nodes": nodes}), drain, bool(result.reservation or drain)


def after_release(
    state: FleetState, node: str, drain: str, release: NodeCheckReleaseResult, now: datetime
) -> FleetState:
    """A release that found someone else's drain on the node (an NHC drain during the check) makes it theirs."""
    record = state.nodes.get(node)
    if record is None or not release.current_reason or release.current_reason == drain:
        return state
    update = {
        "state": NodeLifecycle.EXTERNAL,
        "since": now,
        "reason": f"drained by someone else during its check: {release.current_reason!r}",
    }
    return state.model_copy(update={"nodes": {**state.nodes, node: record.model_copy(update=update)}})
