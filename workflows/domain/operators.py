"""Operators' authenticated actions: what the CLI signs with MUNGE, and what Rebound verified of it.

An operator's action (approve, reject, mode, breaker reset, pause, resume) travels to the Fleet or a JobRecovery
as an ``OperatorRequest``: the action itself and a MUNGE credential whose payload is the action's canonical text
(``workflows.policy.operators.action_payload``). MUNGE is the cluster's own authentication (Slurm uses it): the
credential names the Unix user who encoded it, and only munged (with the cluster's key) can make one. The
workflow verifies it in an activity (``unmunge``) before anything is applied; who may do what is decided from
the verified user and groups against the operator list read at that moment (live configuration).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from workflows.domain.base import Frozen
from workflows.domain.fleet import FleetMode

__all__ = [
    "OperatorAction",
    "OperatorActionKind",
    "OperatorCredential",
    "OperatorRequest",
    "VerifiedCaller",
    "VerifyCredentialInput",
]


class OperatorActionKind(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    MODE = "mode"
    BREAKER_RESET = "breaker-reset"
    PAUSE = "pause"
    RESUME = "resume"


class OperatorAction(Frozen):
    """One action, with everything it does bound into the signed payload (a credential for one approval cannot
    answer another, a mode change cannot be replayed as another mode, a pause of one job cannot pause another)."""

    kind: OperatorActionKind
    cluster: str = Field(min_length=1, max_length=200)
    approval_id: str = Field("", max_length=100)
    mode: FleetMode | None = None
    canary_partition: str = Field("", max_length=200)
    job_id: int = Field(0, ge=0)
    note: str = Field("", max_length=500)
    nonce: str = Field(min_length=8, max_length=64)
    """Random per action, so two identical actions are two different payloads."""


class OperatorCredential(Frozen):
    """A MUNGE credential over the action's payload, as ``munge`` prints it, and what the caller claims of it.

    The claims are checked synchronously by the update's validator (cheap refusals, no history written); the
    credential itself only by ``unmunge`` in an activity, which also checks the claims against the real values.
    """

    munge: str = Field(min_length=1, max_length=4096)
    claimed_user: str = Field(min_length=1, max_length=64)
    """Who the caller says they are: refusals are counted per claimed user; the verified UID decides."""
    encoded_at: datetime
    """When the caller says the credential was encoded: stale claims are refused before any activity runs."""


class OperatorRequest(Frozen):
    """The update's argument: the action and the credential that signs it."""

    action: OperatorAction
    credential: OperatorCredential


class VerifyCredentialInput(Frozen):
    credential: OperatorCredential
    payload: str
    """The canonical payload the credential must carry (computed by the workflow from the action it received)."""


class VerifiedCaller(Frozen):
    """What ``unmunge`` said of a credential, and the operator list in force when it was read."""

    ok: bool
    """The credential decoded with STATUS success and carried exactly the expected payload."""
    reason: str = ""
    """Why it did not verify (``ok`` false), for the caller and the audit."""
    user: str = ""
    uid: int = -1
    groups: tuple[str, ...] = ()
    """The verified user's Unix groups (primary and supplementary), names as this host resolves them."""
    encoded_at: datetime | None = None
    """ENCODE_TIME from the credential itself (not the caller's claim)."""
    operators: tuple[str, ...] = ()
    """``fleet.operators`` as configured when the credential was verified (users, and ``%group`` for groups)."""
