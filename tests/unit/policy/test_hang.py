"""Hang verdicts: the window (startup, learned, floor, longest pause, the job's own), silence across ranks, and the
rank that stopped first. Pure, no Temporal; the simulation is ``test_progress_state.simulate``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.unit.policy.test_progress_state import Sim, Watch, at, sample, simulate
from workflows.domain.hang import HangPolicy, HangVerdict, WindowBasis
from workflows.domain.progress import ProgressSample, ProgressState, note_activity, note_restart, observe
from workflows.policy.hang import assess_hang, hang_window, may_be_hung, percentile

FAST = HangPolicy(floor_s=5.0, min_intervals=5, startup_s=120.0)


def _steady(ranks: int = 4, steps: int = 30, dt: float = 0.5, t0: float = 0.0) -> ProgressState:
    lines = [
        sample(r, i, t0 + i * dt + r * 0.001, node=f"n{r // 2 + 1}") for i in range(1, steps + 1) for r in range(ranks)
    ]
    return observe(ProgressState(), lines, at(t0 + steps * dt))


# ----- the simulation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [HangPolicy(), FAST], ids=["defaults", "floor-5s"])
def test_healthy_job_never_hangs(policy: HangPolicy) -> None:
    polls = list(Watch(hang_policy=policy).polls(simulate(Sim()), 600))
    assert [p.t for p in polls if p.hang.hung] == []
    last = polls[-1].hang
    assert last.basis in (WindowBasis.FLOOR, WindowBasis.LEARNED) and not last.stalled_ranks
    assert last.summary.startswith("progressing")


@pytest.mark.parametrize(
    ("policy", "basis"), [(HangPolicy(), WindowBasis.FLOOR), (FAST, WindowBasis.LEARNED)], ids=["defaults", "floor-5s"]
)
@pytest.mark.parametrize("seed", range(3))
def test_stopped_rank_hangs_the_job_within_window_plus_one_poll(
    policy: HangPolicy, basis: WindowBasis, seed: int
) -> None:
    run = simulate(Sim(duration_s=600, stop_rank=3, stop_at_s=300, seed=seed))
    watch = Watch(hang_policy=policy, round_trip=True)
    first = next(p for p in watch.polls(run, 600) if p.hang.hung)
    verdict = first.hang
    assert verdict.basis is basis
    delay = first.t - run.last_line_t
    assert verdict.window_s <= delay <= verdict.window_s + watch.poll_s, delay
    assert verdict.silent_for_s == pytest.approx(delay)
    assert (verdict.culprit_rank, verdict.culprit_node, verdict.confidence) == (3, "n2", 0.8)
    assert verdict.stalled_ranks == (0, 1, 2, 3)
    last_steps = {r.rank: r.last_step or 0 for r in verdict.ranks}
    assert last_steps[3] == last_steps[0] - 1 and len({last_steps[r] for r in (0, 1, 2)}) == 1
    assert "likely culprit rank 3 on n2" in verdict.summary and f"{basis}" in verdict.summary


# ----- the window -------------------------------------------------------------------------------------------------


def test_startup_window_until_enough_gaps_are_learned() -> None:
    state = observe(ProgressState(), [sample(0, 1, 0.0), sample(0, 2, 1.0)], at(1))
    window, basis, detail = hang_window(state, FAST)
    assert (window, basis) == (120.0, WindowBasis.STARTUP) and "1 of 5 gaps learned" in detail
    assert not assess_hang(state, at(100), FAST).hung
    assert assess_hang(state, at(121), FAST).hung


def test_learned_window_is_k_times_p99_and_never_below_the_floor() -> None:
    state = _steady(dt=2.0)
    window, basis, detail = hang_window(state, FAST)
    assert window == pytest.approx(10.0) and basis is WindowBasis.LEARNED and "5 x p99 2 s" in detail
    window, basis, _ = hang_window(state, HangPolicy(floor_s=60, min_intervals=5))
    assert (window, basis) == (60.0, WindowBasis.FLOOR)


def test_a_rare_long_pause_the_job_came_back_from_widens_the_window() -> None:
    state = _steady(dt=0.5)
    # A 40 s evaluation, then 100 more steps: the ring forgets it, the job's longest gap does not.
    state = observe(state, [sample(r, 31, 55.0 + r * 0.001) for r in range(4)], at(55))
    lines = [sample(r, 31 + i, 55 + i * 0.5 + r * 0.001) for i in range(1, 101) for r in range(4)]
    state = observe(state, lines, at(105))
    assert max(g for r in state.ranks for g in r.gaps_s) < 1 and state.longest_gap_s == pytest.approx(40.0, abs=0.01)
    window, basis, _ = hang_window(state, FAST)
    assert basis is WindowBasis.LONGEST and window == pytest.approx(60.0, abs=0.1)
    assert not assess_hang(state, at(105 + 50), FAST).hung
    assert assess_hang(state, at(105 + 61), FAST).hung


def test_the_jobs_own_window_overrides_the_learned_one() -> None:
    state = _steady()
    policy = FAST.model_copy(update={"override_s": 30.0})
    window, basis, _ = hang_window(state, policy)
    assert (window, basis) == (30.0, WindowBasis.OVERRIDE)
    # Before the first step, loading takes what it takes: the startup window.
    young = observe(ProgressState(), [], at(0))
    assert hang_window(young, policy)[:2] == (120.0, WindowBasis.STARTUP)
    # Once the attempt stepped, nothing needs learning: the job said how long it may be quiet.
    young = observe(young, [sample(0, 1, 1.0)], at(1))
    assert hang_window(young, policy)[:2] == (30.0, WindowBasis.OVERRIDE)
    assert hang_window(young, FAST)[:2] == (120.0, WindowBasis.STARTUP)


def test_after_a_restart_the_startup_window_applies_until_the_first_step() -> None:
    state = _steady()
    restarted = note_restart(state, at(100))
    window, basis, detail = hang_window(restarted, FAST)
    assert (window, basis) == (120.0, WindowBasis.STARTUP) and "no step since the start" in detail
    verdict = assess_hang(restarted, at(200), FAST)
    assert not verdict.hung and verdict.silent_for_s == pytest.approx(100)  # counted from the restart
    assert assess_hang(restarted, at(221), FAST).hung
    resumed = observe(restarted, [sample(r, 11, 210.0) for r in range(4)], at(210))
    assert hang_window(resumed, FAST)[:2] == (5.0, WindowBasis.FLOOR)  # learned timing kept: no startup again
    assert not assess_hang(resumed, at(214), FAST).hung and assess_hang(resumed, at(216), FAST).hung


# ----- silence ----------------------------------------------------------------------------------------------------


def test_one_slow_rank_is_not_a_hang() -> None:
    state = _steady()
    # Ranks 0-2 keep stepping (e.g. a pipeline stage that logs on its own); rank 3 has been quiet for 30 s.
    lines = [sample(r, 30 + i, 15 + i * 0.5) for i in range(1, 61) for r in range(3)]
    state = observe(state, lines, at(45))
    verdict = assess_hang(state, at(45.2), FAST)
    assert not verdict.hung and verdict.stalled_ranks == (3,) and verdict.culprit_rank is None


def test_heartbeat_activity_counts_as_progress() -> None:
    state = note_activity(_steady(), 2, at(40))
    assert not assess_hang(state, at(44), FAST).hung
    assert assess_hang(state, at(50), FAST).hung


def test_no_verdict_before_any_step_line() -> None:
    state = observe(ProgressState(), [], at(0))
    verdict = assess_hang(state, at(10_000), FAST)
    assert not verdict.hung and "no step line seen yet" in verdict.summary
    # Asked to, it judges silence alone (the startup window, from when watching began).
    assert assess_hang(state, at(121), FAST.model_copy(update={"require_progress_seen": False})).hung
    assert not assess_hang(ProgressState(), at(121), FAST.model_copy(update={"require_progress_seen": False})).hung


def test_silence_counts_from_when_watching_began() -> None:
    # Rebound starts watching a job whose last line is an hour old: wait a window before calling it hung.
    lines = [sample(0, i, i * 0.5) for i in range(1, 31)]
    state = observe(ProgressState(), lines, at(3600))
    assert not assess_hang(state, at(3601), FAST).hung
    assert assess_hang(state, at(3606), FAST).hung


# ----- the culprit ------------------------------------------------------------------------------------------------


def _hung(extra: list[ProgressSample], now: float = 200.0) -> HangVerdict:
    state = observe(_steady(), extra, at(16))
    return assess_hang(state, at(now), FAST, expected_ranks=range(6))


def test_culprit_is_the_rank_behind() -> None:
    verdict = _hung([sample(r, 31, 15.5 + r * 0.001) for r in (0, 1, 3)])
    assert verdict.hung and (verdict.culprit_rank, verdict.culprit_node, verdict.confidence) == (2, "n2", 0.8)
    assert verdict.unseen_ranks == (4, 5)  # expected, never heard from: reported, never the culprit


def test_culprit_by_earliest_last_line_when_steps_tie() -> None:
    verdict = _hung([sample(r, 31, 15.5 + (0 if r == 1 else 0.4)) for r in range(4)])
    assert (verdict.culprit_rank, verdict.confidence) == (1, 0.5)
    assert "before any peer's" in verdict.summary


def test_culprit_among_several_behind() -> None:
    verdict = _hung([sample(r, 31, 15.5 + r * 0.001) for r in (0, 1)])
    assert verdict.culprit_rank == 2 and verdict.confidence == 0.3 and "one of 2 ranks" in verdict.summary


def test_no_culprit_to_tell_when_all_stop_together() -> None:
    verdict = _hung([])
    assert verdict.hung and verdict.culprit_rank == 0 and verdict.confidence == 0.1
    assert "cannot tell" in verdict.summary


def test_single_rank_job() -> None:
    verdict = assess_hang(_steady(ranks=1), at(100), FAST)
    assert verdict.hung and (verdict.culprit_rank, verdict.confidence) == (0, 0.3)


# ----- plumbing ---------------------------------------------------------------------------------------------------


def test_percentile() -> None:
    assert percentile([], 99) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile(range(1, 101), 99) == 99
    assert percentile([5.0], 0) == 5.0


@pytest.mark.parametrize("bad", [{"k": 0}, {"floor_s": -1}, {"min_intervals": 0}, {"override_s": 0}, {"x": 1}])
def test_policy_rejects_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        HangPolicy.model_validate(bad)


def test_verdict_round_trips_and_naive_now_is_utc() -> None:
    verdict = assess_hang(_steady(), at(100).replace(tzinfo=None), FAST, expected_ranks=[0, 9])
    assert verdict.hung and verdict.silent_for_s == pytest.approx(85.0, abs=0.01)
    assert HangVerdict.model_validate(verdict.model_dump(mode="json")) == verdict


_STEPS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50), st.floats(0, 4000)), max_size=40)
_POLICIES = st.builds(
    HangPolicy,
    floor_s=st.floats(0, 600),
    startup_s=st.floats(0, 1200),
    min_intervals=st.integers(1, 10),
    override_s=st.one_of(st.none(), st.floats(1, 900)),
)


@settings(max_examples=300, deadline=None)
@given(
    steps=_STEPS,
    touches=st.lists(st.tuples(st.integers(0, 5), st.floats(0, 4000)), max_size=4),
    restart=st.one_of(st.none(), st.floats(0, 4000)),
    policy=_POLICIES,
    now=st.floats(0, 6000),
)
def test_may_be_hung_is_false_only_where_the_verdict_is_not_hung(
    steps: list[tuple[int, int, float]],
    touches: list[tuple[int, float]],
    restart: float | None,
    policy: HangPolicy,
    now: float,
) -> None:
    """``decide_poll`` builds the verdict only where ``may_be_hung``: it must never skip a hang."""
    state = ProgressState()
    for rank, step, t in sorted(steps, key=lambda s: s[2]):
        state = observe(state, [sample(rank, step, t)], at(t))
        if restart is not None and t >= restart and state.restarted_at is None:
            state = note_restart(state, at(restart))
    for rank, t in touches:
        state = note_activity(state, rank, at(t))
    verdict = assess_hang(state, at(now), policy, expected_ranks=range(4))
    if verdict.hung:
        assert may_be_hung(state, at(now), policy)
    if not may_be_hung(state, at(now), policy):
        assert not verdict.hung
