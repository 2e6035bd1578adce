"""JobWatcher's glob cadence: the known files are read every poll, the patterns globbed every few seconds or
when the job changes (a new attempt's files), and a file found late is read from its start."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import activities.logs.job_watcher as job_watcher
import workflows.policy.straggler as straggler_policy
import workflows.policy.watch as watch_policy
from activities.logs.job_logs import LogPolicy
from activities.logs.job_watcher import JobWatcher, WatchState
from tests.fakes.scheduler import FakeScheduler
from workflows.domain.loop import JobWatchInput
from workflows.domain.slurm import JobState


def _line(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text + "\n")


async def test_new_files_are_found_at_the_next_glob_and_read_from_their_start(tmp_path: Path) -> None:
    sched = FakeScheduler()
    job = sched.submit(2)
    first = tmp_path / f"job-{job.job_id}-rank-0.log"
    _line(first, "starting")
    inp = JobWatchInput(job_id=job.job_id, log_patterns=(str(tmp_path / "job-%j-*.log"),), last_state=JobState.RUNNING)
    clock = [1000.0]
    watcher = JobWatcher(inp, LogPolicy(), WatchState(offsets={}), started=datetime.now(UTC), clock=lambda: clock[0])
    snap = await sched.snapshot()
    watcher.read(snap)
    assert str(first) in watcher.state.offsets
    late = tmp_path / f"job-{job.job_id}-rank-1.log"
    _line(late, "RuntimeError: CUDA error: an illegal memory access was encountered")
    _line(first, "step line")
    clock[0] += job_watcher.GLOB_EVERY_S / 2
    step = watcher.read(snap)  # the known file is read; the new one waits for the next glob
    assert step.facts is not None
    assert str(late) not in watcher.state.offsets and step.facts.findings == ()
    clock[0] += job_watcher.GLOB_EVERY_S
    step = watcher.read(snap)
    assert watcher.state.offsets[str(late)] == late.stat().st_size
    assert step.facts is not None
    assert [f.kind.value for f in step.facts.findings] != []  # its first line was read: nothing lost


async def test_a_changed_job_is_globbed_at_once(tmp_path: Path) -> None:
    sched = FakeScheduler()
    job = sched.submit(2)
    inp = JobWatchInput(job_id=job.job_id, log_patterns=(str(tmp_path / "job-%j-*.log"),), last_state=JobState.RUNNING)
    # The clock stands still: only the job's change makes it glob again.
    watcher = JobWatcher(inp, LogPolicy(), WatchState(offsets={}), started=datetime.now(UTC), clock=lambda: 5.0)
    watcher.read(await sched.snapshot())
    new = tmp_path / f"job-{job.job_id}-rank-0.log"
    _line(new, "hello")
    sched.requeue_by_slurm(job.job_id)  # a new attempt: its files appear now
    watcher.read(await sched.snapshot())
    assert str(new) in watcher.state.offsets


async def test_a_poll_with_nothing_new_does_not_judge_stragglers_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a new step line the kept progress is not judged again (``WatchFacts.progress_unchanged``); the next
    step line is, and every line still counts once."""

    calls: list[tuple[Any, ...]] = []
    real = straggler_policy.judge_stragglers

    def counted(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(watch_policy, "judge_stragglers", counted)
    sched = FakeScheduler()
    job = sched.submit(2)
    log = tmp_path / f"job-{job.job_id}-rank-0.log"
    _line(log, "step=1 step_time=1.0s")
    inp = JobWatchInput(job_id=job.job_id, log_patterns=(str(tmp_path / "job-%j-*.log"),), last_state=JobState.RUNNING)
    watcher = JobWatcher(inp, LogPolicy(), WatchState(offsets={}), started=datetime.now(UTC))
    snap = await sched.snapshot()
    for expected_calls, new_line in ((1, None), (1, None), (2, "step=2 step_time=1.0s"), (2, None)):
        if new_line:
            _line(log, new_line)
        assert watcher.settle(watcher.read(snap)) is None
        assert len(calls) == expected_calls
    progress = watcher.state.progress
    assert progress is not None and [r.progress_count for r in progress.ranks] == [2]
