"""The workflow side of operators' authentication: the validator's synchronous checks, then one verification
activity per credential, then the decision (``workflows.policy.operators``). Used by the Fleet and JobRecovery.

A refusal after verification raises ``ApplicationError`` (type ``OPERATOR_REFUSED``): the update fails, the
workflow goes on, and the refusal stays in the workflow's audit events (``AuthState.events``).
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.domain.auth_state import AuthState
    from workflows.domain.operators import OperatorRequest, VerifiedCaller, VerifyCredentialInput
    from workflows.options import OPERATOR_VERIFY
    from workflows.policy import operators as rules

__all__ = ["OPERATOR_REFUSED", "admit", "precheck"]

OPERATOR_REFUSED = "OPERATOR_REFUSED"
VERIFY_ACTIVITY = "verify_operator_credential"


def precheck(auth: AuthState, req: OperatorRequest, extra: str | None = None) -> None:
    """For an update's validator: raise ValueError with the reason when the request is refused before anything."""
    reason = extra or rules.precheck(auth, req, workflow.now())
    if reason:
        raise ValueError(reason)


async def admit(
    get: Callable[[], AuthState],
    put: Callable[[AuthState], None],
    req: OperatorRequest,
    recheck: Callable[[], str | None],
) -> VerifiedCaller:
    """Verify the request's credential once and decide; the verified caller, or ``ApplicationError`` refused.

    ``recheck`` runs after the verification (the state may have moved while it ran: an approval answered by
    someone else meanwhile), and its reason refuses too.
    """
    put(rules.note_presented(get(), req, workflow.now()))  # before any await: a concurrent copy is a replay
    payload = rules.action_payload(req.action)
    try:
        verified: VerifiedCaller = await workflow.execute_activity(
            VERIFY_ACTIVITY,
            VerifyCredentialInput(credential=req.credential, payload=payload),
            result_type=VerifiedCaller,
            **OPERATOR_VERIFY,
        )
    except ActivityError as e:
        cause = e.cause.message if isinstance(e.cause, ApplicationError) else str(e.cause or e)
        verified = VerifiedCaller(ok=False, reason=f"the verification did not complete ({cause})")
    now = workflow.now()
    refusal = rules.authorize(verified, req, now) or recheck()
    put(rules.note_outcome(get(), req, verified, refusal, now))
    who = verified.user if verified.ok else f"claimed {req.credential.claimed_user}"
    if refusal is not None:
        workflow.logger.warning("operator action %s by %s refused: %s", req.action.kind.value, who, refusal)
        raise ApplicationError(f"refused: {refusal}", type=OPERATOR_REFUSED, non_retryable=True)
    workflow.logger.info("operator action %s by %s", req.action.kind.value, who)
    return verified
