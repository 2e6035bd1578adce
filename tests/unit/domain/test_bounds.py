"""The history bound: long-lived workflows continue as new past it, whatever the server suggests."""

from __future__ import annotations

from workflows.domain.bounds import HISTORY_MAX_BYTES, HISTORY_MAX_EVENTS, history_full


def test_a_history_is_full_at_either_bound() -> None:
    assert not history_full(HISTORY_MAX_EVENTS - 1, HISTORY_MAX_BYTES - 1)
    assert history_full(HISTORY_MAX_EVENTS, 0)
    assert history_full(10, HISTORY_MAX_BYTES)


def test_the_bound_is_under_temporals_own_warnings() -> None:
    assert HISTORY_MAX_EVENTS < 10_240 and HISTORY_MAX_BYTES < 10 * 1024 * 1024
