"""The operator's ceilings on what a job's own opt-in comment may ask for (``optin.*`` settings).

A job's owner writes its comment, so everything in it is a request, not an order: the policy that applies these
ceilings is ``workflows.policy.optin_caps``; what a clamp looks like to the job's owner and the operator is a
``CAPPED`` entry in the job's timeline (``RecoverySpec.capped``).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from workflows.domain.base import Frozen
from workflows.domain.checkpoints import CheckpointFallback
from workflows.domain.recovery import StragglerAction

__all__ = ["OptInCaps"]


class OptInCaps(Frozen):
    """Ceilings on a comment's asks; a matching selector's own explicit values are ceilings too (the lower wins).

    Values an operator's selector sets are the operator's own and are not capped here.
    """

    max_budget: int = Field(10, ge=0, le=100)
    """The most restarts a comment's ``budget=`` may ask for (and a comment-only job's default budget)."""
    min_hang_s: float = Field(60.0, ge=0)
    """The shortest hang window a comment's ``hang=`` may ask for: a job that calls itself hung after 1 s would
    turn Rebound's restarts (and their stack dumps on every node) into a loop of its own making."""
    max_hang_s: float = Field(24 * 3600.0, gt=0, le=7 * 24 * 3600)
    """The longest hang window a comment may ask for: a hung job holds its nodes for as long as this."""
    stragglers: StragglerAction = StragglerAction.REPORT
    """The most a comment's ``stragglers=`` may ask for (off < report < restart): ``restart`` drains a node on the
    job's own printed step times, which the job controls."""
    checkpoint_fallback: CheckpointFallback = CheckpointFallback.QUARANTINE
    """The most a comment's ``ckpt_fallback=`` may ask for (off < quarantine): ``off`` keeps every checkpoint."""
    max_log_patterns: int = Field(8, ge=0, le=64)
    """Globs a comment may give in ``logs=`` and, separately, in ``heartbeat=``; later ones are dropped."""
    recursive_globs: bool = False
    """Whether a comment's globs may use ``**`` (a walk of whole directory trees); off: such patterns are dropped."""

    @model_validator(mode="after")
    def _window(self) -> OptInCaps:
        if self.min_hang_s > self.max_hang_s:
            raise ValueError(f"optin.min_hang_s ({self.min_hang_s}) is above optin.max_hang_s ({self.max_hang_s})")
        return self
