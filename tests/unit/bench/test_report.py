"""The summary, JSON report and table of `rebound bench recovery` (pure)."""

from __future__ import annotations

from deploy.bench.recovery import bench_report, format_table, scenario_summary
from tests.unit.bench.builders import drain, incident, record, requeue, score, status
from workflows.domain.recovery import RecoveryState

# ----- summaries ------------------------------------------------------------------------------------------------


def test_summary_excludes_failed_runs_from_stats_and_has_exact_keys() -> None:
    ok = [
        score("rank-crash", record(), status(incident(detected=d, actions=(drain("n2"), requeue()))))
        for d in (0.2, 0.4, 0.6)
    ]
    failed = score("rank-crash", record(), status(incident(resumed=None)), timed_out=True)
    s = scenario_summary([*ok, failed])
    assert set(s) == {"runs", "detection_s", "action_s", "resume_s", "lost_steps", "false_actions", "failed_runs"}
    assert s["runs"] == 4 and s["failed_runs"] == 1
    assert s["detection_s"] == {"mean": 0.4, "p50": 0.4, "p95": 0.58}
    assert s["lost_steps"] == {"mean": 12.0, "p50": 12.0, "p95": 12.0}


def test_user_bug_summary_has_null_action_and_resume() -> None:
    inc = incident(nodes=(), cause="user-bug", retryable=False, restarted=None, resumed=None)
    r = score(
        "user-bug", record("user-bug", node=None, rank=None), status(inc, state=RecoveryState.GAVE_UP, restarts=0)
    )
    report = bench_report([r], ["user-bug", "xid"])
    assert list(report) == ["scenarios", "runs"]
    ub = report["scenarios"]["user-bug"]
    assert ub["action_s"] is None and ub["resume_s"] is None and ub["lost_steps"] is None
    assert ub["detection_s"] == {"mean": 0.2, "p50": 0.2, "p95": 0.2}
    assert report["scenarios"]["xid"]["runs"] == 0 and report["scenarios"]["xid"]["detection_s"] is None
    table = format_table(report)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["scenario", "runs", "failed", "attributed"]
    assert lines[2].split() == ["user-bug", "1", "0", "1/1", "0.20/0.20/0.20", "-", "-", "-", "0"]
