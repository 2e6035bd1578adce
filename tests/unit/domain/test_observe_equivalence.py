"""``observe`` works on the ranks a batch names only and joins each ring once: it must give exactly what the old
``observe`` (every rank's rings copied into deques, ``reference_observe``) gave, poll after poll, whatever the
samples: out of order, duplicates, restarts, epochs, rings longer than ``ring``, ranks past ``MAX_TRACKED_RANKS``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.domain.reference_observe import reference_observe
from workflows.domain.bounds import MAX_TRACKED_RANKS
from workflows.domain.progress import ProgressState, RankProgress, Sample, note_restart, observe

T0 = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)

_times = st.one_of(st.none(), st.floats(0, 5, allow_nan=False).map(lambda v: round(v, 7)))


@st.composite
def _sample(draw: st.DrawFn, ranks: int) -> Sample:
    return Sample(
        rank=draw(st.integers(0, ranks)),
        node=draw(st.sampled_from(["", "n1", "n2"])),
        step=draw(st.integers(0, 12)),
        at=T0 + timedelta(seconds=draw(st.integers(0, 40)) / 4),
        step_time_s=draw(_times),
        compute_time_s=draw(_times),
        epoch=draw(st.one_of(st.none(), st.integers(0, 2))),
    )


@st.composite
def _start(draw: st.DrawFn) -> ProgressState:
    """A fresh state, or one whose ranks already hold values (some rings longer than ``ring``: a smaller ring)."""
    ring = draw(st.integers(4, 7))
    if draw(st.booleans()):
        return ProgressState(ring=ring)
    ranks = []
    for rank in sorted(draw(st.sets(st.integers(0, 5), max_size=4))):
        values = tuple(float(v) for v in draw(st.lists(st.integers(1, 9), max_size=9)))
        ranks.append(
            RankProgress(
                rank=rank,
                first_seen=T0,
                last_step=draw(st.one_of(st.none(), st.integers(0, 6))),
                last_progress_at=T0,
                gaps_s=values,
                step_times_s=values[: draw(st.integers(0, 9))],
                compute_times_s=values[::2],
                step_time_total=len(values),
            )
        )
    return ProgressState(ring=ring, ranks=tuple(ranks), watching_since=draw(st.one_of(st.none(), st.just(T0))))


@settings(max_examples=400, deadline=None)
@given(
    start=_start(),
    polls=st.lists(st.tuples(st.lists(_sample(6), max_size=8), st.booleans()), min_size=1, max_size=6),
)
def test_observe_equals_the_old_observe(start: ProgressState, polls: list[tuple[list[Sample], bool]]) -> None:
    new, old = start, start
    for n, (samples, restart) in enumerate(polls):
        now = T0 + timedelta(seconds=8 + n)
        if restart:
            new, old = note_restart(new, now), note_restart(old, now)
        new, old = observe(new, samples, now), reference_observe(old, samples, now)
        assert new == old
        assert new.model_dump(mode="json") == old.model_dump(mode="json")


@settings(max_examples=60, deadline=None)
@given(polls=st.lists(st.lists(_sample(MAX_TRACKED_RANKS + 3), max_size=10), min_size=1, max_size=4))
def test_observe_equals_the_old_observe_past_the_tracked_ranks(polls: list[list[Sample]]) -> None:
    """Ranks past ``MAX_TRACKED_RANKS`` are folded into the summary exactly as before (the cap counts the ranks
    kept as they are too)."""
    full = ProgressState(
        ranks=tuple(RankProgress(rank=r, first_seen=T0) for r in range(MAX_TRACKED_RANKS - 2)),
        watching_since=T0,
    )
    new, old = full, full
    for n, samples in enumerate(polls):
        now = T0 + timedelta(seconds=8 + n)
        new, old = observe(new, samples, now), reference_observe(old, samples, now)
        assert new == old
