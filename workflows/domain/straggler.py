"""A straggler check's settings and verdict: what the watch reports and the incident keeps (the rules that produce
the verdict are ``workflows.policy.straggler``)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from workflows.domain.base import Frozen


class StragglerMetric(StrEnum):
    COMPUTE_TIME = "compute_time"
    STEP_TIME = "step_time"


class StragglerPolicy(Frozen):
    """When a rank counts as a straggler and a job as slowed down."""

    metric: Literal["auto", "compute_time", "step_time"] = "auto"
    """``auto``: compute time when enough ranks log it, else step time."""
    window: int = Field(5, ge=1, le=1024)
    """Samples per rank whose median is the rank's value (capped by the state's ring)."""
    k: float = Field(3.0, ge=0)
    """MAD multiplier of the cross-rank threshold."""
    relative_min: float = Field(0.2, ge=0)
    """The threshold is at least this fraction above the peer median."""
    min_ranks: int = Field(3, ge=3)
    """Ranks with a full window needed to compare them at all (with two, which one is slow is a coin toss)."""
    persistence: int = Field(4, ge=1)
    """Consecutive slow samples before a rank's verdict (its smoothed value, so ~``window`` / 2 more slow steps)."""
    job_slowdown_min: float = Field(1.3, gt=1)
    """The job counts as slowed down at this multiple of its baseline step time."""
    job_window: int = Field(16, ge=1, le=1024)
    """Samples per rank whose median is the job's step time: longer than ``window``, as the job's ratio to its
    baseline is closer to 1 than a straggler's to its peers (one slow rank of many slows the step by less)."""
    job_persistence: int = Field(8, ge=1)
    """Consecutive slow samples before the job's verdict: longer, as a few blips of different ranks in a row
    (each stalls everyone) are not a slowdown, and nothing about a slow job is urgent."""
    baseline_samples: int = Field(32, ge=1)
    """Step times a rank must hold before its ring's median counts toward the job's baseline."""


class RankStraggler(Frozen):
    rank: int
    node: str = ""
    value_s: float
    """The rank's smoothed value (median of its last ``window`` samples)."""
    slowdown: float
    """``value_s`` / the median across ranks."""
    streak: int
    evidence: str


class NodeStraggler(Frozen):
    node: str
    ranks: tuple[int, ...]
    """Its straggling ranks."""
    ranks_assessed: int
    slowdown: float
    """The largest slowdown among ``ranks``."""
    whole_node: bool
    """Every assessed rank of the node straggles."""


class JobSlowdown(Frozen):
    baseline_s: float
    current_s: float
    slowdown: float
    streak: int
    slow: bool
    """``slowdown`` at least ``job_slowdown_min`` for ``job_persistence`` samples."""
    evidence: str


class StragglerVerdict(Frozen):
    metric: StragglerMetric | None = None
    """None when fewer than ``min_ranks`` ranks could be compared."""
    assessed_ranks: int = 0
    peer_median_s: float | None = None
    threshold_s: float | None = None
    stragglers: tuple[RankStraggler, ...] = ()
    """Ranks slow for ``persistence`` samples or more, slowest first."""
    suspects: tuple[RankStraggler, ...] = ()
    """Ranks above the threshold, not yet for long enough."""
    nodes: tuple[NodeStraggler, ...] = ()
    job: JobSlowdown | None = None
    summary: str = ""

    @property
    def flagged(self) -> bool:
        return bool(self.stragglers)
