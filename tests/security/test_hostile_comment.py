"""Red team: a job's comment asks for more than the operator allows (``budget=100`` under a selector's 3,
``hang=1s``, ``stragglers=restart``, ``logs=/**``). Each outcome is read back from what discovery hands the
JobRecovery start (its spec and notes), with the operator's settings and policy file loaded as the worker does."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.slurm.snapshots import SnapshotCache
from activities.temporal.discovery import DiscoveryActivities
from tests.fakes.scheduler import FakeScheduler
from workers.discovery import load_selectors
from workers.settings import Settings
from workflows.domain.discovery import DiscoverJobsInput, StartJobRecoveryInput, StartJobRecoveryResult
from workflows.domain.recovery import RecoverySpec, StragglerAction

POLICY = """
[[select]]
name_regex = "llm-.*"
spec = { restart_budget = 3 }
"""


async def _never_started(inp: StartJobRecoveryInput) -> StartJobRecoveryResult:
    raise AssertionError("discovery only lists jobs here")


async def _discovered(settings: Settings, comments: dict[str, str]) -> dict[str, RecoverySpec]:
    """What the worker's discovery makes of jobs named ``name`` with ``comment``: name -> spec."""
    sched = FakeScheduler()
    names = {}
    for name, comment in comments.items():
        names[sched.submit(1, name=name, comment=comment).job_id] = name
    policy = settings.watch.policy_file
    acts = DiscoveryActivities(
        SnapshotCache(sched, max_age_s=0),
        load_selectors(policy) if policy is not None else [],
        start=_never_started,
        caps=settings.optin,
    )
    found = await ActivityEnvironment().run(acts.discover_jobs, DiscoverJobsInput(cluster="lab", max_wait_s=1))
    return {names[j.job_id]: j.spec for j in found.new}


async def test_budget_100_is_held_at_the_selectors_3_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    settings = Settings(watch={"policy_file": tmp_path / "policy.toml"})
    specs = await _discovered(settings, {"llm-7b": "rebound: budget=100", "other": "rebound: budget=100"})
    said = [r.getMessage() for r in caplog.records if "comment clamped" in r.getMessage()]
    assert len(said) == 2 and "budget=100 capped at 3 by operator policy (the job's selector)" in said[0]
    assert specs["llm-7b"].restart_budget == 3
    assert specs["llm-7b"].capped == ("budget=100 capped at 3 by operator policy (the job's selector)",)
    # A job the selector does not match is still held by the settings' own ceiling (default 10).
    assert specs["other"].restart_budget == 10
    assert specs["other"].capped == ("budget=100 capped at 10 by operator policy (optin.max_budget)",)


async def test_the_settings_ceilings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REBOUND_OPTIN__MAX_BUDGET", "2")
    monkeypatch.setenv("REBOUND_OPTIN__MIN_HANG_S", "300")
    specs = await _discovered(
        Settings(), {"hostile": "rebound: budget=100;hang=1s;stragglers=restart;logs=/**;heartbeat=/etc/*"}
    )
    spec = specs["hostile"]
    assert (spec.restart_budget, spec.hang_after_s, spec.stragglers) == (2, 300.0, StragglerAction.REPORT)
    assert spec.logs == () and spec.heartbeat == ("/etc/*",)  # not recursive: left to watch.log_roots to refuse
    assert spec.capped == (
        "budget=100 capped at 2 by operator policy (optin.max_budget)",
        "hang=1s raised to 300s by operator policy (optin.min_hang_s)",
        "stragglers=restart capped at report by operator policy (optin.stragglers)",
        "logs='/**' dropped: '**' walks whole trees by operator policy (optin.recursive_globs)",
    )
