"""The Fleet workflow's reads and messages, as workflow-side helpers (``workflows.fleet`` sequences them):
a fresh read of what one decision needs, a node agent's word on a signalled GPU fault, the answer to a job."""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    import workflows.policy.fleet as policy
    from activities.gpu.activities import GpuActivities
    from activities.temporal.fleet import FleetActivities
    from workflows.constants import ISOLATION_DECIDED_SIGNAL, node_task_queue
    from workflows.domain.fleet import FleetState, IsolationDecision, IsolationRequest, NodeGpuFault
    from workflows.domain.fleet_view import FleetView
    from workflows.domain.gpu import NodeHealthCheckInput, NodeHealthCheckResult
    from workflows.domain.slurm import ClusterSnapshot
    from workflows.job_recovery.evidence import read_dcgm, read_gpus
    from workflows.options import NODE_AGENT_QUICK_READ, SCHEDULER_READ
    from workflows.policy.gpu_claims import confirm_gpu_events
    from workflows.policy.gpu_merge import health_check_with_dcgm

__all__ = [
    "COMPACT_VIEW_PATCH",
    "DCGM_HEALTH_CHECK_PATCH",
    "SETTLE_PATCH",
    "agent_confirms",
    "health_check",
    "read_view",
    "reply",
    "settled_view",
]

#: The Fleet reads ``fleet_view`` (the nodes it names, counts for the rest) instead of the whole snapshot, which
#: passes Temporal's 2 MB payload limit past about 3,000 jobs. Histories from before read ``fleet_cluster_view``.
COMPACT_VIEW_PATCH = "12-fleet-compact-view"
#: A request for a COMPLETING job waits for the job's whole node list before it is checked (issue 13).
SETTLE_PATCH = "13-fleet-settle-completing-job"
#: The health check reads the node's DCGM exporter beside the agent's NVML check (issue 14).
DCGM_HEALTH_CHECK_PATCH = "14-fleet-health-check-dcgm"
SETTLE_EVERY_S = 2.0
SETTLE_READS = 15


async def read_view(
    state: FleetState, req: IsolationRequest | None = None, nodes: tuple[str, ...] = ()
) -> FleetView | ClusterSnapshot:
    """A fresh read of what a decision about ``req`` (or the recorded nodes, and ``nodes``) needs."""
    if workflow.patched(COMPACT_VIEW_PATCH):
        compact: FleetView = await workflow.execute_activity_method(
            FleetActivities.view,
            policy.view_input(state, req, nodes),
            summary="Read the nodes this decision names (fresh)",
            **SCHEDULER_READ,
        )
        return compact
    view: ClusterSnapshot = await workflow.execute_activity_method(
        FleetActivities.cluster_view, summary="Read every node and job (fresh)", **SCHEDULER_READ
    )
    return view


async def settled_view(state: FleetState, req: IsolationRequest, view: FleetView) -> FleetView:
    """The view once the request's job lists its whole allocation: Slurm lists a COMPLETING job on the nodes still
    completing only, and a node that finished first would read as "not the job's". Re-read every
    ``SETTLE_EVERY_S`` while the job completes and names fewer nodes than the request, at most ``SETTLE_READS``
    times; after that the listing is believed (a node it does not show is dropped: do less)."""
    for _ in range(SETTLE_READS):
        if not policy.allocation_partial(view, req):
            break
        await workflow.sleep(SETTLE_EVERY_S, summary=f"job {req.job_id} is completing: wait for its node list")
        view = await workflow.execute_activity_method(
            FleetActivities.view, policy.view_input(state, req), summary="Read the job again", **SCHEDULER_READ
        )
    return view


async def agent_confirms(fault: NodeGpuFault) -> bool:
    """Whether the node's own agent lists the signalled fault in a fresh read (a signal is only a claim)."""
    kept, notes = confirm_gpu_events((fault.event,), {fault.node: await read_gpus(fault.node)})
    for note in notes:
        workflow.logger.warning("GPU fault on %s not escalated: %s", fault.node, note)
    return bool(kept)


async def health_check(node: str, drained_at: datetime | None) -> tuple[bool, str]:
    """The node agent's verdict on a drained node (healthy, detail); an agent that does not answer fails it. Where
    the node has a DCGM exporter, its reading is merged in: a GPU either source fails, or an exporter that cannot be
    read, fails the check (``workflows.policy.gpu_merge.health_check_with_dcgm``)."""
    nvml = None
    try:
        result: NodeHealthCheckResult = await workflow.execute_activity_method(
            GpuActivities.health_check,
            NodeHealthCheckInput(since=drained_at),
            task_queue=node_task_queue(node),
            summary=f"Health check of drained node {node}",
            **NODE_AGENT_QUICK_READ,
        )
        outcome, nvml = (result.healthy, result.detail), result.verdict
    except ActivityError as e:
        outcome = (False, f"node agent did not answer: {e.cause or e}")
    if not workflow.patched(DCGM_HEALTH_CHECK_PATCH):
        return outcome
    return health_check_with_dcgm(node, nvml, outcome, await read_dcgm((node,)))


async def reply(req: IsolationRequest, decision: IsolationDecision) -> None:
    """Signal the decision to the JobRecovery that asked (none for the Fleet's own escalations)."""
    if not req.reply_to:
        return
    handle = workflow.get_external_workflow_handle(req.reply_to)
    try:
        await handle.signal(ISOLATION_DECIDED_SIGNAL, decision)
    except (ApplicationError, ActivityError) as e:  # the JobRecovery ended meanwhile: nobody to tell
        workflow.logger.info("decision %s not delivered to %s: %s", req.request_id, req.reply_to, e)
