"""The active node check (ADR 018): a short diagnostic job run on a node Rebound drained, before it is resumed.

The Fleet puts the node in a maintenance reservation, resumes it, runs the check job there with
``--reservation`` and judges what the job's ranks printed (``workflows.policy.node_check``). These are the
models every side shares: the policy (``NodeCheckPolicy``, part of ``FleetPolicy``), one rank's report
(``RankReport``, one JSON line on the job's output), the activity's input and result, and the release.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from workflows.domain.base import Frozen

__all__ = [
    "RANK_REPORT_PREFIX",
    "RESERVATION_PREFIX",
    "CheckOutcome",
    "NodeCheckPolicy",
    "NodeCheckReleaseInput",
    "NodeCheckReleaseResult",
    "NodeCheckRunInput",
    "NodeCheckRunResult",
    "ProbeResult",
    "RankReport",
    "reservation_name",
]

#: Every rank of a check job prints exactly one line starting with this, then its ``RankReport`` as JSON.
RANK_REPORT_PREFIX = "rebound-node-check "
#: The maintenance reservation of a node under check is ``rebound-check-<node>``: one per node, found again by name.
RESERVATION_PREFIX = "rebound-check-"


def reservation_name(node: str) -> str:
    """The node's check reservation (derived from the node: a crashed check's leftover is found and reused)."""
    return f"{RESERVATION_PREFIX}{node}"


class NodeCheckPolicy(Frozen):
    """How the Fleet checks a node it drained before resuming it (``fleet.node_check``)."""

    enabled: bool = True
    """Run the diagnostic job (after the node agent's GPU read passed); off: the GPU read alone decides."""
    timeout_s: float = Field(120.0, gt=0, le=3600)
    """Rebound's own bound on the check, from its submission to its result; past it the job is cancelled and the
    check fails (Slurm's time limits are whole minutes and checked about every 30 s: never relied on)."""
    ranks: int = Field(0, ge=0, le=64)
    """Ranks of the check's all-reduce on the node; 0: one per GPU of the node, at least 2 (and at most its CPUs)."""
    reservation_minutes: int = Field(60, ge=1, le=7 * 24 * 60)
    """Duration of the maintenance reservation: a check interrupted by a crash leaves the node reserved (no job but
    the check's lands there) at most this long; the next check of the node reuses the reservation."""


class ProbeResult(Frozen):
    """One probe of a rank: the gloo all-reduce, ``dcgmi diag``, the NCCL all-reduce, the InfiniBand ports."""

    name: str
    ok: bool
    detail: str = ""
    skipped: bool = False
    """The tool does not exist on the node (not a failure: nothing was tested)."""


class RankReport(Frozen):
    """What one rank of the check job found (one line on the job's output)."""

    node: str
    rank: int
    world: int
    probes: tuple[ProbeResult, ...] = ()


class CheckOutcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"
    """The check could not judge the node (another job shared it, the job never started): checked again later."""
    NOT_OURS = "not_ours"
    """The node no longer carries Rebound's drain (someone else drained or resumed it): nothing was done."""


class NodeCheckRunInput(Frozen):
    node: str
    drain_reason: str
    """Rebound's drain on the node: the check starts only from it (or from its own reservation, on a retry)."""
    token: str
    """This check's id (``<fleet id>/check-<node>-<n>``): the job carrying it is adopted by a retried attempt."""
    timeout_s: float
    ranks: int = 0
    reservation_minutes: int = 60


class NodeCheckRunResult(Frozen):
    node: str
    outcome: CheckOutcome
    detail: str
    job_id: int | None = None
    reservation: str = ""
    """The reservation left in place (the release deletes it); empty: none was made."""
    current_reason: str = ""
    """The node's reason as last read (a NOT_OURS node: whose drain it carries now, e.g. ``NHC: ...``)."""
    reports: tuple[RankReport, ...] = ()


class NodeCheckReleaseInput(Frozen):
    node: str
    drain_reason: str = ""
    """Drain the node with this (Rebound's) reason before the reservation goes; empty: release it to service."""
    reservation: str


class NodeCheckReleaseResult(Frozen):
    node: str
    drained: bool
    """The node carries ``drain_reason`` now (false when released, or when someone else's drain came first)."""
    detail: str = ""
    current_reason: str = ""
