"""Named activity options: every call has explicit timeouts and a bounded retry policy (STYLE.md habit 3)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityCancellationType

from workflows.domain.errors import FailureKind

_PERMANENT = [k.value for k in FailureKind if not k.retryable]

#: Retried without end, ten seconds apart at most, whatever the error (no ``non_retryable_error_types``): for what
#: is never given up (a watch shard's hub, the scheduler feed, a job's subscription with its shard) and for a
#: hand-over to a hub, which its ``schedule_to_close_timeout`` bounds instead.
RETRY_WITHOUT_END = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=0,
)

#: A quick read of the scheduler: a few seconds, retried a few times (transient kinds only).
SCHEDULER_READ: dict[str, Any] = {
    "start_to_close_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=5,
        non_retryable_error_types=_PERMANENT,
    ),
}

#: Anchoring a job's log offsets: a glob and a stat per file, once per workflow; retried a few times.
LOG_ANCHOR: dict[str, Any] = {**SCHEDULER_READ, "start_to_close_timeout": timedelta(seconds=60)}

#: A long-running watch: heartbeats every poll, resumes from its heartbeat after a worker crash.
SCHEDULER_WATCH: dict[str, Any] = {
    "start_to_close_timeout": timedelta(days=30),
    "heartbeat_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=0,  # unlimited: a scheduler outage must not end the watch; permanent kinds still stop it
        non_retryable_error_types=_PERMANENT,
    ),
}

#: A read on a node agent. schedule_to_start is short on purpose: an agent that does not pick the task up within
#: seconds is itself evidence (node down, agent dead), so we want the answer fast rather than a long wait.
NODE_AGENT_READ: dict[str, Any] = {
    "schedule_to_start_timeout": timedelta(seconds=10),
    "start_to_close_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=1),
        maximum_attempts=3,
        non_retryable_error_types=_PERMANENT,
    ),
}

#: The per-job detector: long, heartbeating every poll, cancelled when a GPU fault arrives by signal.
JOB_WATCH: dict[str, Any] = {
    **SCHEDULER_WATCH,
    "cancellation_type": ActivityCancellationType.TRY_CANCEL,
}

#: Evidence gathering: a settle window plus corroboration, well under a minute.
ATTRIBUTE: dict[str, Any] = {
    "start_to_close_timeout": timedelta(seconds=60),
    "heartbeat_timeout": timedelta(seconds=10),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=1), maximum_attempts=3, non_retryable_error_types=_PERMANENT
    ),
}

#: A cluster action (drain, requeue, resubmit, resume): quick and idempotent (its key; verified by a fresh read), so
#: retried while Slurm says "not yet" (a requeued job still COMPLETING: SCHEDULER_BUSY) or does not answer
#: (SCHEDULER_UNREACHABLE) for as long as an outage of slurmctld may last: giving up after a minute or two failed
#: the workflow, and with it the Fleet's breaker, approvals and suspicions or the job's recovery. Permanent kinds
#: (refused credentials, a bad request) still fail at once. ``CLUSTER_ACTION_OUTAGE`` bounds the rest: an hour,
#: so a "not yet" that never turns into "done" (a verification that cannot match) holds the Fleet no longer.
CLUSTER_ACTION_OUTAGE = timedelta(hours=1)
CLUSTER_ACTION: dict[str, Any] = {
    "start_to_close_timeout": timedelta(seconds=30),
    # Each such activity heartbeats throughout (``heartbeating_throughout``): a worker that dies mid-action has it
    # retried on another worker after 10 s, not 30 (the retry's fresh read notices what the dead one did).
    "heartbeat_timeout": timedelta(seconds=10),
    "schedule_to_close_timeout": CLUSTER_ACTION_OUTAGE,
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        backoff_coefficient=1.5,
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=0,
        non_retryable_error_types=_PERMANENT,
    ),
}

#: Waiting for the restarted job's first training step: long, heartbeating.
WAIT_RESUME: dict[str, Any] = {
    "start_to_close_timeout": timedelta(minutes=30),
    "heartbeat_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=1), maximum_attempts=5, non_retryable_error_types=_PERMANENT
    ),
}

#: A best-effort read of a node's GPUs during attribution: a dead agent must not stall the recovery.
NODE_AGENT_QUICK_READ: dict[str, Any] = {
    "schedule_to_start_timeout": timedelta(seconds=2),
    "start_to_close_timeout": timedelta(seconds=5),
    "retry_policy": RetryPolicy(maximum_attempts=1),
}

#: The central read of nodes' DCGM exporters (``dcgm_read_gpus``) beside the agents' NVML reads: an exporter that
#: cannot be read is data in the result, so only a worker that cannot serve the call fails it (one retry). Each
#: scrape is bounded by ``gpu.dcgm_timeout_s`` (at most 120 s); the nodes are read concurrently.
DCGM_READ: dict[str, Any] = {
    "schedule_to_start_timeout": timedelta(seconds=10),
    "start_to_close_timeout": timedelta(seconds=130),
    # It heartbeats while it reads: a worker killed mid-read (right after a detection) delays the attribution by
    # ~10 s, not by the 130 s bound (seen in a clean-clone CI run).
    "heartbeat_timeout": timedelta(seconds=10),
    "retry_policy": RetryPolicy(maximum_attempts=2, non_retryable_error_types=_PERMANENT),
}

#: Evidence from a node agent before a hung job is killed (its ranks' processes, their stacks): one try, bounded,
#: so a dead agent delays the restart by seconds, not minutes. Callers add ``start_to_close_timeout`` sized to the
#: dump (py-spy runs up to 8 ranks at a time, each with its own timeout).
NODE_AGENT_EVIDENCE: dict[str, Any] = {
    "schedule_to_start_timeout": timedelta(seconds=3),
    "heartbeat_timeout": timedelta(seconds=10),
    "retry_policy": RetryPolicy(maximum_attempts=1),
}

#: Deliver a request to the Fleet (signal-with-start): retried while Temporal is unreachable, briefly.
FLEET_REQUEST: dict[str, Any] = {
    "start_to_close_timeout": timedelta(seconds=10),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(milliseconds=200),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=5),
        maximum_attempts=20,
        non_retryable_error_types=["CONFIGURATION"],
    ),
}

#: ClusterWatch's discovery: one heartbeating activity that returns when opted-in jobs appear or known ones end
#: (or after its max wait, at most 30 min). A scheduler outage is ridden out; permanent kinds stop the attempt.
CLUSTER_DISCOVERY: dict[str, Any] = {
    "start_to_close_timeout": timedelta(hours=1),
    "heartbeat_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=0,  # unlimited: an outage must not stop discovery; permanent kinds still end the attempt
        non_retryable_error_types=_PERMANENT,
    ),
}

#: Starting a workflow through the Temporal client (idempotent: the id is the business key).
TEMPORAL_START: dict[str, Any] = {
    "start_to_close_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=5,
        non_retryable_error_types=_PERMANENT,
    ),
}

#: Reading or setting aside a job's checkpoints on a shared file system (``checkpoint_scan``,
#: ``checkpoint_quarantine``): stat calls and small reads, bounded; both are idempotent, so a retry is safe.
CHECKPOINT_IO: dict[str, Any] = {
    "start_to_close_timeout": timedelta(minutes=5),
    "heartbeat_timeout": timedelta(seconds=30),  # heartbeated while it works: a dead worker costs 30 s, not 5 min
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=2),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=3,
        non_retryable_error_types=_PERMANENT,
    ),
}

#: A JobRecovery subscribes its job with its watch shard's hub (ADR 015): a quick call that waits in the shard's
#: queue while the shard moves to another worker; retried without end (the workflow also waits for GPU signals).
WATCH_SUBSCRIBE: dict[str, Any] = {
    "start_to_close_timeout": timedelta(seconds=10),
    "retry_policy": RETRY_WITHOUT_END,
    "cancellation_type": ActivityCancellationType.TRY_CANCEL,
}

#: The one activity a ``WatchShard`` or the ``SchedulerFeed`` keeps running (``workflows.keep_running``): it runs
#: until its worker dies, then is retried on another worker at once (the caller adds ``heartbeat_timeout``, which
#: its input sets: a takeover costs the heartbeat timeout and little more).
KEEP_RUNNING: dict[str, Any] = {
    "start_to_close_timeout": timedelta(days=365),
    "retry_policy": RETRY_WITHOUT_END,
}
#: After an attempt of that activity failed for good (it never should): wait this long, then run it again.
KEEP_RUNNING_BACKOFF = timedelta(seconds=10)

#: Stop a job's subscription (a GPU fault or a pause took over): best effort, bounded; a member left behind
#: signals an event its workflow ignores (an old seq), and its hub forgets it after two leases.
WATCH_UNSUBSCRIBE: dict[str, Any] = {
    "schedule_to_close_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3),
    "cancellation_type": ActivityCancellationType.ABANDON,
}

#: Verifying an operator's MUNGE credential (``workflows.operator_gate``): exactly once. A second ``unmunge`` of
#: the same credential on the same host says "Replayed credential", so a retry could only ever refuse; a
#: verification that did not complete refuses the action and the operator runs the command again.
OPERATOR_VERIFY: dict[str, Any] = {
    "start_to_close_timeout": timedelta(seconds=15),
    "schedule_to_close_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(maximum_attempts=1),
}
