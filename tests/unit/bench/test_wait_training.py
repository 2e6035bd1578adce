"""The launcher bench's wait before a fault: a job that ends while Rebound recovers it is waited for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy.bench import launchers_run
from deploy.bench.context import BenchError
from tests.unit.bench.builders import status
from workflows.domain.checkpoints import CheckpointFormat, CheckpointRef
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState


class _Ctx:
    """What ``_wait_training`` asks of a ``BenchContext``: the job's squeue state and its JobRecovery status."""

    def __init__(self, states: list[str], recovery: list[JobRecoveryStatus | None]) -> None:
        self.states, self.recovery = states, recovery

    def job_state(self, job_id: int) -> str:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    async def status(self, job_id: int) -> JobRecoveryStatus | None:
        return self.recovery.pop(0) if len(self.recovery) > 1 else self.recovery[0]


@pytest.fixture(autouse=True)
def checkpoint_at_step_80(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = CheckpointRef(path="/run/checkpoints/step_80", format=CheckpointFormat.TORCH_DCP, step=80, saved_at=None)
    monkeypatch.setattr(launchers_run, "_latest", lambda run_dir: ref)
    monkeypatch.setattr(launchers_run, "until", _fast_until)


async def _fast_until(what: str, timeout_s: float, poll_s: float, check: Any) -> None:
    for _ in range(20):
        if await check():
            return
    raise BenchError(f"{what}: not within {timeout_s:.0f} s")


async def test_a_job_that_failed_while_rebound_restarts_it_is_waited_for() -> None:
    ctx = _Ctx(["FAILED", "", "PENDING", "RUNNING"], [status(state=RecoveryState.RESTARTING)])
    await launchers_run._wait_training(ctx, Path("/run"), 11, 60, 60.0)  # type: ignore[arg-type]
    assert ctx.states == ["RUNNING"]


@pytest.mark.parametrize("recovery", [status(state=RecoveryState.GAVE_UP), None])
async def test_a_job_that_ended_with_nobody_recovering_it_ends_the_run(recovery: JobRecoveryStatus | None) -> None:
    ctx = _Ctx(["FAILED"], [recovery])
    with pytest.raises(BenchError, match="job 11 is FAILED before the fault"):
        await launchers_run._wait_training(ctx, Path("/run"), 11, 60, 60.0)  # type: ignore[arg-type]
