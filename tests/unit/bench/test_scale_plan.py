"""The scale benchmark's pure parts: the fault schedule, the log lines, the server's action counters."""

from __future__ import annotations

from collections import Counter

import pytest

from activities.logs.crash import classify
from activities.logs.line import LogLine, split_prefix
from activities.logs.progress import parse_step
from deploy.scale.faults import FaultKind, faults_per_kind, plan_faults
from deploy.scale.logwriter import crash_lines, step_line
from deploy.scale.measure import HEARTBEAT_ACTION, actions_from_metrics
from workflows.domain.findings import FindingKind


def test_faults_per_kind_scale_with_the_cluster() -> None:
    assert faults_per_kind(5000) == 100
    assert faults_per_kind(10000) == 200
    assert faults_per_kind(1000) == 20
    assert faults_per_kind(100) == 5  # the floor
    assert faults_per_kind(6) == 2  # never more than a third of the jobs each
    assert faults_per_kind(100, requested=10) == 10


def test_plan_gives_each_fault_its_own_job_spread_over_the_period() -> None:
    jobs = list(range(1000, 1300))
    plan = plan_faults(jobs, 100, start_s=10, end_s=510, ranks=8)
    assert Counter(f.kind for f in plan) == {FaultKind.CRASH: 100, FaultKind.XID: 100, FaultKind.HANG: 100}
    assert len({f.job_id for f in plan}) == 300
    times = [f.at_s for f in plan]
    assert times == sorted(times) and 10 <= times[0] < 12 and 508 < times[-1] <= 510
    assert all(0 <= f.target < 8 for f in plan)
    first_half = sum(1 for t in times if t < 260)
    assert 140 <= first_half <= 160  # even spread, not a burst
    assert plan == plan_faults(jobs, 100, start_s=10, end_s=510, ranks=8)  # seeded


def test_plan_refuses_more_faults_than_jobs() -> None:
    with pytest.raises(ValueError, match="need as many jobs"):
        plan_faults([1, 2], 1, start_s=0, end_s=10, ranks=8)


def _line(text: str) -> LogLine:
    return LogLine(path="/x/rank-3.log", rank=3, text=text, offset=0, at=split_prefix(text).at)


def test_step_line_is_a_step_the_progress_rules_read() -> None:
    mark = parse_step(_line(step_line(3, 8, "g00001", 120, 1_800_000_000.0).rstrip("\n")))
    assert mark is not None and mark.step == 120


def test_crash_lines_are_a_cuda_crash_of_the_rank() -> None:
    lines = crash_lines(3, 8, "g00001", 1_800_000_000.0).splitlines()
    found = [f for line in lines for f in classify(_line(line))]
    assert any(f.kind is FindingKind.CUDA_ERROR and f.rank == 3 for f in found)


METRICS = "\n".join(
    [
        "# TYPE action counter",
        'action{action_type="grpc_RecordActivityTaskHeartbeat",namespace="default",service_name="frontend"} 42',
        'action{action_type="command_ScheduleActivityTask",namespace="default",service_name="frontend"} 7',
        'action{action_type="grpc_StartWorkflowExecution",namespace="temporal_system",service_name="frontend"} 2',
        'action_latency_bucket{le="1"} 5',
    ]
)


def test_actions_are_read_per_type_for_one_namespace() -> None:
    actions = actions_from_metrics(METRICS, "default")
    assert actions == {HEARTBEAT_ACTION: 42.0, "command_ScheduleActivityTask": 7.0}
