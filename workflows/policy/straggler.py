"""Stragglers: a rank (and its node) persistently slower than its peers, and a job slower than it used to be. Pure.

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
from workflows.domain.straggler import StragglerMetric, StragglerPolicy, StragglerVerdict
from workflows.policy.straggler_verdict import JobNumbers, SlowRank, StragglerJudgement

__all__ = ["assess_stragglers", "judge_stragglers", "median", "restart_pays_off"]

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


def assess_stragglers(state: ProgressState, policy: StragglerPolicy) -> tuple[ProgressState, StragglerVerdict]:
    """Judge every rank against its peers and the job against its baseline (see the module docstring).

    Call once per poll, after ``observe``: streaks advance by the samples that arrived since the previous call,
    so calling again without new samples changes nothing.

    Args:
        state: Progress as of the latest poll.
        policy: Thresholds.

    Returns:
        The state with updated streaks and baseline, and the verdict.
    """
    new_state, judged = judge_stragglers(state, policy)
    return new_state, judged.verdict()


def judge_stragglers(state: ProgressState, policy: StragglerPolicy) -> tuple[ProgressState, StragglerJudgement]:
    """``assess_stragglers`` with the verdict left to build when asked (``StragglerJudgement.verdict``): the watch
    needs only whether a rank straggles and where, unless it reports. Same state, same verdict."""
    width = min(policy.window, state.ring)
    metric = _pick_metric(state, policy, width)
    switched = metric.value != state.straggler_metric
    eligible = [r for r in state.ranks if len(_series(r, metric)) >= width]
    slow: list[SlowRank] = []
    peer: float | None = None
    bar: _Threshold | None = None
    smoothed: dict[int, float] = {}
    if len(eligible) >= policy.min_ranks:
        smoothed = {r.rank: median(_series(r, metric)[-width:]) for r in eligible}
        peer = median(list(smoothed.values()))
        if peer > 0:
            mad = median([abs(v - peer) for v in smoothed.values()])
            bar = _Threshold(peer, policy, mad, [_series(r, metric) for r in eligible], width)
    ranks = []
    for r in state.ranks:
        total = _total(r, metric)
        streak = 0
        if bar is not None and peer is not None and r.rank in smoothed:
            new = total if switched else total - r.straggler_seen_total
            streak = _streak(_series(r, metric), width, bar, new, 0 if switched else r.straggler_streak)
            value = smoothed[r.rank]  # the median of its last ``width``, as the peers were compared
            if not bar.holds(value):
                slow.append(SlowRank(r.rank, r.node, value, value / peer, streak))
        # A rank whose streak and count did not move is kept as it is (a copy of each rank every poll was a good
        # part of a watch hub's CPU at thousands of jobs).
        if r.straggler_streak != streak or r.straggler_seen_total != total:
            r = replaced(r, {"straggler_streak": streak, "straggler_seen_total": total})
        ranks.append(r)
    slow.sort(key=lambda s: (-s.slowdown, s.rank))
    job, baseline, job_streak, job_seen = _job_slowdown(state, policy, min(policy.job_window, state.ring))
    new_state = replaced(
        state,
        {
            "ranks": tuple(ranks),
            "straggler_metric": metric.value,
            "baseline_step_s": baseline,
            "job_slow_streak": job_streak,
            "job_seen_total": job_seen,
        },
    )
    judged = StragglerJudgement(
        policy=policy,
        metric=metric if bar is not None else None,
        width=width,
        peer_s=peer,
        threshold_s=bar.exact if bar is not None else _no_threshold,
        stragglers=tuple(s for s in slow if s.streak >= policy.persistence),
        suspects=tuple(s for s in slow if s.streak < policy.persistence),
        eligible=eligible,
        job=job,
    )
    return new_state, judged


def _no_threshold() -> None:
    return None


class _Threshold:
    """The cross-rank threshold ``peer + max(k * 1.4826 * MAD, relative_min * peer, k * noise * peer)``, its noise
    term computed only when needed.

    The noise (every eligible rank's ring sorted twice) was most of a judgement's cost, and a healthy job's values
    all lie below ``peer + max(k * 1.4826 * MAD, relative_min * peer)``, a bound the threshold never goes under (a
    larger term, rounded, gives a larger or equal sum): a value at or below it is below the threshold too. Only a
    value above the bound, or a verdict, needs the exact threshold; both get the same float as before.
    """

    __slots__ = ("_bound", "_exact", "_mad", "_peer", "_policy", "_rings", "_width")

    def __init__(
        self, peer: float, policy: StragglerPolicy, mad: float, rings: list[tuple[float, ...]], width: int
    ) -> None:
        self._peer, self._policy, self._mad, self._rings, self._width = peer, policy, mad, rings, width
        self._bound = peer + max(policy.k * MAD_TO_SIGMA * mad, policy.relative_min * peer)
        self._exact: float | None = None

    def exact(self) -> float:
        if self._exact is None:
            policy, peer = self._policy, self._peer
            noise = _smoothed_noise(self._rings, self._width)
            self._exact = peer + max(
                policy.k * MAD_TO_SIGMA * self._mad, policy.relative_min * peer, policy.k * noise * peer
            )
        return self._exact

    def holds(self, value: float) -> bool:
        """``value <= threshold``."""
        return value <= self._bound or value <= self.exact()


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


def _streak(series: Sequence[float], width: int, bar: _Threshold, new: int, streak: int) -> int:
    """The streak after ``new`` samples: each judged by the median of the ``width`` samples ending at it."""
    if new <= 0:
        return streak
    judged = min(new, len(series) - width + 1)
    run = 0
    for back in range(judged):  # newest first
        end = len(series) - back
        if bar.holds(median(series[end - width : end])):
            break
        run += 1
    return streak + new if run == new else run


def _job_slowdown(
    state: ProgressState, policy: StragglerPolicy, width: int
) -> tuple[JobNumbers | None, float | None, int, int]:
    """The job-level figures, the new baseline, streak and seen-total (step time only)."""
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
    latest = job_value(0)  # the newest sample's value: the first one the streak judges, and the current one
    if new > 0:
        run = 0
        for back in range(new):
            value = latest if back == 0 else job_value(back)
            if value is None or value < limit:
                break
            run += 1
        streak = streak + new if run == new else run
    current = latest or 0.0
    slowdown = current / baseline
    slow = slowdown >= policy.job_slowdown_min and streak >= policy.job_persistence
    return JobNumbers(baseline, current, slowdown, streak, slow, width), baseline, streak, seen
