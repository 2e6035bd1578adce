"""What an operator's verified action does to the Fleet's state, and what makes one impossible. Pure.

Who may act is decided before (``workflows.policy.operators``: the MUNGE credential, the operator list); these
rules apply whoever asks: an approval must still be pending, a canary needs its partition, the action must be
for this cluster and be the Fleet's (pause and resume are a job's).
"""

from __future__ import annotations

from datetime import datetime

from workflows.domain.fleet import ApprovalAnswer, FleetMode, FleetState
from workflows.domain.operators import OperatorAction, OperatorActionKind
from workflows.policy.fleet.approvals import answer_approval, approval_refusal

__all__ = ["apply_operator_action", "operator_refusal"]

_ANSWERS = (OperatorActionKind.APPROVE, OperatorActionKind.REJECT)


def operator_refusal(state: FleetState, action: OperatorAction) -> str | None:
    """Why this action cannot be applied now, whoever asks; None when it can."""
    if action.cluster != state.cluster:
        return f"the action is for cluster {action.cluster!r}, this Fleet is {state.cluster!r}"
    if action.kind in _ANSWERS:
        return approval_refusal(state, action.approval_id)
    if action.kind is OperatorActionKind.MODE:
        if action.mode is None:
            return "a mode change names no mode"
        if action.mode is FleetMode.CANARY and not (action.canary_partition or state.canary_partition):
            return "canary mode needs a partition (--partition)"
        return None
    if action.kind is OperatorActionKind.BREAKER_RESET:
        return None
    return f"{action.kind.value} is a job's action (rebound {action.kind.value} JOB), not the Fleet's"


def apply_operator_action(state: FleetState, action: OperatorAction, user: str, now: datetime) -> FleetState:
    """The state after ``user``'s (verified, allowed) action."""
    if action.kind in _ANSWERS:
        answer = ApprovalAnswer(
            approval_id=action.approval_id,
            operator=user,
            approve=action.kind is OperatorActionKind.APPROVE,
            note=action.note,
        )
        return answer_approval(state, answer, now)
    if action.kind is OperatorActionKind.MODE and action.mode is not None:
        partition = action.canary_partition or state.canary_partition
        return state.model_copy(update={"mode": action.mode, "canary_partition": partition})
    if action.kind is OperatorActionKind.BREAKER_RESET:
        return state.model_copy(update={"breaker_reset_at": now})
    return state
