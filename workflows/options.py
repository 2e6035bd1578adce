"""Named activity options: every call has explicit timeouts and a bounded retry policy (STYLE.md habit 3)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

from workflows.domain.errors import FailureKind

_PERMANENT = [k.value for k in FailureKind if not k.retryable]

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
