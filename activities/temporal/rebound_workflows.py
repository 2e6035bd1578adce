"""The Temporal side of Rebound: start Rebound's workflows and send them messages, in one place.

Everything outside the workflows that starts a JobRecovery, Fleet, ClusterWatch or Audit, or signals, updates or
queries one (the CLI, discovery, the Fleet request activity, the audit, the GPU push, the lab and the benchmarks)
goes through these typed functions, so workflow types, message names, ids, search attributes and summaries agree
by construction (the names themselves are in ``workflows.constants``). Workflows are reached by their type name,
never by their class: activities do not import workflow code (STYLE.md section 9.11).

Starts use the business-key id with ``USE_EXISTING``: starting twice, from two workers or after a retry, attaches
to the running workflow. Errors are Temporal's own (``RPCError``, ``WorkflowUpdateFailedError``, and
``TimeoutError`` where a query has a deadline): what they mean differs per caller (a CLI exit code, a retried
activity, an audit row), so each caller translates them.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from temporalio.client import Client, ScheduleActionStartWorkflow, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from workflows.constants import (
    AUDIT_WORKFLOW,
    CLUSTER,
    CLUSTER_WATCH_WORKFLOW,
    FEED_RESEND_SIGNAL,
    FEED_UPDATE_SIGNAL,
    FLEET_DECISION_QUERY,
    FLEET_WORKFLOW,
    GPU_FAULT_REPORTED_SIGNAL,
    JOB_ID,
    JOB_RECOVERY_WORKFLOW,
    NODE_GPU_FAULT_SIGNAL,
    NODE_GPU_HEALTH_WORKFLOW,
    OPERATOR_REQUEST_UPDATE,
    REQUEST_ISOLATION_SIGNAL,
    SCHEDULER_FEED_WORKFLOW,
    SHARD_FEED_WORKFLOW,
    STATUS_QUERY,
    WATCH_RETURNED_SIGNAL,
    WATCH_SHARD_WORKFLOW,
    cluster_watch_workflow_id,
    fleet_workflow_id,
    job_workflow_id,
    node_gpu_health_workflow_id,
    scheduler_feed_workflow_id,
    shard_feed_workflow_id,
    watch_shard_workflow_id,
)
from workflows.domain.audit import AuditInput, AuditResult
from workflows.domain.discovery import ClusterWatchInput
from workflows.domain.fleet import (
    FleetInput,
    FleetStatus,
    IsolationDecision,
    IsolationRequest,
    NodeGpuFault,
)
from workflows.domain.gpu import GpuEvent, NodeGpuHealthInput, NodeGpuHealthResult
from workflows.domain.operators import OperatorRequest
from workflows.domain.recovery import JobRecoveryInput, JobRecoveryStatus
from workflows.domain.scheduler_feed import FeedUpdate, SchedulerFeedInput, ShardFeedInput
from workflows.domain.watch_hub import WatchEvent, WatchShardInput
from workflows.policy.restart_strategy import in_lineage

__all__ = [
    "audit_schedule_action",
    "fleet_operator_request",
    "query_fleet_decision",
    "job_operator_request",
    "lineage_workflow_id",
    "query_fleet_status",
    "query_job_status",
    "read_node_gpu_health",
    "report_gpu_fault",
    "report_node_gpu_fault",
    "signal_watch_event",
    "signal_fleet_request",
    "start_audit",
    "start_cluster_watch",
    "start_fleet",
    "start_job_recovery",
    "start_watch_shard",
    "terminate_job_recovery",
]


def _cluster_attributes(cluster: str, *extra: SearchAttributePair[Any]) -> TypedSearchAttributes:
    return TypedSearchAttributes([*extra, SearchAttributePair(CLUSTER, cluster)])


# ----- starts ------------------------------------------------------------------------------------------------------


async def start_job_recovery(
    client: Client, inp: JobRecoveryInput, *, task_queue: str, opted_in: bool = False
) -> WorkflowHandle[Any, Any]:
    """Start the job's JobRecovery, or attach to the one already running.

    Args:
        client: A client with the pydantic data converter.
        inp: Built and validated by the caller: a payload that fails to decode would wedge the workflow task.
        task_queue: The central worker's queue.
        opted_in: Started by discovery (the job opted in), not by an operator's ``rebound watch``; shown in the UI.
    """
    how = " (opted in)" if opted_in else ""
    return await client.start_workflow(
        JOB_RECOVERY_WORKFLOW,
        inp,
        id=job_workflow_id(inp.cluster, inp.job_id),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=_cluster_attributes(inp.cluster, SearchAttributePair(JOB_ID, str(inp.job_id))),
        static_summary=f"Rebound: keep Slurm job {inp.job_id} on {inp.cluster} making progress{how}",
    )


#: How long a start that finds no namespace is retried: a Temporal server that just came up (above).
NAMESPACE_WAIT_S = 30.0


async def _start_singleton(
    client: Client, workflow_type: str, inp: Any, *, workflow_id: str, cluster: str, task_queue: str, summary: str
) -> WorkflowHandle[Any, Any]:
    """Start the one ``workflow_type`` under ``workflow_id``, or attach to the running one (which keeps its own
    input and state), tagged with ``cluster`` and shown with ``summary``.

    A worker starts these as it comes up, possibly beside a Temporal server that is coming up too: a server answers
    (even ``DescribeNamespace``) before every service has loaded its namespaces, and a start in that gap fails with
    "Namespace ... is not found" (seen on a loaded machine). So that answer is retried for ``NAMESPACE_WAIT_S``;
    after that it is a real configuration error and raised.
    """
    deadline = asyncio.get_running_loop().time() + NAMESPACE_WAIT_S
    while True:
        try:
            return await client.start_workflow(
                workflow_type,
                inp,
                id=workflow_id,
                task_queue=task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                search_attributes=_cluster_attributes(cluster),
                static_summary=summary,
            )
        except RPCError as e:
            missing = e.status is RPCStatusCode.NOT_FOUND and "namespace" in str(e).lower()
            if not missing or asyncio.get_running_loop().time() >= deadline:
                raise
        await asyncio.sleep(1.0)


async def start_cluster_watch(client: Client, inp: ClusterWatchInput, *, task_queue: str) -> WorkflowHandle[Any, Any]:
    """Start the cluster's ClusterWatch, or attach to the running one (which keeps its own input)."""
    return await _start_singleton(
        client,
        CLUSTER_WATCH_WORKFLOW,
        inp,
        workflow_id=cluster_watch_workflow_id(inp.cluster),
        cluster=inp.cluster,
        task_queue=task_queue,
        summary=f"Rebound: discover opted-in jobs on {inp.cluster} and start their recovery",
    )


async def start_watch_shard(client: Client, inp: WatchShardInput, *, task_queue: str) -> WorkflowHandle[Any, Any]:
    """Start watch shard ``inp.shard``'s WatchShard, or attach to the running one (every worker calls this)."""
    return await _start_singleton(
        client,
        WATCH_SHARD_WORKFLOW,
        inp,
        workflow_id=watch_shard_workflow_id(inp.cluster, inp.shard),
        cluster=inp.cluster,
        task_queue=task_queue,
        summary=f"Rebound: watch shard {inp.shard}/{inp.shards} of {inp.cluster} (job logs and scheduler)",
    )


async def start_scheduler_feed(client: Client, inp: SchedulerFeedInput, *, task_queue: str) -> WorkflowHandle[Any, Any]:
    """Start the cluster's SchedulerFeed, or attach to the running one (every worker calls this)."""
    return await _start_singleton(
        client,
        SCHEDULER_FEED_WORKFLOW,
        inp,
        workflow_id=scheduler_feed_workflow_id(inp.cluster),
        cluster=inp.cluster,
        task_queue=task_queue,
        summary=f"Rebound: one scheduler poll for {inp.cluster}, published to its {inp.shards} watch shards",
    )


async def publish_feed_update(client: Client, inp: ShardFeedInput, update: FeedUpdate, *, task_queue: str) -> None:
    """Signal the shard's ShardFeed mailbox one update, starting the mailbox if it is not running."""
    await client.start_workflow(
        SHARD_FEED_WORKFLOW,
        inp,
        id=shard_feed_workflow_id(inp.cluster, inp.shard),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=FEED_UPDATE_SIGNAL,
        start_signal_args=[update],
        search_attributes=_cluster_attributes(inp.cluster),
        static_summary=f"Rebound: scheduler changes for watch shard {inp.shard} of {inp.cluster}",
    )


async def request_feed_resend(client: Client, cluster: str, shard: int) -> None:
    """Ask shard ``shard``'s ShardFeed mailbox for its last digest and the changes since (a hub just started there);
    no mailbox yet (the feed has not published to the shard) is no error: its first update is a digest."""
    try:
        await client.get_workflow_handle(shard_feed_workflow_id(cluster, shard)).signal(FEED_RESEND_SIGNAL)
    except RPCError as e:
        if e.status is not RPCStatusCode.NOT_FOUND:
            raise


def _fleet_summary(cluster: str) -> str:
    return f"Rebound Fleet of {cluster}: node quarantine, breaker, approvals"


async def start_fleet(client: Client, inp: FleetInput, *, task_queue: str) -> WorkflowHandle[Any, Any]:
    """Start the cluster's Fleet, or attach to the running one (which keeps its state: mode, breaker, approvals)."""
    return await _start_singleton(
        client,
        FLEET_WORKFLOW,
        inp,
        workflow_id=fleet_workflow_id(inp.cluster),
        cluster=inp.cluster,
        task_queue=task_queue,
        summary=_fleet_summary(inp.cluster),
    )


async def signal_fleet_request(client: Client, inp: FleetInput, req: IsolationRequest, *, task_queue: str) -> str:
    """Deliver ``req`` to the cluster's Fleet, starting it with ``inp`` first if it is not running
    (signal-with-start); returns the Fleet's workflow id."""
    handle = await client.start_workflow(
        FLEET_WORKFLOW,
        inp,
        id=fleet_workflow_id(inp.cluster),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=REQUEST_ISOLATION_SIGNAL,
        start_signal_args=[req],
        search_attributes=_cluster_attributes(inp.cluster),
        static_summary=_fleet_summary(inp.cluster),
    )
    return handle.id


async def start_audit(
    client: Client, inp: AuditInput, *, workflow_id: str, task_queue: str
) -> WorkflowHandle[Any, AuditResult]:
    """Start an on-demand Audit under ``workflow_id`` (``audit_ondemand_workflow_id``); two with one id share a run."""
    span = f"last {inp.period_s / 3600:g} h" if inp.period_s is not None else f"since {inp.since}"
    return await client.start_workflow(
        AUDIT_WORKFLOW,
        inp,
        id=workflow_id,
        task_queue=task_queue,
        result_type=AuditResult,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=_cluster_attributes(inp.cluster),
        static_summary=f"Rebound: on-demand audit of {inp.cluster} ({span})",
    )


def audit_schedule_action(
    inp: AuditInput, *, schedule_id: str, task_queue: str, execution_timeout: timedelta
) -> ScheduleActionStartWorkflow:
    """What the cluster's audit Schedule starts: an Audit over ``inp`` (its runs are ``<schedule_id>-<time>``)."""
    return ScheduleActionStartWorkflow(
        AUDIT_WORKFLOW,
        inp,
        id=schedule_id,
        task_queue=task_queue,
        execution_timeout=execution_timeout,
        typed_search_attributes=_cluster_attributes(inp.cluster),
        static_summary=f"Rebound: scheduled audit of {inp.cluster}",
    )


async def read_node_gpu_health(client: Client, cluster: str, node: str, *, task_queue: str) -> NodeGpuHealthResult:
    """Run one NodeGpuHealth read of ``node`` through its agent and wait for it (about a second when it is up)."""
    result: NodeGpuHealthResult = await client.execute_workflow(
        NODE_GPU_HEALTH_WORKFLOW,
        NodeGpuHealthInput(node=node),
        id=node_gpu_health_workflow_id(cluster, node, uuid.uuid4().hex[:8]),
        task_queue=task_queue,
        result_type=NodeGpuHealthResult,
        static_summary=f"GPU health read of node {node}",
    )
    return result


# ----- JobRecovery messages --------------------------------------------------------------------------------------


async def query_job_status(
    client: Client, workflow_id: str, *, timeout_s: float, run_id: str | None = None
) -> JobRecoveryStatus:
    """A JobRecovery's ``status`` (``workflow_id`` is ``job_workflow_id``; a listing gives it with its run).

    Raises:
        TimeoutError: no answer within ``timeout_s`` (a query with no live worker waits for one).
    """
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    status: JobRecoveryStatus = await asyncio.wait_for(
        handle.query(STATUS_QUERY, result_type=JobRecoveryStatus), timeout=timeout_s
    )
    return status


async def lineage_workflow_id(client: Client, cluster: str, job_id: int, token: str, *, timeout_s: float) -> str | None:
    """The JobRecovery that follows ``job_id`` as a resubmission of its lineage (ADR 014), or None.

    ``token`` (from the job's comment) only names whom to ask: the lineage's first job. That workflow's own state
    decides (``restart_strategy.in_lineage``); a forged, copied or stale token gives None.

    Raises:
        RPCError: Temporal's answer other than "no such workflow"; TimeoutError: no answer within ``timeout_s``;
            WorkflowQueryFailedError: the workflow could not answer.
    """
    root = token.partition(".")[0]
    if not root.isdigit() or int(root) <= 0 or int(root) == job_id:
        return None
    owner = job_workflow_id(cluster, int(root))
    try:
        status = await query_job_status(client, owner, timeout_s=timeout_s)
    except RPCError as e:
        if e.status is RPCStatusCode.NOT_FOUND:
            return None
        raise
    return owner if in_lineage(status, job_id, token) else None


async def report_gpu_fault(client: Client, cluster: str, job_id: int, event: GpuEvent) -> None:
    """Tell job ``job_id``'s JobRecovery that a node agent saw ``event`` on one of its nodes."""
    await client.get_workflow_handle(job_workflow_id(cluster, job_id)).signal(GPU_FAULT_REPORTED_SIGNAL, event)


async def signal_watch_event(client: Client, workflow_id: str, event: WatchEvent) -> None:
    """Hand a watch hub's finding to the JobRecovery that subscribed (``workflow_id``: its current run)."""
    await client.get_workflow_handle(workflow_id).signal(WATCH_RETURNED_SIGNAL, event)


async def report_node_gpu_fault(client: Client, cluster: str, fault: NodeGpuFault) -> None:
    """Tell the cluster's Fleet that a node agent saw a node-level GPU fault (a suspected node is then drained)."""
    await client.get_workflow_handle(fleet_workflow_id(cluster)).signal(NODE_GPU_FAULT_SIGNAL, fault)


async def terminate_job_recovery(client: Client, cluster: str, job_id: int, reason: str) -> None:
    """End job ``job_id``'s JobRecovery now (the lab's benchmarks, once a run is measured)."""
    await client.get_workflow_handle(job_workflow_id(cluster, job_id)).terminate(reason=reason)


# ----- Fleet messages --------------------------------------------------------------------------------------------


async def query_fleet_status(client: Client, cluster: str, *, timeout_s: float | None = None) -> FleetStatus:
    """The cluster's Fleet ``status``.

    Raises:
        TimeoutError: no answer within ``timeout_s`` (when given).
    """
    query = client.get_workflow_handle(fleet_workflow_id(cluster)).query(STATUS_QUERY, result_type=FleetStatus)
    status: FleetStatus = await asyncio.wait_for(query, timeout=timeout_s)
    return status


async def query_fleet_decision(client: Client, cluster: str, request_id: str) -> IsolationDecision | None:
    """The Fleet's own record of its decision on ``request_id`` (None: none)."""
    handle = client.get_workflow_handle(fleet_workflow_id(cluster))
    decision: IsolationDecision | None = await handle.query(
        FLEET_DECISION_QUERY,
        request_id,
        result_type=IsolationDecision | None,  # type: ignore[arg-type]
    )
    return decision


async def _fleet_update(client: Client, cluster: str, update: str, arg: Any, result_type: type[Any]) -> Any:
    handle = client.get_workflow_handle(fleet_workflow_id(cluster))
    return await handle.execute_update(update, arg, result_type=result_type)


async def fleet_operator_request(client: Client, cluster: str, req: OperatorRequest) -> FleetStatus:
    """An operator's signed action on the Fleet (approve, reject, mode, breaker reset); refused unless verified."""
    status: FleetStatus = await _fleet_update(client, cluster, OPERATOR_REQUEST_UPDATE, req, FleetStatus)
    return status


async def job_operator_request(client: Client, cluster: str, job_id: int, req: OperatorRequest) -> JobRecoveryStatus:
    """An operator's signed pause or resume of job ``job_id``'s monitoring; refused unless verified."""
    handle = client.get_workflow_handle(job_workflow_id(cluster, job_id))
    status: JobRecoveryStatus = await handle.execute_update(OPERATOR_REQUEST_UPDATE, req, result_type=JobRecoveryStatus)
    return status
