"""Restart budget and backoff: how many automatic restarts a job gets, and how long to wait before each. Pure."""

from __future__ import annotations

#: Seconds to wait before restart number n+1 (index n); the last value repeats. The first restart is
#: immediate: a hardware fault on a healthy job deserves seconds, a crash loop deserves a growing pause.
BACKOFF_S = (0.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def backoff_s(restarts_used: int) -> float:
    """Pause before the next restart, given how many this job has used."""
    return BACKOFF_S[min(max(restarts_used, 0), len(BACKOFF_S) - 1)]


def budget_left(restarts_used: int, budget: int) -> int:
    return max(budget - restarts_used, 0)


def budget_spent(restarts_used: int, budget: int) -> bool:
    """Whether the job has no automatic restart left (a budget of 0 means: never restart, only record)."""
    return budget_left(restarts_used, budget) == 0
