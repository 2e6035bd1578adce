"""Restart budget and backoff. Pure, no Temporal."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workflows.domain.recovery import DetectionPolicy
from workflows.policy.budget import BACKOFF_S, backoff_s, budget_left, budget_spent


@pytest.mark.parametrize(("used", "budget", "spent"), [(0, 5, False), (4, 5, False), (5, 5, True), (7, 5, True),
                                                        (0, 0, True)])  # fmt: skip
def test_budget_is_spent_once_every_restart_is_used(used: int, budget: int, spent: bool) -> None:
    assert budget_spent(used, budget) is spent


def test_budget_left_never_goes_below_zero() -> None:
    assert budget_left(2, 5) == 3
    assert budget_left(9, 5) == 0


def test_first_restart_is_immediate_then_the_backoff_grows_and_stays_at_its_last_value() -> None:
    assert backoff_s(0) == 0.0
    assert [backoff_s(n) for n in range(1, 6)] == list(BACKOFF_S[1:])
    assert backoff_s(100) == BACKOFF_S[-1]
    assert backoff_s(-1) == 0.0


def test_an_operators_schedule_replaces_the_default_and_its_last_value_repeats() -> None:
    lab = (0.0, 1.0, 2.0)
    assert [backoff_s(n, lab) for n in range(5)] == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert DetectionPolicy().restart_backoff_s == BACKOFF_S
    with pytest.raises(ValidationError):
        DetectionPolicy(restart_backoff_s=(0.0, -1.0))
    with pytest.raises(ValidationError):
        DetectionPolicy(restart_backoff_s=())
