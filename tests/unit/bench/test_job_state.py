"""``BenchContext.job_state``: a failed squeue is not read as "the job is gone"."""

from __future__ import annotations

from typing import Any

import pytest

from deploy.bench.context import ENDED_STATES, LIVE_STATES, STATE_UNKNOWN, BenchContext, BenchOptions
from deploy.local.processes import LabError


class _Squeue(BenchContext):
    def __init__(self, answer: str | LabError) -> None:
        super().__init__(lab=None, client=None, settings=None, opts=BenchOptions())  # type: ignore[arg-type]
        self.answer = answer

    def slurm(self, *argv: str, timeout: float = 15.0) -> str:
        if isinstance(self.answer, LabError):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "state"),
    [
        ("RUNNING\n", "RUNNING"),
        ("", ""),
        (LabError("squeue -h -j 11 failed (exit 1): slurm_load_jobs error: Invalid job id specified"), ""),
        (LabError("squeue -h -j 11 failed (exit 1): slurm_load_jobs error: Socket timed out on send/recv"), "UNKNOWN"),
        (LabError("squeue -h -j 11 -o %T did not finish within 15 s"), "UNKNOWN"),
    ],
)
def test_job_state(answer: Any, state: str) -> None:
    assert _Squeue(answer).job_state(11) == state


def test_an_unknown_state_is_neither_ended_nor_a_reason_to_stop_waiting() -> None:
    assert STATE_UNKNOWN not in ENDED_STATES
    assert STATE_UNKNOWN in LIVE_STATES
