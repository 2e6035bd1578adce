"""When a long-lived workflow (JobRecovery, Fleet, ClusterWatch) continues as new: when the server suggests it, or
once its history passes Rebound's own bound (``workflows.domain.bounds.history_full``), whichever comes first.

The bound is a change of command sequence (a continue-as-new where an older run went on), so it applies only
behind ``workflow.patched(patch_id)``, asked only once the bound is passed: a history recorded before the bound
existed replays as it ran (ADR 012).
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.domain.bounds import history_full

__all__ = ["continue_as_new_due"]


def continue_as_new_due(patch_id: str) -> bool:
    """True when this run should continue as new now (call it only where continuing is safe)."""
    info = workflow.info()
    if info.is_continue_as_new_suggested():
        return True
    if not history_full(info.get_current_history_length(), info.get_current_history_size()):
        return False
    return workflow.patched(patch_id)
