"""Slurm's error numbers and what they mean for Rebound: one table shared by the CLI, REST and pyslurm adapters.

Also the ``errors`` list that every Slurm JSON payload carries (``squeue --json``, slurmrestd), and its
classification.

The numbers and texts were read from Slurm 22.05.8's own ``slurm_strerror()`` (libslurmfull.so). slurmrestd
returns the number in ``errors[].error_number``/``errno``; scontrol prints the text, usually after the job id
(``Invalid job id specified for job 9999``), so the CLI adapter recovers the number by matching the text.

Operation-specific meanings (``Job is pending execution`` is a no-op for a requeue, ``Job is no longer pending
execution`` means "too late" for an exclusion) are decided by the adapters; ``default_kind`` is the fallback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

from workflows.domain.errors import FailureKind, ReboundError

__all__ = [
    "ApiError",
    "SlurmErrno",
    "api_errors",
    "bad_response",
    "classify_api_errors",
    "default_kind",
    "errno_from_text",
    "kind_from_text",
    "raise_for_api_errors",
]


class SlurmErrno(IntEnum):
    """The Slurm error numbers Rebound tells apart (``slurm_errno.h``)."""

    UNSPECIFIED = -1
    UNEXPECTED_MSG = 1000
    COMMUNICATIONS_CONNECTION = 1001
    COMMUNICATIONS_SEND = 1002
    COMMUNICATIONS_RECEIVE = 1003
    COMMUNICATIONS_SHUTDOWN = 1004
    PROTOCOL_VERSION = 1005
    PROTOCOL_AUTHENTICATION = 1007
    ACCESS_DENIED = 2002
    INVALID_USER_ID = 2010
    INVALID_JOB_ID = 2017
    INVALID_NODE_NAME = 2018
    TRANSITION_STATE_NO_UPDATE = 2020
    ALREADY_DONE = 2021
    JOB_PENDING = 2024
    IN_STANDBY_MODE = 2027
    INVALID_NODE_STATE = 2028
    DISABLED = 2037
    JOB_NOT_PENDING = 2073
    JOB_STARTED = 2083
    JOB_FINISHED = 2084
    SOCKET_TIMEOUT = 5004
    ZERO_BYTES = 5005
    AUTH_CRED_INVALID = 6000
    AUTH_KEY_UNREADABLE = 6001
    AUTH_AGENT_UNREACHABLE = 6002
    AUTH_CRED_BAD = 6006
    AUTH_UNPACK = 6007
    AUTH_NOT_APPLICABLE = 6008


# slurm_strerror() texts, exactly as 22.05.8 prints them. No text contains another, so the first match is the
# only match.
_TEXTS: dict[str, SlurmErrno] = {
    "Job is no longer pending execution": SlurmErrno.JOB_NOT_PENDING,
    "Job is pending execution": SlurmErrno.JOB_PENDING,
    "Invalid job id specified": SlurmErrno.INVALID_JOB_ID,
    "Invalid node name specified": SlurmErrno.INVALID_NODE_NAME,
    "Invalid node state specified": SlurmErrno.INVALID_NODE_STATE,
    "Requested operation is presently disabled": SlurmErrno.DISABLED,
    "Job/step already completing or completed": SlurmErrno.ALREADY_DONE,
    "Job has already started": SlurmErrno.JOB_STARTED,
    "Job has already finished": SlurmErrno.JOB_FINISHED,
    "Job can not be altered now, try again later": SlurmErrno.TRANSITION_STATE_NO_UPDATE,
    "Access/permission denied": SlurmErrno.ACCESS_DENIED,
    "Unexpected message received": SlurmErrno.UNEXPECTED_MSG,
    "Communication connection failure": SlurmErrno.COMMUNICATIONS_CONNECTION,
    "Message send failure": SlurmErrno.COMMUNICATIONS_SEND,
    "Message receive failure": SlurmErrno.COMMUNICATIONS_RECEIVE,
    "Communication shutdown failure": SlurmErrno.COMMUNICATIONS_SHUTDOWN,
    "Incompatible versions of client and server code": SlurmErrno.PROTOCOL_VERSION,
    "Protocol authentication error": SlurmErrno.PROTOCOL_AUTHENTICATION,
    "Invalid user id": SlurmErrno.INVALID_USER_ID,
    "Invalid authentication credential": SlurmErrno.AUTH_CRED_INVALID,
    "Failed to open authentication public key": SlurmErrno.AUTH_KEY_UNREADABLE,
    "Failed to connect to authentication agent": SlurmErrno.AUTH_AGENT_UNREACHABLE,
    "Authentication credential invalid": SlurmErrno.AUTH_CRED_BAD,
    "Cannot unpack credential": SlurmErrno.AUTH_UNPACK,
    "Authentication does not apply to request": SlurmErrno.AUTH_NOT_APPLICABLE,
    "Slurm backup controller in standby mode": SlurmErrno.IN_STANDBY_MODE,
    "Socket timed out on send/recv operation": SlurmErrno.SOCKET_TIMEOUT,
    "Zero Bytes were transmitted or received": SlurmErrno.ZERO_BYTES,
}

# Texts that are not strerror() strings but that the Slurm commands print themselves.
_UNREACHABLE_TEXTS = (
    "Unable to contact slurm controller",  # scontrol/sinfo: "... (connect failure)"
    "Connection refused",
    "is DOWN",  # scontrol ping: "Slurmctld(primary) at vm is DOWN"
)
# What the Slurm commands print when munge cannot vouch for them: munged down, another key than slurmctld's, a
# credential slurmctld will not take (expired, rewound by a clock step, replayed). The worker's own authentication,
# not the controller's health: an operator fixes munge, so these are SCHEDULER_AUTH, never "unreachable".
_AUTH_TEXTS = (
    "Munge encode failed",
    "Munge decode failed",
    "auth_g_create",
    "auth_g_verify",
    "Invalid credential",
    "Expired credential",
    "Rewound credential",
    "Replayed credential",
    "Unauthorized credential",
)
_CONFIGURATION_TEXTS = (
    "Unable to process configuration file",
    "cannot stat file",
    "Invalid user for SlurmUser",
    "Unable to open file",
)

_DEFAULT_KIND: dict[SlurmErrno, FailureKind] = {
    SlurmErrno.UNEXPECTED_MSG: FailureKind.SCHEDULER_UNREACHABLE,  # what 22.05's requeue prints when ctld is down
    SlurmErrno.COMMUNICATIONS_CONNECTION: FailureKind.SCHEDULER_UNREACHABLE,
    SlurmErrno.COMMUNICATIONS_SEND: FailureKind.SCHEDULER_UNREACHABLE,
    SlurmErrno.COMMUNICATIONS_RECEIVE: FailureKind.SCHEDULER_UNREACHABLE,
    SlurmErrno.COMMUNICATIONS_SHUTDOWN: FailureKind.SCHEDULER_UNREACHABLE,
    SlurmErrno.IN_STANDBY_MODE: FailureKind.SCHEDULER_UNREACHABLE,
    SlurmErrno.ZERO_BYTES: FailureKind.SCHEDULER_UNREACHABLE,
    SlurmErrno.SOCKET_TIMEOUT: FailureKind.SCHEDULER_TIMEOUT,
    SlurmErrno.TRANSITION_STATE_NO_UPDATE: FailureKind.SCHEDULER_BUSY,
    SlurmErrno.JOB_NOT_PENDING: FailureKind.SCHEDULER_BUSY,
    SlurmErrno.INVALID_JOB_ID: FailureKind.JOB_NOT_FOUND,
    SlurmErrno.INVALID_NODE_NAME: FailureKind.NODE_NOT_FOUND,
    SlurmErrno.ACCESS_DENIED: FailureKind.CONFIGURATION,  # the service user lacks Slurm operator rights
    # Authentication: the worker's credential (munge, or slurmrestd's JWT) was refused; an operator must act.
    SlurmErrno.PROTOCOL_AUTHENTICATION: FailureKind.SCHEDULER_AUTH,
    SlurmErrno.INVALID_USER_ID: FailureKind.SCHEDULER_AUTH,
    SlurmErrno.AUTH_CRED_INVALID: FailureKind.SCHEDULER_AUTH,
    SlurmErrno.AUTH_KEY_UNREADABLE: FailureKind.SCHEDULER_AUTH,
    SlurmErrno.AUTH_AGENT_UNREACHABLE: FailureKind.SCHEDULER_AUTH,
    SlurmErrno.AUTH_CRED_BAD: FailureKind.SCHEDULER_AUTH,
    SlurmErrno.AUTH_UNPACK: FailureKind.SCHEDULER_AUTH,
    SlurmErrno.AUTH_NOT_APPLICABLE: FailureKind.SCHEDULER_AUTH,
    SlurmErrno.PROTOCOL_VERSION: FailureKind.CONFIGURATION,
}


def errno_from_text(text: str) -> SlurmErrno | None:
    """The Slurm error number whose ``slurm_strerror()`` text occurs in ``text`` (a command's stderr)."""
    for message, errno in _TEXTS.items():
        if message in text:
            return errno
    return None


def default_kind(errno: int) -> FailureKind:
    """How to classify an error number when the operation gives it no special meaning.

    Unknown and unspecified numbers are ``SCHEDULER_REJECTED``: permanent, because retrying a destructive
    action on an error we do not understand is the riskier choice (ADR-056).
    """
    try:
        return _DEFAULT_KIND.get(SlurmErrno(errno), FailureKind.SCHEDULER_REJECTED)
    except ValueError:
        return FailureKind.SCHEDULER_REJECTED


def kind_from_text(text: str) -> FailureKind:
    """Classify a Slurm command's error output (stderr, or stdout for ``scontrol ping``)."""
    errno = errno_from_text(text)
    if errno is not None:
        return default_kind(errno)
    if any(marker in text for marker in _CONFIGURATION_TEXTS):
        return FailureKind.CONFIGURATION  # before the auth texts: "Invalid user for SlurmUser" is slurm.conf's
    if any(marker in text for marker in _AUTH_TEXTS):
        return FailureKind.SCHEDULER_AUTH
    if any(marker in text for marker in _UNREACHABLE_TEXTS):
        return FailureKind.SCHEDULER_UNREACHABLE
    return FailureKind.SCHEDULER_REJECTED


@dataclass(frozen=True)
class ApiError:
    """One entry of a payload's ``errors`` list."""

    number: int
    error: str = ""
    description: str = ""
    source: str = ""

    def describe(self) -> str:
        """Human-readable summary, e.g. ``Invalid job id specified (2017, slurm_load_job: Unable to find ...)``."""
        detail = ": ".join(p for p in (self.source, self.description) if p)
        return f"{self.error or 'error'} ({self.number}{', ' + detail if detail else ''})"


def api_errors(payload: Mapping[str, object], *, source: str) -> tuple[ApiError, ...]:
    """The payload's ``errors`` (22.05 names the number ``error_number`` or ``errno``, depending on the call).

    Raises:
        ReboundError: ``SCHEDULER_BAD_RESPONSE`` when ``errors`` is not a list of objects.
    """
    raw = payload.get("errors")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad_response(source, f"'errors' is {type(raw).__name__}, not a list")
    result = []
    for item in raw:
        if not isinstance(item, Mapping):
            raise bad_response(source, f"an 'errors' entry is {type(item).__name__}, not an object")
        number = item.get("error_number", item.get("errno"))
        result.append(
            ApiError(
                number=number if isinstance(number, int) and not isinstance(number, bool) else -1,
                error=str(item.get("error") or ""),
                description=str(item.get("description") or ""),
                source=str(item.get("source") or ""),
            )
        )
    return tuple(result)


def classify_api_errors(errors: Sequence[ApiError], *, source: str) -> ReboundError:
    """Turn a non-empty ``errors`` list into one classified error.

    ``-1`` ("Unspecified error") is what 22.05 reports when slurmctld does not answer, and slurmrestd also
    when it rejects a JWT (both observed): it is classified ``SCHEDULER_UNREACHABLE`` (retryable) here, and the
    REST adapter, which knows its token and can ask slurmctld another way, turns a refused JWT into
    ``SCHEDULER_AUTH`` (``rest.SlurmRestScheduler``).
    """
    numbers = {e.number for e in errors}
    text = "; ".join(e.describe() for e in errors)
    if SlurmErrno.INVALID_JOB_ID in numbers:
        return ReboundError(FailureKind.JOB_NOT_FOUND, f"{source}: {text}")
    if SlurmErrno.INVALID_NODE_NAME in numbers:
        return ReboundError(FailureKind.NODE_NOT_FOUND, f"{source}: {text}")
    if numbers == {SlurmErrno.UNSPECIFIED}:
        return ReboundError(
            FailureKind.SCHEDULER_UNREACHABLE,
            f"{source}: {text} (how 22.05 reports an unreachable slurmctld; slurmrestd also a rejected JWT)",
        )
    first = next(n for n in (e.number for e in errors) if n != SlurmErrno.UNSPECIFIED)
    return ReboundError(default_kind(first), f"{source}: {text}")


def raise_for_api_errors(payload: Mapping[str, object], *, source: str) -> None:
    """Raise the classified error when the payload carries any.

    Raises:
        ReboundError: Classified by ``classify_api_errors``; ``SCHEDULER_BAD_RESPONSE`` for a malformed list.
    """
    errors = api_errors(payload, source=source)
    if errors:
        raise classify_api_errors(errors, source=source)


def bad_response(source: str, message: str) -> ReboundError:
    """A ``SCHEDULER_BAD_RESPONSE`` error: output from a Slurm version (or a bug) we do not understand."""
    return ReboundError(FailureKind.SCHEDULER_BAD_RESPONSE, f"{source}: {message}")
