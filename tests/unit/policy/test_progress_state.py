"""Progress state: what ``observe`` records from step lines, and a seeded simulation of a data-parallel job that the
hang and straggler tests replay poll by poll. Pure, no Temporal."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from workflows.domain.hang import HangPolicy, HangVerdict
from workflows.domain.progress import (
    ProgressSample,
    ProgressState,
    note_activity,
    note_restart,
    observe,
)
from workflows.domain.straggler import StragglerPolicy, StragglerVerdict
from workflows.policy.hang import assess_hang
from workflows.policy.straggler import assess_stragglers

T0 = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def sample(rank: int, step: int, t: float, **kw: object) -> ProgressSample:
    return ProgressSample.model_validate({"rank": rank, "step": step, "at": at(t), **kw})


# ----- the simulated job ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sim:
    """A synchronous data-parallel job: every rank computes, then all meet in the gradient all_reduce.

    Rank ``i`` computes for ``compute_s`` x lognormal(0, ``sigma``) (x ``blip_x`` with probability ``blip_p``: a GC
    pause, a slow batch); the step ends for everyone when the slowest arrives plus the all_reduce, so every rank's
    step time is the same but for its own wait. Rank 0 saves a checkpoint after every ``checkpoint_every`` steps,
    delaying its next step, so its peers wait for it inside the next all_reduce (as deploy/demo/train.py does).
    """

    ranks: int = 4
    nodes: tuple[str, ...] = ("n1", "n2")
    compute_s: float = 0.17
    comm_s: float = 0.03
    sigma: float = 0.08
    blip_p: float = 0.01
    blip_x: float = 3.0
    checkpoint_every: int = 50
    checkpoint_s: float = 1.5
    duration_s: float = 600.0
    slow_rank: int | None = None
    slow_from_s: float = 0.0
    slow_factor: float = 1.0
    stop_rank: int | None = None
    stop_at_s: float = 0.0
    """The stopping rank prints nothing from its first step ending after this; its peers print one more step."""
    seed: int = 20261130

    def node_of(self, rank: int) -> str:
        per = -(-self.ranks // len(self.nodes))
        return self.nodes[rank // per]


@dataclass
class SimRun:
    """The lines a simulation printed, and when its key events happened."""

    lines: list[ProgressSample]
    slow_from_step: int | None = None
    slow_from_t: float | None = None
    last_line_t: float = 0.0
    checkpoints: int = 0
    blips: int = 0


def simulate(sim: Sim) -> SimRun:
    rng = random.Random(sim.seed)
    ready = [0.0] * sim.ranks
    run = SimRun(lines=[])
    step = 0
    stopped = False
    while not stopped:
        step += 1
        compute = []
        for rank in range(sim.ranks):
            c = sim.compute_s * rng.lognormvariate(0.0, sim.sigma)
            if rng.random() < sim.blip_p:
                c *= sim.blip_x
                run.blips += 1
            if rank == sim.slow_rank and ready[rank] >= sim.slow_from_s:
                if run.slow_from_step is None:
                    run.slow_from_step, run.slow_from_t = step, ready[rank]
                c *= sim.slow_factor
            compute.append(c)
        end = max(r + c for r, c in zip(ready, compute, strict=True)) + sim.comm_s * rng.lognormvariate(0.0, sim.sigma)
        if end > sim.duration_s:
            break
        stopping = sim.stop_rank is not None and end > sim.stop_at_s
        for rank in range(sim.ranks):
            if stopping and rank == sim.stop_rank:
                continue
            logged = end + rng.uniform(0.0005, 0.003)  # formatting and writing the line
            run.lines.append(
                ProgressSample(
                    rank=rank,
                    node=sim.node_of(rank),
                    step=step,
                    at=at(logged),
                    step_time_s=round(end - ready[rank], 3),
                    compute_time_s=round(compute[rank], 3),
                )
            )
            run.last_line_t = max(run.last_line_t, logged)
        stopped = stopping  # the peers block in the next all_reduce forever
        ready = [end] * sim.ranks
        if step % sim.checkpoint_every == 0:
            ready[0] += sim.checkpoint_s * rng.lognormvariate(0.0, 0.2)
            run.checkpoints += 1
    run.lines.sort(key=lambda s: s.at)
    return run


@dataclass
class Poll:
    t: float
    state: ProgressState
    hang: HangVerdict
    stragglers: StragglerVerdict
    new_lines: int


@dataclass
class Watch:
    """The watch activity's loop, without the I/O: every ``poll_s``, the lines written since the last poll."""

    hang_policy: HangPolicy = field(default_factory=HangPolicy)
    straggler_policy: StragglerPolicy = field(default_factory=StragglerPolicy)
    poll_s: float = 1.0
    round_trip: bool = False
    """Send the state through JSON every poll, as heartbeat details do."""

    def polls(self, run: SimRun, until_s: float, expected: Sequence[int] = ()) -> Iterator[Poll]:
        state = ProgressState()
        i = 0
        t = self.poll_s
        while t <= until_s:
            batch = []
            while i < len(run.lines) and run.lines[i].at <= at(t):
                batch.append(run.lines[i])
                i += 1
            state = observe(state, batch, at(t))
            state, stragglers = assess_stragglers(state, self.straggler_policy)
            if self.round_trip:
                state = ProgressState.model_validate(json.loads(json.dumps(state.model_dump(mode="json"))))
            hang = assess_hang(state, at(t), self.hang_policy, expected)
            yield Poll(t, state, hang, stragglers, len(batch))
            t += self.poll_s


def test_simulation_is_realistic_and_reproducible() -> None:
    run = simulate(Sim())
    assert run.lines == simulate(Sim()).lines
    steps = max(s.step for s in run.lines)
    assert 2200 < steps < 2600  # ~0.22 s a step (the slowest of 4 ranks) for 10 minutes, less ~70 s of saves
    assert run.checkpoints == steps // 50 and run.blips > 50
    by_step: dict[int, set[float | None]] = {}
    for s in run.lines:
        by_step.setdefault(s.step, set()).add(s.compute_time_s)
    assert all(len(v) > 1 for v in list(by_step.values())[:100])  # ranks differ in compute time


# ----- observe ----------------------------------------------------------------------------------------------------


def test_records_steps_gaps_and_times() -> None:
    state = observe(
        ProgressState(),
        [
            sample(0, 1, 0.0, node="n1", step_time_s=0.2, compute_time_s=0.15),
            sample(0, 2, 0.2, step_time_s=0.21, compute_time_s=0.16),
            sample(1, 1, 0.01, node="n2"),
        ],
        at(1.0),
    )
    r0, r1 = state.ranks
    assert (r0.rank, r0.node, r0.last_step, r0.last_progress_at, r0.first_seen) == (0, "n1", 2, at(0.2), at(0.0))
    assert r0.gaps_s == (0.2,) and r0.step_times_s == (0.2, 0.21) and r0.compute_times_s == (0.15, 0.16)
    assert (r0.step_time_total, r0.compute_time_total, r0.progress_count) == (2, 2, 2)
    assert (r1.last_step, r1.gaps_s, r1.step_times_s) == (1, (), ())
    assert state.watching_since == at(1.0) and state.longest_gap_s == 0.2


def test_samples_apply_in_time_order_and_old_or_repeated_lines_are_ignored() -> None:
    state = observe(ProgressState(), [sample(0, 3, 3.0), sample(0, 1, 1.0), sample(0, 2, 2.0)], at(4))
    assert state.ranks[0].last_step == 3 and state.ranks[0].gaps_s == (1.0, 1.0) and state.ignored == 0
    again = observe(state, [sample(0, 3, 3.0), sample(0, 2, 2.0), sample(0, 3, 3.5)], at(5))
    assert again.ranks == state.ranks  # a re-read line, an old line, the same step again
    assert again.ignored == 3


def test_a_lower_step_later_is_a_restart_that_keeps_learned_timing() -> None:
    lines = [sample(0, s, s * 0.2, step_time_s=0.2) for s in range(1, 11)]
    state = observe(ProgressState(), lines, at(3))
    restarted = observe(state, [sample(0, 6, 30.0, step_time_s=0.9)], at(31))
    r = restarted.ranks[0]
    assert (r.last_step, r.last_progress_at, r.restarts) == (6, at(30.0), 1)
    assert r.gaps_s == state.ranks[0].gaps_s  # the pause across the restart is not a step gap
    assert r.step_times_s == (*state.ranks[0].step_times_s, 0.9)
    assert restarted.longest_gap_s == pytest.approx(0.2)


def test_epoch_bars_compare_epoch_then_step() -> None:
    state = observe(ProgressState(), [sample(0, 1199, 1.0, epoch=0), sample(0, 3, 2.0, epoch=1)], at(3))
    assert state.ranks[0].restarts == 0 and state.ranks[0].last_step == 3 and state.ranks[0].gaps_s == (1.0,)


def test_future_timestamps_are_taken_as_now_and_naive_ones_as_utc() -> None:
    naive = datetime(2026, 11, 30, 4, 0, 5)  # noqa: DTZ001 - a log line without a zone
    state = observe(ProgressState(), [sample(0, 1, 60.0), ProgressSample(rank=1, step=1, at=naive)], at(10))
    assert state.ranks[0].last_progress_at == at(10) and state.ranks[1].last_progress_at == at(5)
    assert observe(ProgressState(), [], naive).watching_since == at(5)


def test_note_activity_and_note_restart() -> None:
    state = observe(ProgressState(), [sample(0, 5, 1.0), sample(0, 6, 2.0)], at(2))
    busy = note_activity(state, 0, at(50))
    assert busy.ranks[0].last_activity_at == at(50) and busy.ranks[0].last_heard_at == at(50)
    assert note_activity(busy, 0, at(40)) is busy  # an older mtime says nothing new
    with_new_rank = note_activity(busy, 7, at(45))
    assert [r.rank for r in with_new_rank.ranks] == [0, 7] and with_new_rank.ranks[1].last_step is None
    with pytest.raises(ValueError, match="rank must be >= 0"):
        note_activity(state, -1, at(1))

    requeued = note_restart(state, at(100))
    assert requeued.restarted_at == at(100) and requeued.ranks[0].gaps_s == (1.0,)
    # The new attempt resumed past the old last step (its checkpoint was the last step): no gap across the restart.
    resumed = observe(requeued, [sample(0, 7, 400.0), sample(0, 8, 400.5)], at(401))
    assert resumed.ranks[0].gaps_s == (1.0, 0.5) and resumed.longest_gap_s == 1.0


def test_ring_is_bounded_and_configurable() -> None:
    state = ProgressState(ring=8)
    state = observe(state, [sample(0, s, s * 0.1, step_time_s=s / 100) for s in range(1, 101)], at(20))
    r = state.ranks[0]
    assert len(r.gaps_s) == 8 and len(r.step_times_s) == 8 and r.step_times_s[-1] == 1.0 and r.step_time_total == 100


def test_ranks_past_the_cap_are_summarised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workflows.domain.progress.MAX_TRACKED_RANKS", 2)
    state = observe(ProgressState(), [sample(r, 1, 1.0) for r in range(4)], at(2))
    assert [r.rank for r in state.ranks] == [0, 1] and state.ignored == 0
    assert state.untracked is not None and state.untracked.highest_rank == 3 and state.untracked.samples == 2
    assert state.untracked.last_step == 1 and state.untracked.last_progress_at == at(1.0)
    assert state.ranks_note.startswith("tracking 2 of at least 4 ranks one by one")
    assert observe(ProgressState(), [sample(0, 1, 1.0)], at(2)).ranks_note == ""


@pytest.mark.parametrize(
    "bad",
    [
        {"rank": -1, "step": 1, "at": T0},
        {"rank": 0, "step": -1, "at": T0},
        {"rank": 0, "step": 1, "at": T0, "step_time_s": float("nan")},
        {"rank": 0, "step": 1, "at": T0, "compute_time_s": -0.1},
        {"rank": 0, "step": 1, "at": T0, "step_time_s": 1e12},
        {"rank": 0, "step": 1, "at": "yesterday"},
        {"rank": 0, "step": 1, "at": T0, "surprise": 1},
    ],
)
def test_bad_samples_are_a_clear_validation_error(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ProgressSample.model_validate(bad)


def test_state_round_trips_through_json_and_stays_small() -> None:
    run = simulate(Sim(duration_s=60))
    state = observe(ProgressState(), run.lines, at(60))
    state, _ = assess_stragglers(state, StragglerPolicy())
    dumped = json.dumps(state.model_dump(mode="json"))
    assert ProgressState.model_validate(json.loads(dumped)) == state
    per_rank = len(dumped) / len(state.ranks)
    assert per_rank < 4000, per_rank  # 4 ranks: well under a heartbeat's limit; 512 ranks ~2 MB would not be


# ----- properties -------------------------------------------------------------------------------------------------

_times = st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False)
_samples = st.builds(
    ProgressSample,
    rank=st.integers(0, 5),
    node=st.sampled_from(["", "n1", "n2"]),
    step=st.integers(0, 40),
    at=st.integers(0, 500).map(lambda s: at(s / 4)),
    step_time_s=_times,
    compute_time_s=_times,
    epoch=st.none() | st.integers(0, 2),
)
_events = st.lists(
    st.one_of(
        st.tuples(st.just("observe"), st.lists(_samples, max_size=20), st.integers(0, 600)),
        st.tuples(st.just("activity"), st.integers(0, 6), st.integers(0, 600)),
        st.tuples(st.just("restart"), st.none(), st.integers(0, 600)),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(_events, st.integers(4, 16))
def test_observe_never_raises_and_state_stays_bounded(events: list[tuple[str, object, int]], ring: int) -> None:
    state = ProgressState(ring=ring)
    ranks_seen: set[int] = set()
    for kind, payload, t in events:
        if kind == "observe":
            assert isinstance(payload, list)
            before = state
            state = observe(state, payload, at(t / 4))
            ranks_seen |= {s.rank for s in payload}
            assert state.ignored - before.ignored <= len(payload)
        elif kind == "activity":
            assert isinstance(payload, int)
            state = note_activity(state, payload, at(t / 4))
            ranks_seen.add(payload)
        else:
            state = note_restart(state, at(t / 4))
        state, verdict = assess_stragglers(state, StragglerPolicy(window=3))
        hang = assess_hang(state, at(t / 4 + 100), HangPolicy(floor_s=1, min_intervals=2, startup_s=5))
        assert {r.rank for r in state.ranks} <= ranks_seen
        assert [r.rank for r in state.ranks] == sorted(r.rank for r in state.ranks)
        for r in state.ranks:
            assert max(len(r.gaps_s), len(r.step_times_s), len(r.compute_times_s)) <= ring
            assert all(g >= 0 for g in r.gaps_s)
        assert hang.window_s >= 0 and 0 <= hang.confidence <= 1
        assert all(s.slowdown > 1 for s in verdict.stragglers)
    assert ProgressState.model_validate(json.loads(json.dumps(state.model_dump(mode="json")))) == state


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30)), max_size=40, unique_by=lambda x: x[1]))
def test_replaying_lines_already_seen_changes_nothing(lines: list[tuple[int, int]]) -> None:
    # Distinct times per line: a re-read after an activity retry must neither move steps nor learn gaps.
    batch = [sample(rank, step, t) for t, (rank, step) in enumerate(lines)]
    state = observe(ProgressState(), batch, at(100))
    again = observe(state, batch, at(101))
    assert again.ranks == state.ranks and again.longest_gap_s == state.longest_gap_s


def test_a_poll_without_samples_gives_the_state_back() -> None:
    """Nothing to apply: the state itself (its values are what copying would give); the first poll still dates
    ``watching_since``, and a rank whose rings exceed ``ring`` is still cut to it."""
    state = observe(ProgressState(), [sample(0, 1, 1.0), sample(0, 2, 2.0, step_time_s=1.0)], at(2))
    assert observe(state, [], at(50)) is state and observe(state, iter(()), at(50)) is state
    assert observe(ProgressState(), [], at(3)).watching_since == at(3)
    wide = state.model_copy(update={"ranks": (state.ranks[0].model_copy(update={"gaps_s": (1.0,) * 9}),), "ring": 4})
    assert observe(wide, [], at(50)).ranks[0].gaps_s == (1.0,) * 4
