"""``ckpt_fallback=`` in the job's comment, the operator's ``checkpoints.fallback``, and which one wins."""

from __future__ import annotations

import pytest

from workers.settings import Settings
from workflows.domain.checkpoints import CheckpointFallback
from workflows.domain.recovery import RecoverySpec
from workflows.policy.optin import JobSelector, OptInError, checkpoint_fallback, parse_comment, with_fallback

Q, OFF = CheckpointFallback.QUARANTINE, CheckpointFallback.OFF


@pytest.mark.parametrize(("value", "expected"), [("quarantine", Q), ("off", OFF), ("Quarantine", Q)])
def test_comment_key(value: str, expected: CheckpointFallback) -> None:
    spec = parse_comment(f"rebound: ckpt=/ckpt/run1 ckpt_fallback={value}")
    assert spec is not None and spec.checkpoint_fallback is expected


def test_bad_value_names_the_key() -> None:
    with pytest.raises(OptInError) as e:
        parse_comment("rebound: ckpt_fallback=delete")
    assert e.value.key == "ckpt_fallback"


def test_default_is_off_and_the_jobs_own_choice_wins_over_the_operator() -> None:
    assert parse_comment("rebound").checkpoint_fallback is None  # type: ignore[union-attr]
    assert checkpoint_fallback(RecoverySpec()) is OFF
    assert checkpoint_fallback(with_fallback(RecoverySpec(), Q)) is Q
    own_off = RecoverySpec(checkpoint_fallback=OFF)
    assert checkpoint_fallback(with_fallback(own_off, Q)) is OFF
    selected = JobSelector(spec=RecoverySpec(checkpoint_fallback=Q)).spec
    assert checkpoint_fallback(with_fallback(selected, OFF)) is Q


def test_operator_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().checkpoints.fallback is OFF
    monkeypatch.setenv("REBOUND_CHECKPOINTS__FALLBACK", "quarantine")
    assert Settings().checkpoints.fallback is Q
