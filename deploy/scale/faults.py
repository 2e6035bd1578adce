"""The scale benchmark's faults: how many of each kind, on which jobs, when (pure, seeded).

Three kinds, each through the path a real one takes:

* ``crash``: a rank writes PyTorch's CUDA error and every rank stops; a second later the job is FAILED in
  ``squeue`` (requeue-able). Rebound sees the crash lines (its watch) and the failed state.
* ``xid``: an XID 79 on one GPU of the job's node, appended to the node's fake NVML state; the node agent pushes it
  to the job's workflow (ADR 008). The job stays RUNNING and writing.
* ``hang``: the job's ranks stop writing step lines; the job stays RUNNING (the hang window decides).

Each fault hits a different job (so an incident answers exactly one fault, and every other incident is false),
at times spread evenly over the injection period with a seeded jitter, the kinds interleaved.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["FULL_SIZE_JOBS", "FaultKind", "InjectedFault", "PlannedFault", "faults_per_kind", "plan_faults"]

#: The issue's full size: >= 100 faults per kind at 5,000 jobs; smaller runs scale down (at least 5 per kind).
FULL_SIZE_JOBS = 5000
FULL_SIZE_PER_KIND = 100
MIN_PER_KIND = 5


class FaultKind(StrEnum):
    CRASH = "crash"
    XID = "xid"
    HANG = "hang"


@dataclass(frozen=True)
class PlannedFault:
    kind: FaultKind
    job_id: int
    at_s: float
    """Seconds after the measurement window opened."""
    target: int
    """crash: the rank that dies; xid: the GPU index."""


@dataclass(frozen=True)
class InjectedFault:
    """The injector's record: what was done and its true onset ``t0`` (epoch seconds)."""

    kind: FaultKind
    job_id: int
    node: str
    target: int
    t0: float


def faults_per_kind(jobs: int, requested: int | None = None) -> int:
    """Faults per kind: ``requested``, else 100 at 5,000 jobs and proportionally fewer below (one per 50 jobs,
    at least 5); never more than a third of the jobs each, since every fault gets its own job."""
    wanted = requested if requested is not None else max(MIN_PER_KIND, jobs * FULL_SIZE_PER_KIND // FULL_SIZE_JOBS)
    return max(0, min(wanted, jobs // len(FaultKind)))


def plan_faults(
    job_ids: Sequence[int], per_kind: int, *, start_s: float, end_s: float, ranks: int, seed: int = 12
) -> list[PlannedFault]:
    """``per_kind`` faults of each kind on distinct jobs, spread over ``[start_s, end_s]``, in time order.

    Raises:
        ValueError: Fewer jobs than faults, or an empty period.
    """
    total = per_kind * len(FaultKind)
    if total > len(job_ids):
        raise ValueError(f"{total} faults need as many jobs; only {len(job_ids)}")
    if end_s < start_s:
        raise ValueError(f"the injection period [{start_s}, {end_s}] is empty")
    rng = random.Random(seed)
    victims = rng.sample(list(job_ids), total)
    kinds = [kind for _ in range(per_kind) for kind in FaultKind]
    step = (end_s - start_s) / total if total else 0.0
    planned = [
        PlannedFault(
            kind=kind,
            job_id=job,
            at_s=round(start_s + step * (i + rng.random()), 3),
            target=rng.randrange(ranks),
        )
        for i, (kind, job) in enumerate(zip(kinds, victims, strict=True))
    ]
    return sorted(planned, key=lambda f: f.at_s)
