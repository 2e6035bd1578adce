"""The node check's verdict from its ranks' reports, and the Fleet's record of it (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.slurm.maintenance import check_script
from workflows.domain.fleet import FleetPolicy, FleetState, NodeIncident, NodeLifecycle, NodeRecord
from workflows.domain.node_check import (
    RANK_REPORT_PREFIX,
    CheckOutcome,
    NodeCheckPolicy,
    NodeCheckReleaseResult,
    NodeCheckRunResult,
    ProbeResult,
    RankReport,
)
from workflows.policy.fleet.node_check import (
    after_node_check,
    after_release,
    check_token,
    held_reason,
    node_check_wanted,
)
from workflows.policy.node_check import judge_check, read_reports

NOW = datetime(2026, 12, 6, 6, 0, tzinfo=UTC)
OURS = "rebound: 42-1 xid-79"


def _report(rank: int, ok: bool = True, detail: str = "2 ranks") -> RankReport:
    return RankReport(
        node="n2", rank=rank, world=2, probes=(ProbeResult(name="gloo-all-reduce", ok=ok, detail=detail),)
    )


def test_read_reports_skips_noise_other_nodes_and_repeats() -> None:
    lines = [
        "srun: error: n2: task 1: Exited with exit code 1",
        RANK_REPORT_PREFIX + _report(1).model_dump_json(),
        "lab: injected " + RANK_REPORT_PREFIX + "{not json",
        RANK_REPORT_PREFIX + _report(0).model_dump_json(),
        RANK_REPORT_PREFIX + _report(0, ok=False).model_dump_json(),  # the first wins
        RANK_REPORT_PREFIX + _report(0).model_copy(update={"node": "n9"}).model_dump_json(),
    ]
    reports = read_reports(lines, "n2")
    assert [r.rank for r in reports] == [0, 1] and all(p.ok for r in reports for p in r.probes)


def test_every_rank_passing_passes() -> None:
    outcome, detail = judge_check((_report(0), _report(1)), 2, 17) or (None, "")
    assert outcome is CheckOutcome.PASSED and detail.startswith("check job 17 passed"), detail


def test_one_failed_probe_fails_at_once_naming_rank_and_job() -> None:
    verdict = judge_check((_report(0, ok=False, detail="DistStoreError: timed out"),), 2, 17)
    assert verdict is not None and verdict[0] is CheckOutcome.FAILED
    assert "check job 17" in verdict[1] and "rank 0 gloo-all-reduce: DistStoreError" in verdict[1]


def test_waiting_for_ranks_then_timeout_or_end_fails() -> None:
    assert judge_check((_report(0),), 2, 17) is None
    timed_out = judge_check((_report(0),), 2, 17, timed_out_s=60)
    assert timed_out is not None and timed_out[0] is CheckOutcome.FAILED and "1 of 2 ranks" in timed_out[1]
    ended = judge_check((), 2, 17, ended="FAILED")
    assert ended is not None and ended[0] is CheckOutcome.FAILED and "ended FAILED" in ended[1]


def test_skipped_tools_are_not_failures() -> None:
    skipped = ProbeResult(name="dcgmi-diag", ok=True, skipped=True, detail="dcgmi not installed")
    r0 = _report(0).model_copy(update={"probes": (*_report(0).probes, skipped)})
    verdict = judge_check((r0, _report(1)), 2, 5)
    assert verdict is not None and verdict[0] is CheckOutcome.PASSED and "not on the node: dcgmi-diag" in verdict[1]


def _state(**record: object) -> FleetState:
    base = NodeRecord(node="n2", state=NodeLifecycle.CHECKING, drained_at=NOW - timedelta(minutes=5), drain_reason=OURS)
    return FleetState(cluster="lab", nodes={"n2": base.model_copy(update=record)})


def _result(outcome: CheckOutcome, detail: str = "check job 17: x", **kw: str) -> NodeCheckRunResult:
    return NodeCheckRunResult(node="n2", outcome=outcome, detail=detail, job_id=17, **kw)


def test_passed_returns_the_node_and_releases_without_a_drain() -> None:
    state, drain, release = after_node_check(_state(), "n2", _result(CheckOutcome.PASSED, reservation="r"), NOW)
    rec = state.nodes["n2"]
    assert rec.state is NodeLifecycle.HEALTHY and rec.returned_at == NOW and (drain, release) == ("", True)
    assert rec.checks[-1].endswith("passed: check job 17: x")


def test_failed_holds_with_rebounds_reason_naming_the_job() -> None:
    state, drain, release = after_node_check(_state(), "n2", _result(CheckOutcome.FAILED, reservation="r"), NOW)
    rec = state.nodes["n2"]
    assert rec.state is NodeLifecycle.HELD and release and drain == rec.drain_reason
    assert drain.startswith("rebound: held for repair: node check job 17 failed")


def test_held_reason_is_bounded() -> None:
    assert len(held_reason(_result(CheckOutcome.FAILED, detail="x" * 500))) == 200


def test_inconclusive_drains_again_with_ours_and_waits_a_full_interval() -> None:
    state, drain, release = after_node_check(_state(), "n2", _result(CheckOutcome.INCONCLUSIVE, reservation="r"), NOW)
    rec = state.nodes["n2"]
    assert rec.state is NodeLifecycle.DRAINED and drain == OURS and release and rec.drained_at == NOW


def test_someone_elses_drain_is_external_and_nothing_is_released() -> None:
    result = _result(CheckOutcome.NOT_OURS, current_reason="NHC: bad DIMM", detail="drained by someone else")
    state, drain, release = after_node_check(_state(), "n2", result, NOW)
    assert state.nodes["n2"].state is NodeLifecycle.EXTERNAL and "NHC: bad DIMM" in state.nodes["n2"].reason
    assert (drain, release) == ("", False)


def test_a_drain_by_someone_else_found_at_release_makes_the_node_theirs() -> None:
    state, drain, _ = after_node_check(_state(), "n2", _result(CheckOutcome.PASSED, reservation="r"), NOW)
    rel = NodeCheckReleaseResult(node="n2", drained=False, current_reason="NHC: fan")
    assert after_release(state, "n2", drain, rel, NOW).nodes["n2"].state is NodeLifecycle.EXTERNAL
    ours = NodeCheckReleaseResult(node="n2", drained=False, current_reason="")
    assert after_release(state, "n2", drain, ours, NOW).nodes["n2"].state is NodeLifecycle.HEALTHY


def test_check_wanted_only_where_a_pass_could_return_the_node() -> None:
    record = _state().nodes["n2"]
    assert node_check_wanted(record, FleetPolicy(), NOW)
    assert not node_check_wanted(record, FleetPolicy(node_check=NodeCheckPolicy(enabled=False)), NOW)
    assert not node_check_wanted(record, FleetPolicy(return_healthy_nodes=False), NOW)
    lemon = record.model_copy(
        update={"incidents": tuple(NodeIncident(at=NOW, job_id=i, incident=f"{i}-1", cause="x") for i in range(3))}
    )
    assert not node_check_wanted(lemon, FleetPolicy(), NOW)


def test_check_token_is_stable_per_check_and_new_for_the_next() -> None:
    record = _state().nodes["n2"]
    assert check_token("f", "r1", "n2", record) == check_token("f", "r1", "n2", record)
    assert check_token("f", "r1", "n2", record) != check_token(
        "f", "r1", "n2", record.model_copy(update={"checks": ("x",)})
    )
    assert check_token("f", "r1", "n2", record) != check_token("f", "r2", "n2", record)  # a Fleet started afresh


def test_check_script_quotes_every_argument() -> None:
    script = check_script(("/opt/py thon", "-m", "x;rm -rf /"), 2).decode()
    assert "exec srun --ntasks=2 --kill-on-bad-exit=0 '/opt/py thon' -m 'x;rm -rf /'" in script
