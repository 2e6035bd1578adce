"""Stragglers: slow ranks and nodes against their peers, a slow job against its own baseline, and whether a restart
pays off. Pure, no Temporal; the simulation is ``test_progress_state.simulate``."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from tests.unit.policy.test_progress_state import Sim, Watch, at, sample, simulate
from workflows.domain.progress import ProgressSample, ProgressState, note_restart, observe
from workflows.domain.straggler import StragglerMetric, StragglerPolicy, StragglerVerdict
from workflows.policy.straggler import assess_stragglers, median, restart_pays_off

POLICY = StragglerPolicy()


def _steps(
    compute: dict[int, list[float]], *, first_step: int = 1, t0: float = 0.0, step_time: float | None = None
) -> list[ProgressSample]:
    """One line per rank per step; every rank's step time is the slowest compute (+ 0.03 s), as in sync DP."""
    count = len(next(iter(compute.values())))
    out = []
    for i in range(count):
        slowest = max(c[i] for c in compute.values())
        for rank, c in compute.items():
            out.append(
                sample(
                    rank,
                    first_step + i,
                    t0 + i * 0.25 + rank * 0.001,
                    node=f"n{rank // 2 + 1}",
                    compute_time_s=c[i],
                    step_time_s=step_time if step_time is not None else slowest + 0.03,
                )
            )
    return out


def _run(
    samples: list[ProgressSample], state: ProgressState | None = None, *, policy: StragglerPolicy = POLICY
) -> tuple[ProgressState, StragglerVerdict]:
    state = observe(state or ProgressState(), samples, at(10_000))
    return assess_stragglers(state, policy)


# ----- the simulation ---------------------------------------------------------------------------------------------


def test_healthy_job_is_never_flagged() -> None:
    """10 minutes, 4 ranks on 2 nodes, lognormal jitter, 3x blips, checkpoint pauses: no false positive."""
    run = simulate(Sim())
    polls = list(Watch().polls(run, 600))
    assert len(polls) == 600 and sum(p.new_lines for p in polls) == len(run.lines)
    assert [p.t for p in polls if p.stragglers.stragglers] == []
    assert [p.t for p in polls if p.stragglers.job and p.stragglers.job.slow] == []
    last = polls[-1].stragglers
    assert last.metric is StragglerMetric.COMPUTE_TIME and last.assessed_ranks == 4
    assert last.job is not None and 0.9 < last.job.slowdown < 1.1


@pytest.mark.parametrize("factor", [1.5, 2.0])
@pytest.mark.parametrize("seed", range(5))
def test_slow_rank_is_flagged_within_ten_steps(factor: float, seed: int) -> None:
    sim = Sim(duration_s=360, slow_rank=3, slow_from_s=300, slow_factor=factor, seed=seed)
    run = simulate(sim)
    assert run.slow_from_step is not None and run.slow_from_t is not None
    flagged = None
    job_slow = None
    for poll in Watch(round_trip=True).polls(run, 360):
        verdict = poll.stragglers
        if poll.t < run.slow_from_t:
            assert not verdict.stragglers, poll.t
        elif flagged is None and verdict.stragglers:
            flagged = poll
        if job_slow is None and verdict.job is not None and verdict.job.slow:
            job_slow = poll
    assert flagged is not None
    slow_steps = (flagged.state.ranks[3].last_step or 0) - run.slow_from_step + 1
    assert slow_steps <= 10, f"flagged after {slow_steps} slow steps, {flagged.t - run.slow_from_t:.2f} s"
    (straggler,) = flagged.stragglers.stragglers
    assert (straggler.rank, straggler.node) == (3, "n2")
    assert straggler.slowdown == pytest.approx(factor, rel=0.2)
    assert "rank 3 (n2): compute_time" in straggler.evidence
    (node,) = flagged.stragglers.nodes
    assert (node.node, node.ranks, node.ranks_assessed, node.whole_node) == ("n2", (3,), 2, False)
    # Every rank's step time rose with it (they wait for rank 3): the job-level check sees it too, later.
    assert job_slow is not None and job_slow.t > run.slow_from_t
    assert job_slow.stragglers.job is not None and job_slow.stragglers.job.slowdown > 1.3


# ----- cross-rank verdicts ----------------------------------------------------------------------------------------


def test_a_blip_never_flags() -> None:
    compute = {r: [0.2] * 20 for r in range(4)}
    compute[2][10] = 0.6
    compute[2][12] = 0.6  # two blips in one window: the median of 5 still ignores them
    state = ProgressState()
    for i in range(20):  # one poll per step
        state = observe(state, [s for s in _steps(compute) if s.step == i + 1], at(1000))
        state, verdict = assess_stragglers(state, POLICY)
        assert not verdict.stragglers and not verdict.suspects


def test_persistence_counts_steps_not_polls() -> None:
    compute = {r: [0.2] * 12 for r in range(4)}
    for i in range(5, 12):
        compute[1][i] = 0.4
    # The smoothed value crosses at the 3rd slow step (the 8th), so steps 8..12 are slow ones: a streak of 5.
    state, verdict = _run(_steps(compute))
    assert [s.rank for s in verdict.stragglers] == [1] and verdict.stragglers[0].streak == 5
    # Judging again without new lines changes nothing.
    again, verdict2 = assess_stragglers(state, POLICY)
    assert again == state and verdict2 == verdict
    # Step by step: a suspect first, a straggler at the 4th slow smoothed value.
    state = ProgressState()
    seen = []
    for step in range(1, 13):
        state = observe(state, [s for s in _steps(compute) if s.step == step], at(1000))
        state, verdict = assess_stragglers(state, POLICY)
        seen.append((len(verdict.suspects), len(verdict.stragglers)))
    assert seen[:7] == [(0, 0)] * 7 and seen[7:] == [(1, 0), (1, 0), (1, 0), (0, 1), (0, 1)]


def test_recovering_rank_resets_its_streak() -> None:
    compute = {r: [0.2] * 30 for r in range(4)}
    for i in range(5, 15):
        compute[0][i] = 0.5
    state, verdict = _run(_steps(compute))
    assert not verdict.stragglers and state.ranks[0].straggler_streak == 0


def test_whole_node_when_all_its_ranks_straggle() -> None:
    compute = {r: [0.2 if r < 4 else 0.3] * 10 for r in range(6)}  # ranks 4, 5 are node n3
    _, verdict = _run(_steps(compute))
    assert [s.rank for s in verdict.stragglers] == [4, 5]
    (node,) = verdict.nodes
    assert (node.node, node.ranks, node.whole_node, round(node.slowdown, 2)) == ("n3", (4, 5), True, 1.5)


def test_too_few_ranks_to_compare() -> None:
    _, verdict = _run(_steps({0: [0.2] * 10, 1: [0.6] * 10}))
    assert verdict.metric is None and not verdict.stragglers and "fewer than 3" in verdict.summary


def test_metric_falls_back_to_step_time_and_sync_step_times_flag_nobody() -> None:
    lines = [s.model_copy(update={"compute_time_s": None}) for s in _steps({r: [0.2] * 10 for r in range(4)})]
    _, verdict = _run(lines)
    assert verdict.metric is StragglerMetric.STEP_TIME and not verdict.stragglers
    # Independent ranks (no collective) can straggle in step time itself.
    lines = [sample(r, i, i * 0.3, step_time_s=0.6 if r == 3 else 0.2) for i in range(1, 11) for r in range(4)]
    _, verdict = _run(lines)
    assert [s.rank for s in verdict.stragglers] == [3]


def test_forced_metric_and_switching_metric_restarts_streaks() -> None:
    compute = {r: [0.2] * 10 for r in range(4)}
    compute[3] = [0.4] * 10
    state, verdict = _run(_steps(compute))
    assert verdict.stragglers and state.straggler_metric == "compute_time"
    state, verdict = assess_stragglers(state, StragglerPolicy(metric="step_time"))
    assert verdict.metric is StragglerMetric.STEP_TIME and not verdict.stragglers
    assert all(r.straggler_streak == 0 for r in state.ranks)


def test_noisy_ranks_raise_the_threshold() -> None:
    # Each rank wanders +-30% by itself: a rank 1.3x above its peers right now is within that noise.
    wobble = [0.14, 0.26, 0.2, 0.15, 0.25, 0.2, 0.13, 0.27, 0.2, 0.14, 0.26, 0.2]
    compute = {r: wobble[r:] + wobble[:r] for r in range(4)}
    compute[3] = [v * 1.3 for v in compute[3]]
    _, verdict = _run(_steps(compute))
    assert verdict.threshold_s is not None and verdict.peer_median_s is not None
    assert verdict.threshold_s > 1.3 * verdict.peer_median_s and not verdict.stragglers


def test_zero_times_give_no_verdict() -> None:
    _, verdict = _run(_steps({r: [0.0] * 10 for r in range(4)}, step_time=0.0))
    assert verdict.threshold_s is None and not verdict.stragglers and verdict.job is None


# ----- the job against its own baseline ---------------------------------------------------------------------------


def test_job_slowdown_with_step_times_only() -> None:
    state = ProgressState()
    lines = [sample(0, i, i * 0.2, step_time_s=0.2) for i in range(1, 41)]
    state, verdict = _run(lines, state)
    assert verdict.metric is None and verdict.job is not None and not verdict.job.slow
    assert state.baseline_step_s == pytest.approx(0.2)
    slower = [sample(0, i, i * 0.3, step_time_s=0.3) for i in range(41, 61)]
    state, verdict = _run(slower, state)
    assert verdict.job is not None and verdict.job.slow and verdict.job.slowdown == pytest.approx(1.5)
    assert state.baseline_step_s == pytest.approx(0.2)  # the baseline is what the job did when it ran well
    assert "job slowed down" in verdict.summary and not verdict.stragglers
    # A restart keeps the baseline and starts the streak over.
    restarted = note_restart(state, at(100))
    assert restarted.baseline_step_s == state.baseline_step_s and restarted.job_slow_streak == 0


def test_no_baseline_yet() -> None:
    _, verdict = _run([sample(0, i, i * 0.2, step_time_s=0.2) for i in range(1, 20)])
    assert verdict.job is None


# ----- restart_pays_off -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slowdown", "remaining_s", "cost_s", "expected"),
    [
        (2.0, 3600, 600, True),  # loses 1800 s
        (1.2, 3600, 600, False),  # loses 600 s: not more than the restart
        (1.25, 3600, 600, True),  # loses 720 s
        (1.0, 1e9, 0, False),  # not slow
        (0.8, 1e9, 0, False),  # faster than normal
        (3.0, 0, 0, False),  # nothing left to lose
    ],
)
def test_restart_pays_off(slowdown: float, remaining_s: float, cost_s: float, expected: bool) -> None:
    assert restart_pays_off(slowdown, remaining_s, cost_s) is expected


@pytest.mark.parametrize(
    "args", [(math.nan, 1, 1), (2, -1, 1), (2, 1, math.inf), (0, 1, 1), (-2, 1, 1), (2, math.nan, 1)]
)
def test_restart_pays_off_rejects_nonsense(args: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        restart_pays_off(*args)


# ----- plumbing ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [{"window": 0}, {"min_ranks": 2}, {"persistence": 0}, {"k": -1}, {"job_slowdown_min": 1.0}, {"metric": "gpu"}],
)
def test_policy_rejects_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        StragglerPolicy.model_validate(bad)


def test_median() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert median([1e308, 1e308]) == 1e308  # no overflow


def test_verdict_round_trips() -> None:
    compute = {r: [0.2] * 10 for r in range(4)}
    compute[3] = [0.4] * 10
    _, verdict = _run(_steps(compute))
    assert verdict.flagged
    assert StragglerVerdict.model_validate(verdict.model_dump(mode="json")) == verdict
