"""``judge_stragglers`` computes the noise term only when a value passes the cheap bound and builds the verdict only
when asked: poll after poll it must give the state and verdict the old ``assess_stragglers`` gave
(``reference_assess_stragglers``, kept verbatim), and the watch's shortcut answers (``flagged``, ``node_names``)
must be the verdict's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.policy.reference_straggler import reference_assess_stragglers
from workflows.domain.progress import ProgressState, Sample, observe
from workflows.domain.straggler import StragglerPolicy
from workflows.policy.straggler import assess_stragglers, judge_stragglers

T0 = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)

_policies = st.builds(
    StragglerPolicy,
    metric=st.sampled_from(["auto", "compute_time", "step_time"]),
    window=st.integers(1, 6),
    k=st.sampled_from([0.0, 1.0, 3.0]),
    relative_min=st.sampled_from([0.0, 0.05, 0.2]),
    min_ranks=st.integers(3, 4),
    persistence=st.integers(1, 4),
    job_slowdown_min=st.sampled_from([1.1, 1.3]),
    job_window=st.integers(1, 8),
    job_persistence=st.integers(1, 4),
    baseline_samples=st.integers(1, 10),
)


@st.composite
def _polls(draw: st.DrawFn) -> list[list[Sample]]:
    """Polls of step lines from 3-6 ranks on two nodes: some ranks slower (or slowing), noise, gaps in logging."""
    ranks = draw(st.integers(3, 6))
    speed = [draw(st.sampled_from([1.0, 1.0, 1.0, 1.25, 2.0])) for _ in range(ranks)]
    slowing = draw(st.sampled_from([1.0, 1.0, 1.5]))  # the whole job slows down half-way
    compute = draw(st.booleans())
    polls = []
    count = draw(st.integers(1, 14))
    for n in range(count):
        lines = []
        for rank in range(ranks):
            if draw(st.integers(0, 5)) == 0:
                continue  # this rank logged nothing this poll
            jitter = draw(st.sampled_from([0.0, 0.0, 0.01, -0.02, 0.5]))
            step_s = round((0.5 + jitter) * speed[rank] * (slowing if n > count // 2 else 1.0), 4)
            lines.append(
                Sample(
                    rank,
                    "n1" if rank < ranks // 2 else "n2",
                    n + 1,
                    T0 + timedelta(seconds=n + rank / 10),
                    step_s,
                    round(step_s * 0.8, 4) if compute or rank % 2 else None,
                    None,
                )
            )
        polls.append(lines)
    return polls


@settings(max_examples=500, deadline=None)
@given(policy=_policies, polls=_polls(), ring=st.integers(4, 12))
def test_judgement_equals_the_old_assessment(policy: StragglerPolicy, polls: list[list[Sample]], ring: int) -> None:
    new = old = ProgressState(ring=ring)
    for n, lines in enumerate(polls):
        now = T0 + timedelta(seconds=n + 1)
        new, old = observe(new, lines, now), observe(old, lines, now)
        new, judged = judge_stragglers(new, policy)
        old, expected = reference_assess_stragglers(old, policy)
        assert new == old
        assert judged.verdict() == expected
        assert judged.flagged == expected.flagged
        assert judged.node_names == {n.node for n in expected.nodes}
        assert assess_stragglers(new, policy)[1] == reference_assess_stragglers(old, policy)[1]  # nothing new: same
