"""Names that must agree between workers, workflows, the CLI and the lab.

Workflow types, their signal, update and query names, task queues, workflow ids, search attributes, and (from
``workflows.domain.names``, where domain and policy code reach them) the drain reason and the isolation request id.
A workflow declares its messages with these names (``@workflow.signal(name=...)``), and everything outside the
workflows reaches it by them: activities never import workflow classes (STYLE.md section 9.11).
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

from workflows.domain.names import (
    DRAIN_REASON_PREFIX,
    drain_reason,
    incident_id,
    incident_number_of_request,
    is_rebound_drain,
    isolation_request_id,
    job_drain_prefix,
)

__all__ = [
    "ALL_SEARCH_ATTRIBUTES",
    "ANSWER_APPROVAL_UPDATE",
    "AUDIT_WORKFLOW",
    "CAUSE",
    "CLUSTER",
    "CLUSTER_WATCH_WORKFLOW",
    "DEFAULT_TASK_QUEUE",
    "DRAIN_REASON_PREFIX",
    "FLEET_WORKFLOW",
    "GPU_FAULT_REPORTED_SIGNAL",
    "NODE_GPU_FAULT_SIGNAL",
    "IMPLICATED_NODES",
    "ISOLATION_DECIDED_SIGNAL",
    "JOB_ID",
    "JOB_RECOVERY_WORKFLOW",
    "NODE_GPU_HEALTH_WORKFLOW",
    "WATCH_RETURNED_SIGNAL",
    "WATCH_SHARD_WORKFLOW",
    "SCHEDULER_FEED_WORKFLOW",
    "scheduler_feed_workflow_id",
    "shard_feed_workflow_id",
    "SHARD_FEED_WORKFLOW",
    "FEED_UPDATE_SIGNAL",
    "FEED_RESEND_SIGNAL",
    "WATCH_FEED_APPLY_ACTIVITY",
    "DEFAULT_WATCH_TASK_QUEUE",
    "DEFAULT_SHARD_QUEUE_PREFIX",
    "DEFAULT_RESUME_TASK_QUEUE",
    "watch_shard_workflow_id",
    "NODE_TASK_QUEUE_PREFIX",
    "PAUSE_UPDATE",
    "PENDING_APPROVAL",
    "RECOVERY_STATE",
    "REQUEST_ISOLATION_SIGNAL",
    "RESET_BREAKER_UPDATE",
    "OPERATOR_REQUEST_UPDATE",
    "FLEET_DECISION_QUERY",
    "RESTART_COUNT",
    "RESUME_UPDATE",
    "SET_MODE_UPDATE",
    "STATUS_QUERY",
    "audit_ondemand_workflow_id",
    "audit_schedule_id",
    "cluster_watch_workflow_id",
    "drain_reason",
    "fleet_workflow_id",
    "incident_id",
    "incident_number_of_request",
    "is_rebound_drain",
    "isolation_request_id",
    "job_drain_prefix",
    "job_workflow_id",
    "node_gpu_health_workflow_id",
    "node_task_queue",
]

# ----- workflow types ------------------------------------------------------------------------------------------
#: One monitored job's recovery loop (``workflows.job_recovery``).
JOB_RECOVERY_WORKFLOW = "JobRecovery"
#: The cluster's single writer of node quarantine (``workflows.fleet``).
FLEET_WORKFLOW = "Fleet"
#: Discovers opted-in jobs and starts their JobRecovery (``workflows.cluster_watch``).
CLUSTER_WATCH_WORKFLOW = "ClusterWatch"
#: A report over past recoveries and the Fleet (``workflows.audit``), on a Schedule or on demand.
AUDIT_WORKFLOW = "Audit"
#: One node's GPU health check (``workflows.node_gpu_health``).
NODE_GPU_HEALTH_WORKFLOW = "NodeGpuHealth"
#: One watch shard: keeps its hub's ``watch_shard`` activity running on some worker (``workflows.watch_shard``).
WATCH_SHARD_WORKFLOW = "WatchShard"
#: The cluster's one scheduler poll, published per shard (``workflows.scheduler_feed``).
SCHEDULER_FEED_WORKFLOW = "SchedulerFeed"
#: One shard's feed mailbox: hands the feed's updates to the shard's hub (``workflows.scheduler_feed``).
SHARD_FEED_WORKFLOW = "ShardFeed"

# ----- messages ------------------------------------------------------------------------------------------------
#: Query of JobRecovery, Fleet and ClusterWatch: the workflow's status model.
STATUS_QUERY = "status"
#: JobRecovery signal: a node agent saw a GPU fault on one of the job's nodes (``GpuEvent``).
GPU_FAULT_REPORTED_SIGNAL = "gpu_fault_reported"
#: A node agent to the Fleet: a node-level GPU fault (``NodeGpuFault``), for nodes that hold a suspicion.
NODE_GPU_FAULT_SIGNAL = "node_gpu_fault_reported"
#: JobRecovery signal: the watch hub's answer to a subscription (``WatchEvent``, ADR 015).
WATCH_RETURNED_SIGNAL = "watch_returned"
#: ShardFeed signal: the scheduler feed's update for its shard (``FeedUpdate``).
FEED_UPDATE_SIGNAL = "feed_update"
#: ShardFeed signal: a hub just started on the shard (a takeover); send it the last digest and the changes since.
FEED_RESEND_SIGNAL = "feed_resend"
#: The hub's activity on its shard queue that takes the feed's updates (``list[FeedUpdate]``).
WATCH_FEED_APPLY_ACTIVITY = "watch_feed_apply"
#: JobRecovery signal: the Fleet's answer to an isolation request (``IsolationDecision``).
ISOLATION_DECIDED_SIGNAL = "isolation_decided"
#: JobRecovery updates: stop and restart monitoring (``PauseRequest`` -> ``JobRecoveryStatus``).
PAUSE_UPDATE = "pause"
RESUME_UPDATE = "resume"
#: Fleet signal: a JobRecovery asks to drain nodes and restart its job (``IsolationRequest``).
REQUEST_ISOLATION_SIGNAL = "request_isolation"
#: Fleet update: an operator approves or rejects a pending action (``ApprovalAnswer`` -> ``Approval``).
ANSWER_APPROVAL_UPDATE = "answer_approval"
#: Fleet update: observe, canary or act (``ModeChange`` -> ``FleetStatus``).
SET_MODE_UPDATE = "set_mode"
#: Fleet update: earlier drains no longer count toward the breaker's cap (operator -> ``BreakerStatus``).
RESET_BREAKER_UPDATE = "reset_breaker"
#: Fleet and JobRecovery update: an operator's action signed with MUNGE (``OperatorRequest``): approve, reject,
#: mode and breaker reset on the Fleet (-> ``FleetStatus``), pause and resume on a JobRecovery (->
#: ``JobRecoveryStatus``). The unsigned updates above are refused for new calls (kept for recorded histories).
OPERATOR_REQUEST_UPDATE = "operator_request"
#: Fleet query: its own record of the decision on one request id (``IsolationDecision`` or None). A JobRecovery
#: confirms every ``isolation_decided`` signal with it: a signal anyone could send, the Fleet's state nobody else
#: writes.
FLEET_DECISION_QUERY = "decision"

# ----- task queues and workflow ids ----------------------------------------------------------------------------
#: The central worker's task queue (workflows and cluster-level activities).
DEFAULT_TASK_QUEUE = "rebound"
#: The watch shards' activities (``watch_shard``): their own slots, never the acting queue's (ADR 015).
DEFAULT_WATCH_TASK_QUEUE = "rebound-watch"
#: Prefix of each watch shard's subscription queue; the shard number follows (``rebound-watch-shard-7``).
DEFAULT_SHARD_QUEUE_PREFIX = "rebound-watch-shard-"
#: The resume checks (``job_wait_resume``, up to 30 min each): their own slots.
DEFAULT_RESUME_TASK_QUEUE = "rebound-resume"
#: Prefix of each node agent's task queue; the node's Slurm name follows (``rebound-node-n1``).
NODE_TASK_QUEUE_PREFIX = "rebound-node-"


def node_task_queue(node: str) -> str:
    """The task queue of the node agent running on ``node``."""
    return f"{NODE_TASK_QUEUE_PREFIX}{node}"


def job_workflow_id(cluster: str, job_id: int | str) -> str:
    """Business key of a job's ``JobRecovery`` workflow: starting it twice is a no-op."""
    return f"rebound/{cluster}/job/{job_id}"


def cluster_watch_workflow_id(cluster: str) -> str:
    """Business key of the cluster's ``ClusterWatch`` workflow: every worker starts it, one runs."""
    return f"rebound/{cluster}/watch"


def fleet_workflow_id(cluster: str) -> str:
    """Business key of the cluster's ``Fleet`` workflow: the single writer of node quarantine."""
    return f"rebound/{cluster}/fleet"


def watch_shard_workflow_id(cluster: str, shard: int) -> str:
    """Business key of watch shard ``shard``'s ``WatchShard`` workflow: every worker starts it, one runs."""
    return f"rebound/{cluster}/watch-shard/{shard}"


def scheduler_feed_workflow_id(cluster: str) -> str:
    """Business key of the cluster's ``SchedulerFeed`` workflow: every worker starts it, one polls the scheduler."""
    return f"rebound/{cluster}/scheduler-feed"


def shard_feed_workflow_id(cluster: str, shard: int) -> str:
    """Business key of shard ``shard``'s ``ShardFeed`` mailbox (started by the feed's first update to it)."""
    return f"rebound/{cluster}/scheduler-feed/{shard}"


def node_gpu_health_workflow_id(cluster: str, node: str, nonce: str) -> str:
    """One on-demand ``NodeGpuHealth`` read of ``node`` (``rebound gpus NODE``): each read is its own run."""
    return f"rebound/{cluster}/gpu-health/{node}/{nonce}"


def audit_schedule_id(cluster: str) -> str:
    """The cluster's audit Schedule; its workflows are ``<this>-<scheduled time>`` (the server appends the time)."""
    return f"rebound/{cluster}/audit"


def audit_ondemand_workflow_id(cluster: str, stamp: str) -> str:
    """An audit started by ``rebound audit``: two started in the same second share one run."""
    return f"rebound/{cluster}/audit-ondemand-{stamp}"


# Custom search attributes. The SQLite visibility store allows at most 10 Keyword, 3 Int and 3 Text per
# namespace, so every one here is deliberate. The lab registers them at server start (see deploy/local).
JOB_ID = SearchAttributeKey.for_keyword("ReboundJobId")
CLUSTER = SearchAttributeKey.for_keyword("ReboundCluster")
RECOVERY_STATE = SearchAttributeKey.for_keyword("ReboundState")
CAUSE = SearchAttributeKey.for_keyword("ReboundCause")
IMPLICATED_NODES = SearchAttributeKey.for_keyword_list("ReboundNodes")
PENDING_APPROVAL = SearchAttributeKey.for_keyword("ReboundPendingApproval")
RESTART_COUNT = SearchAttributeKey.for_int("ReboundRestarts")

ALL_SEARCH_ATTRIBUTES = (
    JOB_ID,
    CLUSTER,
    RECOVERY_STATE,
    CAUSE,
    IMPLICATED_NODES,
    PENDING_APPROVAL,
    RESTART_COUNT,
)
