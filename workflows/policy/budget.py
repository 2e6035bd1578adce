"""Restart budget and backoff: how many automatic restarts a job gets, and how long to wait before each. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from workflows.domain.recovery import DEFAULT_RESTART_BACKOFF_S

#: Seconds to wait before restart number n+1 (index n); the last value repeats. The first restart is
#: immediate: a hardware fault on a healthy job deserves seconds, a crash loop deserves a growing pause. The
#: operator may set another schedule (``DetectionPolicy.restart_backoff_s``; the lab shortens it).
BACKOFF_S = DEFAULT_RESTART_BACKOFF_S


def backoff_s(restarts_used: int, schedule: Sequence[float] = BACKOFF_S) -> float:
    """Pause before the next restart, given how many this job has used, on ``schedule`` (see ``BACKOFF_S``)."""
    if not schedule:
        return 0.0
    return float(schedule[min(max(restarts_used, 0), len(schedule) - 1)])


def budget_left(restarts_used: int, budget: int) -> int:
    return max(budget - restarts_used, 0)


def budget_spent(restarts_used: int, budget: int) -> bool:
    """Whether the job has no automatic restart left (a budget of 0 means: never restart, only record)."""
    return budget_left(restarts_used, budget) == 0
