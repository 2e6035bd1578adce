"""The pre-hot3 ``assess_stragglers`` (every median sorted again, the noise and the verdict built on every poll),
kept verbatim as the oracle that ``tests/unit/policy/test_straggler_equivalence.py`` checks today's against. Not used
by the service. Its original docstring follows.

Stragglers: a rank (and its node) persistently slower than its peers, and a job slower than it used to be. Pure.

In synchronous data parallelism every rank's step time is the same (the gradient collective waits for the
slowest), so a straggler shows only in per-rank compute time, the work before the collective. The metric is
compute time when at least ``min_ranks`` ranks log it, else step time (which then can only catch ranks that
genuinely run apart, e.g. independent replicas).

Per rank, the value is the median of its last ``window`` samples (one 3x blip never moves it). Across ranks the
threshold is robust: ``median + max(k * 1.4826 * MAD, relative_min * median, k * noise * median)``, where
1.4826 * MAD estimates the standard deviation without letting the straggler inflate it, ``relative_min`` keeps
identical ranks (MAD 0) from flagging noise, and ``noise`` is how much a rank's smoothed value wanders over time
by itself (its ring's robust spread, median across ranks, scaled to a median of ``window``): with few ranks the
cross-rank MAD underestimates that, and a noisy job would flag its unluckiest rank.

A rank becomes a straggler once its smoothed value stayed above the threshold for ``persistence`` consecutive
samples (steps, when every step is logged), each new sample judged by the median of the ``window`` samples ending
at it. A node is reported when any of its ranks is a straggler, ``whole_node`` when all of its assessed ranks are
(a node-wide cause: thermals, CPU, a NIC; one GPU otherwise).

The job-level check compares the job's step time (median across ranks of their last ``job_window`` samples) with
its own baseline: the lowest ring-wide median it ever sustained, learned once ranks hold ``baseline_samples``
values. It works with step time alone and is reported separately, as the job being slow is not evidence against
any node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from workflows.domain.base import replaced
from workflows.domain.progress import ProgressState, RankProgress
from workflows.domain.straggler import (
    JobSlowdown,
    NodeStraggler,
    RankStraggler,
    StragglerMetric,
    StragglerPolicy,
    StragglerVerdict,
)

__all__ = ["reference_assess_stragglers"]

#: Scales the median absolute deviation to the standard deviation of normal data.
MAD_TO_SIGMA = 1.4826
#: The standard error of a median of n normal samples is this x sigma / sqrt(n).
_MEDIAN_EFFICIENCY = 1.2533


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence (halves added, so huge values cannot overflow)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else ordered[mid - 1] / 2 + ordered[mid] / 2


def restart_pays_off(slowdown: float, remaining_s: float, restart_cost_s: float) -> bool:
    """Whether restarting without the slow node saves more time than the restart costs.

    At ``slowdown`` x the normal step time, the ``remaining_s`` of training left at the current pace would take
    ``remaining_s / slowdown`` at full speed, so staying loses ``remaining_s * (1 - 1 / slowdown)``.

    Args:
        slowdown: Current step time / normal step time (1.5 = 50% slower).
        remaining_s: Wall time the rest of the training takes at the current pace.
        restart_cost_s: What a restart costs: requeue, startup, checkpoint load, steps redone since the checkpoint.

    Returns:
        True when the projected loss exceeds the restart's cost.

    Raises:
        ValueError: For a non-finite or negative argument, or a slowdown not above 0.
    """
    for name, value in (("slowdown", slowdown), ("remaining_s", remaining_s), ("restart_cost_s", restart_cost_s)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if slowdown <= 0:
        raise ValueError(f"slowdown must be > 0, got {slowdown!r}")
    return slowdown > 1 and remaining_s * (1 - 1 / slowdown) > restart_cost_s


def _unchanged(rank: RankProgress, update: dict[str, int]) -> bool:
    return all(getattr(rank, name) == value for name, value in update.items())


def reference_assess_stragglers(
    state: ProgressState, policy: StragglerPolicy
) -> tuple[ProgressState, StragglerVerdict]:
    """Judge every rank against its peers and the job against its baseline (see the module docstring).

    Call once per poll, after ``observe``: streaks advance by the samples that arrived since the previous call,
    so calling again without new samples changes nothing.

    Args:
        state: Progress as of the latest poll.
        policy: Thresholds.

    Returns:
        The state with updated streaks and baseline, and the verdict.
    """
    width = min(policy.window, state.ring)
    metric = _pick_metric(state, policy, width)
    switched = metric.value != state.straggler_metric
    eligible = [r for r in state.ranks if len(_series(r, metric)) >= width]
    updates: dict[int, dict[str, int]] = {}
    stragglers: list[RankStraggler] = []
    suspects: list[RankStraggler] = []
    peer: float | None = None
    threshold: float | None = None
    if len(eligible) >= policy.min_ranks:
        smoothed = {r.rank: median(_series(r, metric)[-width:]) for r in eligible}
        peer = median(list(smoothed.values()))
        if peer > 0:
            mad = median([abs(v - peer) for v in smoothed.values()])
            noise = _smoothed_noise([_series(r, metric) for r in eligible], width)
            threshold = peer + max(policy.k * MAD_TO_SIGMA * mad, policy.relative_min * peer, policy.k * noise * peer)
    judged = {r.rank for r in eligible}
    for r in state.ranks:
        total = _total(r, metric)
        if threshold is None or peer is None or r.rank not in judged:
            updates[r.rank] = {"straggler_streak": 0, "straggler_seen_total": total}
            continue
        series = _series(r, metric)
        new = total if switched else total - r.straggler_seen_total
        streak = _streak(series, width, threshold, new, 0 if switched else r.straggler_streak)
        updates[r.rank] = {"straggler_streak": streak, "straggler_seen_total": total}
        value = median(series[-width:])
        if value <= threshold:
            continue
        found = RankStraggler(
            rank=r.rank,
            node=r.node,
            value_s=value,
            slowdown=value / peer,
            streak=streak,
            evidence=(
                f"rank {r.rank}{f' ({r.node})' if r.node else ''}: {metric} {value:.3f} s (median of its last "
                f"{width}) = {value / peer:.2f}x the peer median {peer:.3f} s (threshold {threshold:.3f} s), "
                f"slow for {streak} consecutive samples"
            ),
        )
        (stragglers if streak >= policy.persistence else suspects).append(found)
    stragglers.sort(key=lambda s: (-s.slowdown, s.rank))
    suspects.sort(key=lambda s: (-s.slowdown, s.rank))
    job, baseline, job_streak, job_seen = _job_slowdown(state, policy, min(policy.job_window, state.ring))
    # A rank whose streak and count did not move is kept as it is (a copy of each rank every poll was a good part
    # of a watch hub's CPU at thousands of jobs).
    ranks = tuple(r if _unchanged(r, updates[r.rank]) else replaced(r, updates[r.rank]) for r in state.ranks)
    new_state = replaced(
        state,
        {
            "ranks": ranks,
            "straggler_metric": metric.value,
            "baseline_step_s": baseline,
            "job_slow_streak": job_streak,
            "job_seen_total": job_seen,
        },
    )
    verdict = StragglerVerdict(
        metric=metric if threshold is not None else None,
        assessed_ranks=len(eligible),
        peer_median_s=peer,
        threshold_s=threshold,
        stragglers=tuple(stragglers),
        suspects=tuple(suspects),
        nodes=_nodes(stragglers, eligible),
        job=job,
        summary=_summary(stragglers, suspects, job, len(eligible), policy, metric if threshold is not None else None),
    )
    return new_state, verdict


def _smoothed_noise(rings: Sequence[Sequence[float]], width: int) -> float:
    """The typical relative standard deviation of a rank's smoothed value over time.

    Each rank's robust spread over its ring (1.4826 x MAD / median), the median of those across ranks (a straggler
    that changed speed inside its ring is one of many), scaled to a median of ``width`` samples (1.2533 / sqrt).
    """
    spreads = []
    for ring in rings:
        centre = median(ring)
        if centre > 0:
            spreads.append(MAD_TO_SIGMA * median([abs(v - centre) for v in ring]) / centre)
    return median(spreads) * _MEDIAN_EFFICIENCY / math.sqrt(width) if spreads else 0.0


def _pick_metric(state: ProgressState, policy: StragglerPolicy, width: int) -> StragglerMetric:
    if policy.metric != "auto":
        return StragglerMetric(policy.metric)
    with_compute = sum(1 for r in state.ranks if len(r.compute_times_s) >= width)
    return StragglerMetric.COMPUTE_TIME if with_compute >= policy.min_ranks else StragglerMetric.STEP_TIME


def _series(r: RankProgress, metric: StragglerMetric) -> tuple[float, ...]:
    return r.compute_times_s if metric is StragglerMetric.COMPUTE_TIME else r.step_times_s


def _total(r: RankProgress, metric: StragglerMetric) -> int:
    return r.compute_time_total if metric is StragglerMetric.COMPUTE_TIME else r.step_time_total


def _streak(series: Sequence[float], width: int, threshold: float, new: int, streak: int) -> int:
    """The streak after ``new`` samples: each judged by the median of the ``width`` samples ending at it."""
    if new <= 0:
        return streak
    judged = min(new, len(series) - width + 1)
    run = 0
    for back in range(judged):  # newest first
        end = len(series) - back
        if median(series[end - width : end]) <= threshold:
            break
        run += 1
    return streak + new if run == new else run


def _job_slowdown(
    state: ProgressState, policy: StragglerPolicy, width: int
) -> tuple[JobSlowdown | None, float | None, int, int]:
    """The job-level verdict, the new baseline, streak and seen-total (step time only)."""
    with_times = [r for r in state.ranks if len(r.step_times_s) >= width]
    seen = max((r.step_time_total for r in state.ranks), default=0)
    baseline = state.baseline_step_s
    enough = min(policy.baseline_samples, state.ring)
    learned = [median(r.step_times_s) for r in state.ranks if len(r.step_times_s) >= enough]
    if learned:
        candidate = median(learned)
        if candidate > 0 and (baseline is None or candidate < baseline):
            baseline = candidate
    if not with_times or baseline is None:
        return None, baseline, 0, seen

    def job_value(back: int) -> float | None:
        values = [
            median(r.step_times_s[len(r.step_times_s) - back - width : len(r.step_times_s) - back])
            for r in with_times
            if len(r.step_times_s) >= width + back
        ]
        return median(values) if values else None

    limit = baseline * policy.job_slowdown_min
    new = seen - state.job_seen_total
    streak = state.job_slow_streak
    if new > 0:
        run = 0
        for back in range(new):
            value = job_value(back)
            if value is None or value < limit:
                break
            run += 1
        streak = streak + new if run == new else run
    current = job_value(0) or 0.0
    slowdown = current / baseline
    slow = slowdown >= policy.job_slowdown_min and streak >= policy.job_persistence
    evidence = (
        f"job step time {current:.3f} s (median across ranks of their last {width}) = {slowdown:.2f}x its "
        f"baseline {baseline:.3f} s; at or above {policy.job_slowdown_min:g}x for {streak} consecutive samples"
    )
    job = JobSlowdown(
        baseline_s=baseline, current_s=current, slowdown=slowdown, streak=streak, slow=slow, evidence=evidence
    )
    return job, baseline, streak, seen


def _nodes(stragglers: Sequence[RankStraggler], eligible: Sequence[RankProgress]) -> tuple[NodeStraggler, ...]:
    out: list[NodeStraggler] = []
    for node in sorted({s.node for s in stragglers if s.node}):
        mine = [s for s in stragglers if s.node == node]
        assessed = sum(1 for r in eligible if r.node == node)
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
