"""Training progress as the watch activity tracks it across polls: per rank, the last step and when it came, and
a bounded memory of recent gaps between step lines and of recent step/compute times. Pure and deterministic
(``now`` is always passed in), and serialisable: the state travels in heartbeat details as
``model_dump(mode="json")`` and comes back through ``model_validate``.

The hang and straggler policies (``workflows.policy.hang``, ``workflows.policy.straggler``) read this state;
``observe`` only records.

Rules of ``observe``:

* Samples are applied in timestamp order (stable: lines without their own time, stamped with the poll time, keep
  file order).
* A line stamped before the rank's last applied one is old (read late, or re-read): ignored. The same step again
  is a duplicate: ignored.
* A lower step stamped at or after the last one is a restart from a checkpoint: the rank's progress clock starts
  again there, and what was learned about its timing (gaps, step and compute times) is kept. (Lines without their
  own time all carry the poll's time, so among them file order decides.)
* A bar that counts batches within an epoch (``epoch`` set) is compared by ``(epoch, step)``.
* A timestamp later than ``now`` (a node clock ahead of the watcher's) is taken as ``now``.
* After ``note_restart`` (the job was requeued), a rank's first step line starts its clock afresh: the gap across
  the restart is not a step gap.
* At most ``MAX_TRACKED_RANKS`` ranks are tracked one by one (the first seen); the lines of any other rank are
  folded into one summary (``UntrackedRanks``), so the state stays under ``PROGRESS_STATE_MAX_BYTES`` whatever rank
  numbers a job's lines claim (``workflows.domain.bounds``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from pydantic import Field, field_validator

from workflows.domain.base import Frozen, replaced
from workflows.domain.bounds import MAX_TRACKED_RANKS, PROGRESS_RING, RANKS_NOTE
from workflows.domain.progress_signal import ProgressSignal

__all__ = [
    "DEFAULT_RING",
    "MAX_DURATION_S",
    "ProgressSample",
    "ProgressSignal",
    "ProgressState",
    "RankProgress",
    "Sample",
    "UntrackedRanks",
    "aware",
    "note_activity",
    "note_restart",
    "observe",
]

#: How many recent gaps and step/compute times each rank keeps (``workflows.domain.bounds.PROGRESS_RING``).
DEFAULT_RING = PROGRESS_RING
#: A duration above this (30 days) is a parse accident, not a measurement.
MAX_DURATION_S = 30 * 24 * 3600.0
# Decimals kept: milliseconds for gaps (what log timestamps resolve), microseconds for logged times; short JSON.
_GAP_DECIMALS = 3
_TIME_DECIMALS = 6


def aware(at: datetime) -> datetime:
    """``at`` with a zone: a naive time is taken as UTC, as the log tailer does for lines without a zone."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


class ProgressSample(Frozen):
    """One step line of one rank, reduced to what progress tracking needs."""

    rank: int = Field(ge=0)
    node: str = ""
    step: int = Field(ge=0)
    at: datetime
    """The line's own timestamp, else when the watcher read it."""
    step_time_s: float | None = Field(None, ge=0, le=MAX_DURATION_S, allow_inf_nan=False)
    compute_time_s: float | None = Field(None, ge=0, le=MAX_DURATION_S, allow_inf_nan=False)
    epoch: int | None = Field(None, ge=0)
    """For counters that restart every epoch (progress bars); None for global step counters."""

    @field_validator("at")
    @classmethod
    def _aware(cls, at: datetime) -> datetime:
        return aware(at)


class Sample(NamedTuple):
    """A ``ProgressSample`` as plain values, for a reader whose values already hold what ``ProgressSample`` checks
    (ranks, steps and epochs >= 0, times finite within ``MAX_DURATION_S``, ``at`` with a zone): the watch reads
    thousands of step lines a second (``activities.logs.job_watcher``). ``observe`` takes either."""

    rank: int
    node: str
    step: int
    at: datetime
    step_time_s: float | None
    compute_time_s: float | None
    epoch: int | None


class RankProgress(Frozen):
    """What is known about one rank's progress."""

    rank: int = Field(ge=0)
    node: str = ""
    first_seen: datetime
    last_step: int | None = None
    """None while only activity (a heartbeat file) was seen."""
    last_epoch: int | None = None
    last_progress_at: datetime | None = None
    """When ``last_step`` was logged (the line's time)."""
    last_activity_at: datetime | None = None
    """The latest mtime of the rank's heartbeat file (``note_activity``)."""
    restarts: int = Field(0, ge=0)
    """Times its step counter went back (a restart from a checkpoint)."""
    progress_count: int = Field(0, ge=0)
    """Step lines accepted, ever."""
    gaps_s: tuple[float, ...] = ()
    """Seconds between consecutive step lines (one line may advance several steps), newest last."""
    step_times_s: tuple[float, ...] = ()
    """Logged step times, newest last."""
    compute_times_s: tuple[float, ...] = ()
    """Logged compute times, newest last."""
    step_time_total: int = Field(0, ge=0)
    """Step times ever appended (the ring keeps the last few): tells which values are new since a look."""
    compute_time_total: int = Field(0, ge=0)
    straggler_streak: int = Field(0, ge=0)
    """Consecutive timing samples the straggler policy found this rank slow in."""
    straggler_seen_total: int = Field(0, ge=0)
    """The metric's ``*_total`` when the straggler policy last looked at this rank."""

    @property
    def last_heard_at(self) -> datetime | None:
        """The latest sign of life: a step line or heartbeat activity."""
        times = [t for t in (self.last_progress_at, self.last_activity_at) if t is not None]
        return max(times, default=None)


class UntrackedRanks(Frozen):
    """The ranks past ``MAX_TRACKED_RANKS``, summarised: enough to tell that they still step, nothing per rank."""

    highest_rank: int = Field(ge=0)
    """The highest rank number their lines named: the job has at least this many + 1 ranks."""
    samples: int = Field(0, ge=0)
    """Their step lines (and heartbeat touches) folded in."""
    last_step: int | None = None
    """The highest step any of them logged."""
    last_progress_at: datetime | None = None
    """The latest step line of any of them."""
    last_activity_at: datetime | None = None
    """The latest heartbeat file touch of any of them."""

    @property
    def last_heard_at(self) -> datetime | None:
        times = [t for t in (self.last_progress_at, self.last_activity_at) if t is not None]
        return max(times, default=None)


class ProgressState(Frozen):
    """Progress of one job's ranks, carried from poll to poll."""

    ring: int = Field(DEFAULT_RING, ge=4, le=1024)
    """How many recent values each rank keeps per series."""
    ranks: tuple[RankProgress, ...] = ()
    """Sorted by rank."""
    watching_since: datetime | None = None
    """The first ``observe``'s ``now``: silence is never counted from before Rebound was watching."""
    restarted_at: datetime | None = None
    """The latest ``note_restart``: the job's current attempt started then."""
    longest_gap_s: float = Field(0.0, ge=0)
    """The longest gap between step lines the job ever came back from (checkpoint saves, evaluations)."""
    baseline_step_s: float | None = Field(None, gt=0)
    """The job's own step time when it ran well, learned by the straggler policy."""
    straggler_metric: str = ""
    """The timing series the straggler streaks were counted in (``compute_time``/``step_time``)."""
    job_slow_streak: int = Field(0, ge=0)
    """Consecutive timing samples the whole job was slower than its baseline."""
    job_seen_total: int = Field(0, ge=0)
    ignored: int = Field(0, ge=0)
    """Samples dropped: duplicates and old lines read late (of tracked ranks)."""
    untracked: UntrackedRanks | None = None
    """The ranks past ``MAX_TRACKED_RANKS``, summarised; None while every rank is tracked."""

    def rank(self, rank: int) -> RankProgress | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    @property
    def ever_progressed(self) -> bool:
        return any(r.last_step is not None for r in self.ranks) or (
            self.untracked is not None and self.untracked.last_step is not None
        )

    @property
    def ranks_note(self) -> str:
        """What the timeline says once the job's lines name more ranks than are tracked; "" while all are."""
        if self.untracked is None:
            return ""
        seen = max(self.untracked.highest_rank + 1, len(self.ranks) + 1)
        return RANKS_NOTE.format(tracked=len(self.ranks), seen=seen, cap=MAX_TRACKED_RANKS)


@dataclass(slots=True)
class _Rank:
    """A rank being updated: mutable while a batch is applied, frozen again at the end.

    The rings are not copied in: a batch appends a few values to rings of up to ``ring`` (64) each, so the values
    appended are kept apart and joined to the old ring once, at ``freeze`` (building three deques of every rank on
    every poll was the largest part of ``observe`` in a watch hub)."""

    base: RankProgress
    node: str
    last_step: int | None
    last_epoch: int | None
    last_progress_at: datetime | None
    restarts: int
    progress_count: int
    step_time_total: int
    compute_time_total: int
    gaps: list[float]
    step_times: list[float]
    compute_times: list[float]

    @classmethod
    def of(cls, r: RankProgress) -> _Rank:
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
            [],
            [],
            [],
        )

    def freeze(self, ring: int) -> RankProgress:
        base = self.base
        return replaced(
            base,
            {
                "node": self.node,
                "last_step": self.last_step,
                "last_epoch": self.last_epoch,
                "last_progress_at": self.last_progress_at,
                "restarts": self.restarts,
                "progress_count": self.progress_count,
                "step_time_total": self.step_time_total,
                "compute_time_total": self.compute_time_total,
                "gaps_s": _ring(base.gaps_s, self.gaps, ring),
                "step_times_s": _ring(base.step_times_s, self.step_times, ring),
                "compute_times_s": _ring(base.compute_times_s, self.compute_times, ring),
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


def observe(state: ProgressState, samples: Iterable[ProgressSample | Sample], now: datetime) -> ProgressState:
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
    # Only the ranks this batch names are worked on; the others are kept as they are (what ``freeze`` would give
    # them, unless their rings are longer than ``ring``: then they are cut as before).
    kept: dict[int, RankProgress] = {r.rank: r for r in state.ranks}
    work: dict[int, _Rank] = {}
    tracked = len(kept)
    longest = state.longest_gap_s
    ignored = state.ignored
    # The untracked ranks' lines are folded in plain locals and summarised once: a model copy per line was most of
    # a poll's CPU for a job whose lines name 16,384 ranks (0.3 s of 0.76 s per poll).
    folded, highest, last_step, last_at = 0, -1, None, None
    for sample in sorted(samples, key=lambda s: s.at):
        at = min(sample.at, now)
        rank = work.get(sample.rank)
        if rank is None and sample.rank in kept:
            rank = work[sample.rank] = _Rank.of(kept[sample.rank])
        if rank is None:
            if tracked >= MAX_TRACKED_RANKS:
                folded += 1
                highest = max(highest, sample.rank)
                last_step = sample.step if last_step is None else max(last_step, sample.step)
                last_at = at  # samples come in time order
                continue
            rank = work[sample.rank] = _Rank.of(RankProgress(rank=sample.rank, first_seen=at))
            tracked += 1
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
            "ranks": _merged(kept, work, state.ring),
            "watching_since": state.watching_since or now,
            "longest_gap_s": longest,
            "ignored": ignored,
            "untracked": untracked,
        },
    )


def _ring(old: tuple[float, ...], new: list[float], ring: int) -> tuple[float, ...]:
    """The last ``ring`` values of ``old`` then ``new`` (what a ``deque(old, ring)`` holds after ``new`` appended)."""
    return (old + tuple(new))[-ring:] if new else old[-ring:]


def _merged(kept: dict[int, RankProgress], work: dict[int, _Rank], ring: int) -> tuple[RankProgress, ...]:
    """Every rank, sorted: the ones a batch touched frozen, the others as they were (cut to ``ring`` if longer)."""
    out = []
    for k in sorted(kept.keys() | work.keys()):
        rank = work.get(k)
        if rank is not None:
            out.append(rank.freeze(ring))
        else:
            r = kept[k]
            out.append(r if _within(r, ring) else _Rank.of(r).freeze(ring))
    return tuple(out)


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


def _summarise(summary: UntrackedRanks | None, rank: int, at: datetime, *, step: int | None = None) -> UntrackedRanks:
    """``summary`` with one more line (``step`` set) or heartbeat touch of an untracked rank."""
    s = summary or UntrackedRanks(highest_rank=rank)
    update: dict[str, object] = {"highest_rank": max(s.highest_rank, rank), "samples": s.samples + 1}
    if step is not None:
        update["last_step"] = step if s.last_step is None else max(s.last_step, step)
        update["last_progress_at"] = at if s.last_progress_at is None else max(s.last_progress_at, at)
    elif s.last_activity_at is None or at > s.last_activity_at:
        update["last_activity_at"] = at
    return s.model_copy(update=update)


def note_activity(state: ProgressState, rank: int, at: datetime) -> ProgressState:
    """``state`` with ``rank`` known alive at ``at`` (its heartbeat file's mtime): silence is counted from then.

    Activity never moves the step or the learned timing; a rank not seen before is added without a step.
    An ``at`` older than what is known changes nothing.
    """
    at = aware(at)
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    current = state.rank(rank)
    if current is None:
        if len(state.ranks) >= MAX_TRACKED_RANKS:
            return state.model_copy(update={"untracked": _summarise(state.untracked, rank, at)})
        current = RankProgress(rank=rank, first_seen=at)
    elif current.last_activity_at is not None and current.last_activity_at >= at:
        return state
    updated = current.model_copy(update={"last_activity_at": at})
    others = [r for r in state.ranks if r.rank != rank]
    return state.model_copy(update={"ranks": tuple(sorted([*others, updated], key=lambda r: r.rank))})


def note_restart(state: ProgressState, at: datetime) -> ProgressState:
    """``state`` for a job the scheduler restarted at ``at`` (requeued): the new attempt's silence counts from
    ``at`` (the hang policy gives it the startup window until it logs a step) and each rank's first step line
    starts its clock afresh. Learned timing is kept; straggler streaks start over (the ranks may have moved)."""
    at = aware(at)
    ranks = tuple(r.model_copy(update={"straggler_streak": 0}) for r in state.ranks)
    return state.model_copy(update={"restarted_at": at, "ranks": ranks, "job_slow_streak": 0})
