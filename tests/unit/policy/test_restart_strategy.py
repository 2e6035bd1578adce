"""The restart strategy seam: requeue what Slurm lets requeue, resubmit the rest when the job's setting allows."""

from __future__ import annotations

import pytest

from workflows.domain.recovery import RestartSetting
from workflows.policy.optin import OptInError, parse_comment
from workflows.policy.restart_strategy import RestartStrategy, choose_restart, needs_submission


@pytest.mark.parametrize(
    ("setting", "requeue_allowed", "captured", "expected"),
    [
        (RestartSetting.AUTO, True, False, RestartStrategy.REQUEUE),
        (RestartSetting.AUTO, True, True, RestartStrategy.REQUEUE),
        (RestartSetting.AUTO, False, True, RestartStrategy.RESUBMIT),
        (RestartSetting.AUTO, False, False, None),
        (RestartSetting.REQUEUE, False, True, RestartStrategy.REQUEUE),  # the requeue's refusal ends it, as before
        (RestartSetting.RESUBMIT, True, True, RestartStrategy.RESUBMIT),
        (RestartSetting.RESUBMIT, True, False, None),
    ],
)
def test_choice(
    setting: RestartSetting, requeue_allowed: bool, captured: bool, expected: RestartStrategy | None
) -> None:
    choice = choose_restart(setting, requeue_allowed=requeue_allowed, submission_captured=captured)
    assert choice.strategy is expected
    if expected is None:
        assert "not captured" in choice.reason


def test_submission_captured_only_where_a_resubmission_may_follow() -> None:
    assert needs_submission(RestartSetting.AUTO, requeue_allowed=False)
    assert not needs_submission(RestartSetting.AUTO, requeue_allowed=True)
    assert needs_submission(RestartSetting.RESUBMIT, requeue_allowed=True)
    assert not needs_submission(RestartSetting.REQUEUE, requeue_allowed=False)


def test_opt_in_key() -> None:
    spec = parse_comment("rebound: restart=resubmit;budget=2")
    assert spec is not None and spec.restart is RestartSetting.RESUBMIT
    assert parse_comment("rebound").restart is RestartSetting.AUTO  # type: ignore[union-attr]
    with pytest.raises(OptInError, match="restart"):
        parse_comment("rebound: restart=sometimes")


def test_resubmit_token_does_not_change_the_opt_in() -> None:
    # The token Rebound appends after a '|' leaves the spec before it alone.
    spec = parse_comment("rebound: budget=2 |rb-resubmit=7.1.deadbeef")
    assert spec is not None and spec.restart_budget == 2


def test_lineage_is_rebound_s_record_not_the_comment() -> None:
    from workflows.domain.recovery import JobRecoveryStatus, RecoveryState
    from workflows.policy.restart_strategy import in_lineage

    st = JobRecoveryStatus(cluster="c", job_id=9, state=RecoveryState.VERIFYING, lineage=(7, 9))
    assert in_lineage(st, 9, "")
    assert not in_lineage(st, 10, "7.1.abc")  # resolved tokens are gone: a copied token claims nothing
    pending = st.model_copy(update={"resubmit_tokens": ("7.2.def",)})
    assert in_lineage(pending, 11, "7.2.def")  # seen before the resubmission's answer was recorded
    assert not in_lineage(pending, 11, "7.2.xyz")
