"""A straggler judgement as plain values, and the ``StragglerVerdict`` built from it only when asked. Pure.

``workflows.policy.straggler`` judges every poll that brought new timing samples; the watch needs only whether a
rank straggles and on which nodes, unless it reports (an incident: rarely). Building the verdict's models and
evidence strings on every poll was a good part of a watch hub's CPU per job, so the judgement keeps the numbers
and ``verdict()`` makes the same verdict from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workflows.domain.progress import RankProgress
from workflows.domain.straggler import (
    JobSlowdown,
    NodeStraggler,
    RankStraggler,
    StragglerMetric,
    StragglerPolicy,
    StragglerVerdict,
)

__all__ = ["JobNumbers", "SlowRank", "StragglerJudgement"]


@dataclass(frozen=True, slots=True)
class SlowRank:
    """A rank above the threshold: its smoothed value and its streak of slow samples."""

    rank: int
    node: str
    value_s: float
    slowdown: float
    streak: int


@dataclass(frozen=True, slots=True)
class JobNumbers:
    """The job-level check's figures (``JobSlowdown`` without its evidence text)."""

    baseline_s: float
    current_s: float
    slowdown: float
    streak: int
    slow: bool
    width: int


@dataclass(frozen=True, slots=True)
class StragglerJudgement:
    """What one judgement found; ``verdict()`` is the ``StragglerVerdict`` ``assess_stragglers`` returns."""

    policy: StragglerPolicy
    metric: StragglerMetric | None
    """None when fewer than ``min_ranks`` ranks could be compared (or their median is 0)."""
    width: int
    peer_s: float | None
    threshold_s: Callable[[], float | None]
    """The exact threshold, computed when called (only a verdict or a rank above the cheap bound needs it)."""
    stragglers: tuple[SlowRank, ...]
    """Slow for ``persistence`` samples or more, slowest first."""
    suspects: tuple[SlowRank, ...]
    eligible: Sequence[RankProgress]
    """The ranks compared (a node's count of them is in its ``NodeStraggler``)."""
    job: JobNumbers | None

    @property
    def assessed(self) -> int:
        return len(self.eligible)

    @property
    def flagged(self) -> bool:
        return bool(self.stragglers)

    @property
    def node_names(self) -> frozenset[str]:
        """The nodes of the stragglers (``{n.node for n in verdict().nodes}``)."""
        return frozenset(s.node for s in self.stragglers if s.node)

    def verdict(self) -> StragglerVerdict:
        threshold = self.threshold_s()
        stragglers = tuple(self._rank(s, threshold) for s in self.stragglers)
        suspects = tuple(self._rank(s, threshold) for s in self.suspects)
        job = self._job()
        return StragglerVerdict(
            metric=self.metric,
            assessed_ranks=self.assessed,
            peer_median_s=self.peer_s,
            threshold_s=threshold,
            stragglers=stragglers,
            suspects=suspects,
            nodes=self._nodes(stragglers),
            job=job,
            summary=_summary(stragglers, suspects, job, self.assessed, self.policy, self.metric),
        )

    def _job(self) -> JobSlowdown | None:
        j = self.job
        if j is None:
            return None
        return JobSlowdown(
            baseline_s=j.baseline_s,
            current_s=j.current_s,
            slowdown=j.slowdown,
            streak=j.streak,
            slow=j.slow,
            evidence=(
                f"job step time {j.current_s:.3f} s (median across ranks of their last {j.width}) = "
                f"{j.slowdown:.2f}x its baseline {j.baseline_s:.3f} s; at or above "
                f"{self.policy.job_slowdown_min:g}x for {j.streak} consecutive samples"
            ),
        )

    def _rank(self, s: SlowRank, threshold: float | None) -> RankStraggler:
        peer = self.peer_s or 0.0
        return RankStraggler(
            rank=s.rank,
            node=s.node,
            value_s=s.value_s,
            slowdown=s.slowdown,
            streak=s.streak,
            evidence=(
                f"rank {s.rank}{f' ({s.node})' if s.node else ''}: {self.metric} {s.value_s:.3f} s (median of its "
                f"last {self.width}) = {s.slowdown:.2f}x the peer median {peer:.3f} s (threshold {threshold:.3f} s), "
                f"slow for {s.streak} consecutive samples"
            ),
        )

    def _nodes(self, stragglers: Sequence[RankStraggler]) -> tuple[NodeStraggler, ...]:
        out: list[NodeStraggler] = []
        for node in sorted({s.node for s in stragglers if s.node}):
            mine = [s for s in stragglers if s.node == node]
            assessed = sum(1 for r in self.eligible if r.node == node)
            out.append(
                NodeStraggler(
                    node=node,
                    ranks=tuple(sorted(s.rank for s in mine)),
                    ranks_assessed=assessed,
                    slowdown=max(s.slowdown for s in mine),
                    whole_node=len(mine) == assessed,
                )
            )
        return tuple(sorted(out, key=lambda n: (-n.slowdown, n.node)))


def _summary(
    stragglers: Sequence[RankStraggler],
    suspects: Sequence[RankStraggler],
    job: JobSlowdown | None,
    assessed: int,
    policy: StragglerPolicy,
    metric: StragglerMetric | None,
) -> str:
    if metric is None:
        parts = [f"{assessed} rank(s) with {policy.window} samples: fewer than {policy.min_ranks} to compare"]
    elif stragglers:
        parts = [f"straggler(s) by {metric}: " + "; ".join(s.evidence for s in stragglers)]
    elif suspects:
        parts = [f"no straggler yet by {metric}; watching rank(s) {', '.join(str(s.rank) for s in suspects)}"]
    else:
        parts = [f"no straggler among {assessed} ranks by {metric}"]
    if job is not None:
        parts.append(("job slowed down: " if job.slow else "") + job.evidence)
    return "; ".join(parts)
