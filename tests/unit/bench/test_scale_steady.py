"""``wait_steady``: the scale run's window opens only once the worker answers a sample of status queries promptly
two rounds in a row (the start-up's backlog worked off); a worker that never keeps up is reported, not waited for
forever."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from deploy.scale import reads


class _Stack:
    def check_alive(self) -> None:
        pass


def _answers(monkeypatch: pytest.MonkeyPatch, per_round: list[float]) -> list[int]:
    """Every query of round i takes ``per_round[i]`` seconds (the last value repeats); returns the rounds seen."""
    rounds: list[int] = []
    seconds: Iterator[float] = iter(per_round)
    current = {"value": per_round[0]}

    async def query_seconds(client: Any, job_id: int, limit_s: float = 10.0) -> float:
        return current["value"]

    async def no_sleep(_: float) -> None:
        rounds.append(1)
        current["value"] = next(seconds, per_round[-1])

    next(seconds)
    monkeypatch.setattr(reads, "_query_seconds", query_seconds)
    monkeypatch.setattr("deploy.scale.reads.asyncio.sleep", no_sleep)
    return rounds


async def test_it_waits_for_two_prompt_rounds_in_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    rounds = _answers(monkeypatch, [10.0, 6.0, 1.0, 9.0, 0.5, 0.4, 0.3])
    _, slowest = await reads.wait_steady(None, list(range(100)), _Stack(), timeout_s=60)  # type: ignore[arg-type]
    assert slowest == 0.4  # 1.0 then 9.0 broke the first run of prompt rounds
    assert len(rounds) == 5


async def test_a_worker_that_never_keeps_up_is_reported_at_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(monkeypatch, [10.0])
    waited, slowest = await reads.wait_steady(None, list(range(5)), _Stack(), timeout_s=0.05)  # type: ignore[arg-type]
    assert slowest == 10.0 > reads.STEADY_QUERY_S
    assert waited >= 0.05
