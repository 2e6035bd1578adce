"""The operator's ceilings on a comment's asks (``workflows.policy.optin_caps`` through ``spec_for``). Pure."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workflows.domain.checkpoints import CheckpointFallback
from workflows.domain.optin_caps import OptInCaps
from workflows.domain.recovery import RecoverySpec, StragglerAction
from workflows.domain.slurm import JobState, SlurmJob
from workflows.policy.optin import JobSelector, spec_for


def _job(comment: str, partition: str = "gpu") -> SlurmJob:
    return SlurmJob(job_id=7, name="llm", user="alice", partition=partition, state=JobState.RUNNING, comment=comment)


def _selector(**spec: object) -> JobSelector:
    # As load_selectors builds it from TOML: only the keys the operator wrote are "set".
    return JobSelector.model_validate({"partitions": ["gpu"], "spec": spec})


def test_a_selectors_budget_is_a_ceiling_for_the_comment() -> None:
    spec = spec_for(_job("rebound: budget=100"), [_selector(restart_budget=3)])
    assert spec is not None
    assert spec.restart_budget == 3
    assert spec.capped == ("budget=100 capped at 3 by operator policy (the job's selector)",)


def test_the_settings_cap_the_budget_without_a_selector() -> None:
    spec = spec_for(_job("rebound: budget=100"), [], OptInCaps(max_budget=4))
    assert spec is not None and spec.restart_budget == 4
    assert spec.capped == ("budget=100 capped at 4 by operator policy (optin.max_budget)",)


def test_the_lower_of_setting_and_selector_wins() -> None:
    spec = spec_for(_job("rebound: budget=9"), [_selector(restart_budget=6)], OptInCaps(max_budget=2))
    assert spec is not None and spec.restart_budget == 2
    assert "optin.max_budget" in spec.capped[0]


def test_a_comment_only_jobs_default_budget_is_capped_too() -> None:
    spec = spec_for(_job("rebound"), [], OptInCaps(max_budget=1))
    assert spec is not None and spec.restart_budget == 1
    assert spec.capped == ("budget=5 (the default) capped at 1 by operator policy (optin.max_budget)",)


def test_the_selectors_own_values_are_never_capped() -> None:
    # The operator wrote budget 20 in the selector: theirs to decide, not the comment's.
    spec = spec_for(_job("rebound: ckpt=/c"), [_selector(restart_budget=20)], OptInCaps(max_budget=2))
    assert spec is not None and spec.restart_budget == 20 and spec.capped == ()


def test_asks_within_the_ceilings_are_untouched() -> None:
    spec = spec_for(_job("rebound: budget=2;hang=10m;stragglers=report;logs=/runs/x/*.log"), [])
    assert spec == RecoverySpec(restart_budget=2, hang_after_s=600, logs=("/runs/x/*.log",))


@pytest.mark.parametrize(
    ("hang", "expected", "note"),
    [
        ("1s", 60.0, "hang=1s raised to 60s by operator policy (optin.min_hang_s)"),
        ("48h", 86400.0, "hang=172800s capped at 86400s by operator policy (optin.max_hang_s)"),
    ],
)
def test_the_hang_window_is_held_between_the_floor_and_the_ceiling(hang: str, expected: float, note: str) -> None:
    spec = spec_for(_job(f"rebound: hang={hang}"), [])
    assert spec is not None and spec.hang_after_s == expected
    assert spec.capped == (note,)


def test_a_selectors_hang_window_is_the_floor() -> None:
    spec = spec_for(_job("rebound: hang=2m"), [_selector(hang_after_s=900)])
    assert spec is not None and spec.hang_after_s == 900
    assert spec.capped == ("hang=120s raised to 900s by operator policy (the job's selector)",)


def test_straggler_restart_is_capped_at_report_by_default() -> None:
    spec = spec_for(_job("rebound: stragglers=restart"), [])
    assert spec is not None and spec.stragglers is StragglerAction.REPORT
    assert spec.capped == ("stragglers=restart capped at report by operator policy (optin.stragglers)",)
    allowed = spec_for(_job("rebound: stragglers=restart"), [], OptInCaps(stragglers=StragglerAction.RESTART))
    assert allowed is not None and allowed.stragglers is StragglerAction.RESTART and allowed.capped == ()
    off = spec_for(
        _job("rebound: stragglers=restart"),
        [_selector(stragglers="off")],
        OptInCaps(stragglers=StragglerAction.RESTART),
    )
    assert off is not None and off.stragglers is StragglerAction.OFF


def test_checkpoint_quarantine_can_be_forbidden() -> None:
    caps = OptInCaps(checkpoint_fallback=CheckpointFallback.OFF)
    spec = spec_for(_job("rebound: ckpt=/c;ckpt_fallback=quarantine"), [], caps)
    assert spec is not None and spec.checkpoint_fallback is CheckpointFallback.OFF
    assert spec.capped == ("ckpt_fallback=quarantine capped at off by operator policy (optin.checkpoint_fallback)",)
    by_selector = spec_for(_job("rebound: ckpt_fallback=quarantine"), [_selector(checkpoint_fallback="off")])
    assert by_selector is not None and by_selector.checkpoint_fallback is CheckpointFallback.OFF


def test_recursive_and_surplus_log_patterns_are_dropped() -> None:
    many = ",".join(f"/runs/x/r{i}.log" for i in range(12))
    spec = spec_for(_job(f"rebound: logs=/scratch/**,/a/**/b.log;logs={many};heartbeat=/**"), [])
    assert spec is not None
    assert spec.logs == tuple(f"/runs/x/r{i}.log" for i in range(8))
    assert spec.heartbeat == ()
    assert spec.capped == (
        "logs='/scratch/**' dropped: '**' walks whole trees by operator policy (optin.recursive_globs)"
        " (1 more such pattern(s) dropped)",
        "logs: 12 patterns capped at 8 by operator policy (optin.max_log_patterns) (the first ones are kept)",
        "heartbeat='/**' dropped: '**' walks whole trees by operator policy (optin.recursive_globs)",
    )
    allowed = spec_for(_job("rebound: logs=/scratch/**"), [], OptInCaps(recursive_globs=True))
    assert allowed is not None and allowed.logs == ("/scratch/**",)


def test_caps_must_be_consistent() -> None:
    with pytest.raises(ValidationError, match="min_hang_s"):
        OptInCaps(min_hang_s=3600, max_hang_s=60)
