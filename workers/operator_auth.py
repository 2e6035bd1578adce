"""The CLI's side of operators' authentication: every action signed with MUNGE before it is sent.

The identity is the Unix user running the command, as munged proves it; ``--as NAME`` no longer says who acts
(it is shown beside the verified user when it differs, and otherwise ignored).
"""

from __future__ import annotations

import getpass
import secrets
import sys
from typing import Any

from temporalio.client import WorkflowUpdateFailedError

from activities.auth.munge import encode_credential
from workers.settings import Settings
from workflows.domain.operators import OperatorAction, OperatorActionKind, OperatorCredential, OperatorRequest
from workflows.policy.operators import action_payload

__all__ = ["AS_HELP", "note_claim", "refusal_text", "signed_request"]

AS_HELP = "ignored: who acts is the Unix user running this command, as MUNGE proves it (kept for old scripts)"


async def signed_request(settings: Settings, kind: OperatorActionKind, **fields: Any) -> OperatorRequest:
    """The action for this cluster, with a fresh nonce, and a MUNGE credential over its canonical payload."""
    action = OperatorAction(kind=kind, cluster=settings.cluster_name, nonce=secrets.token_hex(12), **fields)
    munge, at = await encode_credential(
        action_payload(action),
        munge_bin=settings.auth.munge_bin,
        socket=settings.auth.munge_socket,
        timeout_s=settings.auth.timeout_s,
    )
    credential = OperatorCredential(munge=munge, claimed_user=getpass.getuser(), encoded_at=at)
    return OperatorRequest(action=action, credential=credential)


def note_claim(claimed: str | None, user: str) -> None:
    """Say so when ``--as`` names someone else: the action is signed (and recorded) as the Unix user."""
    if claimed and claimed != user:
        print(f"rebound: acting as {user} (MUNGE); --as {claimed} is ignored", file=sys.stderr)


def refusal_text(e: WorkflowUpdateFailedError) -> str:
    """The validator's or the handler's reason, without the SDK's wrapping."""
    cause = e.cause
    message = getattr(cause, "message", None) or str(cause)
    return str(message).removeprefix("refused: ")
