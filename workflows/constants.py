"""Names that must agree between workers, workflows, the CLI and the lab: task queues and search attributes."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

#: The central worker's task queue (workflows and cluster-level activities).
DEFAULT_TASK_QUEUE = "rebound"
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
