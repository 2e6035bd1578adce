"""Failure kinds: how adapters classify what went wrong, so nothing downstream parses error messages.

Adapters raise ``temporalio.exceptions.ApplicationError(type=kind.value, non_retryable=not kind.retryable)``
at the activity boundary; workflows and retry policies match on these values, never on Python class names.

    FailureKind
    ├── transient (Temporal retries the request)
    │   ├── SCHEDULER_UNREACHABLE      slurmctld / slurmrestd did not answer
    │   ├── SCHEDULER_TIMEOUT          a scheduler command ran past its deadline
    │   ├── SCHEDULER_BUSY             the scheduler said "try again" (e.g. job still COMPLETING)
    │   ├── TEMPORAL_UNREACHABLE       the Temporal frontend did not answer
    │   └── GPU_SOURCE_UNAVAILABLE     NVML/DCGM could not be read right now
    └── permanent (retrying the same request cannot help)
        ├── SCHEDULER_AUTH             the scheduler refused Rebound's credentials (slurmrestd JWT, munge, TLS):
        │                              an operator must fix a token or a setting; never read as "unreachable"
        ├── TEMPORAL_AUTH              the Temporal frontend (or its TLS proxy) refused Rebound's certificate or API
        │                              key, or its own certificate is not one Rebound trusts: never "unreachable"
        ├── SCHEDULER_REJECTED         the scheduler refused the request (bad id, not allowed, wrong state)
        ├── SCHEDULER_UNSUPPORTED      this backend cannot do that (e.g. drain over the 22.05 REST API)
        ├── SCHEDULER_BAD_RESPONSE     output that does not parse: a version we do not understand
        ├── JOB_NOT_FOUND / NODE_NOT_FOUND
        ├── NOT_OWNED                  a drain someone else set: Rebound never alters it
        └── CONFIGURATION              settings that cannot work (missing binary, bad path)
"""

from __future__ import annotations

from enum import StrEnum


class FailureKind(StrEnum):
    """Classified failure; the value is used as ``ApplicationError.type``."""

    SCHEDULER_UNREACHABLE = "SCHEDULER_UNREACHABLE"
    SCHEDULER_TIMEOUT = "SCHEDULER_TIMEOUT"
    SCHEDULER_BUSY = "SCHEDULER_BUSY"
    TEMPORAL_UNREACHABLE = "TEMPORAL_UNREACHABLE"
    GPU_SOURCE_UNAVAILABLE = "GPU_SOURCE_UNAVAILABLE"
    SCHEDULER_AUTH = "SCHEDULER_AUTH"
    TEMPORAL_AUTH = "TEMPORAL_AUTH"
    SCHEDULER_REJECTED = "SCHEDULER_REJECTED"
    SCHEDULER_UNSUPPORTED = "SCHEDULER_UNSUPPORTED"
    SCHEDULER_BAD_RESPONSE = "SCHEDULER_BAD_RESPONSE"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    NODE_NOT_FOUND = "NODE_NOT_FOUND"
    NOT_OWNED = "NOT_OWNED"
    CONFIGURATION = "CONFIGURATION"

    @property
    def retryable(self) -> bool:
        """Whether repeating the same request may succeed. Unknown kinds never reach here: they are PERMANENT."""
        return self in _TRANSIENT


_TRANSIENT = frozenset(
    {
        FailureKind.SCHEDULER_UNREACHABLE,
        FailureKind.SCHEDULER_TIMEOUT,
        FailureKind.SCHEDULER_BUSY,
        FailureKind.TEMPORAL_UNREACHABLE,
        FailureKind.GPU_SOURCE_UNAVAILABLE,
    }
)


class ReboundError(Exception):
    """An error Rebound has classified. Adapters raise subclasses; activities turn them into ApplicationError."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"
