"""Scenarios of `rebound bench recovery`: ground truth, the fault's target, the ``--scenarios`` list (pure)."""

from __future__ import annotations

import pytest

from deploy.bench.scenarios import SCENARIOS, GroundTruth, ground_truth, parse_scenarios, pick_target
from deploy.demo.common import RankInfo
from tests.unit.bench.builders import JOB, record


def test_ground_truth_per_scenario() -> None:
    assert ground_truth("rank-crash", record()) == GroundTruth(node="n2", restart=True, drain=False)
    assert ground_truth("xid", record("gpu-fault")) == GroundTruth(node="n2", restart=True)
    assert ground_truth("node-crash", record("node-crash", rank=None)) == GroundTruth(node="n2", restart=True)
    assert ground_truth("user-bug", record("user-bug", node=None, rank=None)) == GroundTruth(node=None, restart=False)
    with pytest.raises(ValueError):
        ground_truth("node-crash", record("node-crash", node=None, rank=None))


def _rank(rank: int, node: str) -> RankInfo:
    return RankInfo(
        pid=100 + rank,
        rank=rank,
        world_size=4,
        node=node,
        local_rank=rank % 2,
        restart=0,
        job_id=JOB,
        gpu=rank % 2,
        proc_start=None,
        started_at="2026-11-30T04:00:00.000Z",
    )


def test_pick_target_is_first_rank_off_the_batch_host() -> None:
    ranks = [_rank(3, "n2"), _rank(0, "n1"), _rank(2, "n2"), _rank(1, "n1")]
    assert pick_target(ranks).rank == 2
    with pytest.raises(ValueError):
        pick_target([_rank(0, "n1"), _rank(1, "n1")])
    with pytest.raises(ValueError):
        pick_target([_rank(1, "n1")])


def test_parse_scenarios() -> None:
    assert parse_scenarios(None) == SCENARIOS
    assert parse_scenarios("all") == SCENARIOS
    assert parse_scenarios("xid, user-bug,xid") == ("xid", "user-bug")
    with pytest.raises(ValueError):
        parse_scenarios("disk-full")
    with pytest.raises(ValueError):
        parse_scenarios(",")


def test_every_bench_fault_has_one_injection() -> None:
    # One injector for both lab benchmarks (``BenchContext.inject``): every scenario and launcher fault is in it.
    from deploy.bench.context import INJECTED
    from deploy.bench.launchers import FAULTS

    assert set(SCENARIOS) | set(FAULTS) == set(INJECTED)
    assert INJECTED["rank-kill"] == "kill" and INJECTED["xid"] == "gpu-fault"
