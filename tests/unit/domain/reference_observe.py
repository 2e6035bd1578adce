"""The pre-hot3 ``observe`` (rings copied into deques for every rank on every poll), kept verbatim as the oracle
that ``tests/unit/domain/test_observe_equivalence.py`` checks today's ``observe`` against. Not used by the service."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from workflows.domain.base import replaced
from workflows.domain.bounds import MAX_TRACKED_RANKS
from workflows.domain.progress import (
    MAX_DURATION_S,
    ProgressSample,
    ProgressState,
    RankProgress,
    Sample,
    UntrackedRanks,
    aware,
)

_GAP_DECIMALS = 3
_TIME_DECIMALS = 6


@dataclass
class _Rank:
    """A rank being updated: mutable while a batch is applied, frozen again at the end."""

    base: RankProgress
    node: str
    last_step: int | None
    last_epoch: int | None
    last_progress_at: datetime | None
    restarts: int
    progress_count: int
    step_time_total: int
    compute_time_total: int
    gaps: deque[float]
    step_times: deque[float]
    compute_times: deque[float]

    @classmethod
    def of(cls, r: RankProgress, ring: int) -> _Rank:
        return cls(
            r,
            r.node,
            r.last_step,
            r.last_epoch,
            r.last_progress_at,
            r.restarts,
            r.progress_count,
            r.step_time_total,
            r.compute_time_total,
            deque(r.gaps_s, ring),
            deque(r.step_times_s, ring),
            deque(r.compute_times_s, ring),
        )

    def freeze(self) -> RankProgress:
        return replaced(
            self.base,
            {
                "node": self.node,
                "last_step": self.last_step,
                "last_epoch": self.last_epoch,
                "last_progress_at": self.last_progress_at,
                "restarts": self.restarts,
                "progress_count": self.progress_count,
                "step_time_total": self.step_time_total,
                "compute_time_total": self.compute_time_total,
                "gaps_s": tuple(self.gaps),
                "step_times_s": tuple(self.step_times),
                "compute_times_s": tuple(self.compute_times),
            },
        )

    def apply(self, s: ProgressSample | Sample, at: datetime, restarted_at: datetime | None) -> float | None:
        """Apply one sample: the gap it closes (0.0 when none), or None when the sample is ignored."""
        last_at = self.last_progress_at
        gap = 0.0
        if self.last_step is not None and last_at is not None:
            if at < last_at:
                return None  # older than the last line applied: read late, or re-read
            both = s.epoch is not None and self.last_epoch is not None
            new_key = (s.epoch or 0, s.step) if both else (0, s.step)
            old_key = (self.last_epoch or 0, self.last_step) if both else (0, self.last_step)
            # The first line of the attempt that note_restart announced: no gap across the restart.
            fresh = restarted_at is not None and last_at < restarted_at <= at
            if new_key == old_key and not fresh:
                return None  # the same step again
            if new_key < old_key:
                self.restarts += 1
            elif not fresh:
                gap = round((at - last_at).total_seconds(), _GAP_DECIMALS)
                if gap <= MAX_DURATION_S:
                    self.gaps.append(gap)
                else:
                    gap = 0.0
        self.last_step, self.last_epoch, self.last_progress_at = s.step, s.epoch, at
        self.progress_count += 1
        if s.node:
            self.node = s.node
        if s.step_time_s is not None:
            self.step_times.append(round(s.step_time_s, _TIME_DECIMALS))
            self.step_time_total += 1
        if s.compute_time_s is not None:
            self.compute_times.append(round(s.compute_time_s, _TIME_DECIMALS))
            self.compute_time_total += 1
        return gap


def reference_observe(state: ProgressState, samples: Iterable[ProgressSample | Sample], now: datetime) -> ProgressState:
    """``state`` updated with a poll's step lines (see the module docstring for the rules).

    Args:
        state: The state after the previous poll (``ProgressState()`` at first).
        samples: The step lines read this poll, any order, any ranks.
        now: The watcher's clock at this poll.

    Returns:
        The new state; ``state`` is unchanged (and is what comes back, when there is nothing to apply).
    """
    now = aware(now)
    if not isinstance(samples, list | tuple):
        samples = list(samples)
    if not samples and state.watching_since is not None and all(_within(r, state.ring) for r in state.ranks):
        return state  # nothing to apply: every value would be copied as it is
    work: dict[int, _Rank] = {r.rank: _Rank.of(r, state.ring) for r in state.ranks}
    longest = state.longest_gap_s
    ignored = state.ignored
    # The untracked ranks' lines are folded in plain locals and summarised once: a model copy per line was most of
    # a poll's CPU for a job whose lines name 16,384 ranks (0.3 s of 0.76 s per poll).
    folded, highest, last_step, last_at = 0, -1, None, None
    for sample in sorted(samples, key=lambda s: s.at):
        at = min(sample.at, now)
        rank = work.get(sample.rank)
        if rank is None:
            if len(work) >= MAX_TRACKED_RANKS:
                folded += 1
                highest = max(highest, sample.rank)
                last_step = sample.step if last_step is None else max(last_step, sample.step)
                last_at = at  # samples come in time order
                continue
            rank = work[sample.rank] = _Rank.of(RankProgress(rank=sample.rank, first_seen=at), state.ring)
        gap = rank.apply(sample, at, state.restarted_at)
        if gap is None:
            ignored += 1
        elif gap > 0:
            longest = max(longest, gap)
    untracked = state.untracked
    if folded:
        untracked = _fold(untracked, folded, highest, last_step, last_at)
    return replaced(
        state,
        {
            "ranks": tuple(work[k].freeze() for k in sorted(work)),
            "watching_since": state.watching_since or now,
            "longest_gap_s": longest,
            "ignored": ignored,
            "untracked": untracked,
        },
    )


def _within(r: RankProgress, ring: int) -> bool:
    """Whether the rank's rings fit ``ring`` (``observe`` would cut a longer one)."""
    return len(r.gaps_s) <= ring and len(r.step_times_s) <= ring and len(r.compute_times_s) <= ring


def _fold(
    summary: UntrackedRanks | None, count: int, highest: int, step: int | None, at: datetime | None
) -> UntrackedRanks:
    """``summary`` with ``count`` more step lines of untracked ranks (the highest rank, step and time among them)."""
    s = summary or UntrackedRanks(highest_rank=highest)
    return s.model_copy(
        update={
            "highest_rank": max(s.highest_rank, highest),
            "samples": s.samples + count,
            "last_step": step if s.last_step is None or step is None else max(s.last_step, step),
            "last_progress_at": at if s.last_progress_at is None or at is None else max(s.last_progress_at, at),
        }
    )
