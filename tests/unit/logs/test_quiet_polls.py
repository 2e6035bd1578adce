"""Quiet polls (``JobWatcher(full_poll_every_s=...)``, ``activities.logs.peek``): between full polls, a poll whose
files gained only progress reads nothing into the job's state; anything that may be a failure, a scheduler change
or an odd file makes the poll a full one at once; every line is folded once, at the next full poll, dated when it
was first seen."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from activities.logs.job_logs import LogPolicy
from activities.logs.job_watcher import QUIET, JobWatcher, PollStep, WatchState
from activities.logs.peek import Peek, watched_directories
from tests.fakes.scheduler import FakeScheduler
from workflows.domain.loop import JobWatchInput
from workflows.domain.slurm import ClusterSnapshot, JobState

FULL_EVERY_S = 5.0
T0 = datetime(2026, 12, 7, 22, 0, tzinfo=UTC)


class Job:
    """One watched job with two rank files, a fake clock and a watcher with quiet polls."""

    def __init__(self, tmp_path: Path, full_every_s: float = FULL_EVERY_S) -> None:
        self.sched = FakeScheduler()
        self.job = self.sched.submit(2)
        self.files = [tmp_path / f"job-{self.job.job_id}-rank-{r}.log" for r in range(2)]
        for f in self.files:
            f.write_text("")
        inp = JobWatchInput(
            job_id=self.job.job_id, log_patterns=(str(tmp_path / "job-%j-rank-%t.log"),), last_state=JobState.RUNNING
        )
        self.clock = 1000.0
        self.watcher = JobWatcher(
            inp,
            LogPolicy(),
            WatchState(offsets={}),
            started=T0,
            clock=lambda: self.clock,
            full_poll_every_s=full_every_s,
        )
        self.step = 0

    async def snap(self) -> ClusterSnapshot:
        return await self.sched.snapshot()

    def steps(self, n: int = 1, stamped: bool = False) -> None:
        for _ in range(n):
            self.step += 1
            for rank, f in enumerate(self.files):
                stamp = f"{T0 + timedelta(seconds=self.step):%Y-%m-%dT%H:%M:%S}.000Z " if stamped else ""
                with f.open("a") as out:
                    out.write(f"{stamp}[INFO] rank={rank}/2 step={self.step} loss=0.41 step_time=1.000s\n")

    async def poll(self, advance_s: float = 1.0, at: datetime | None = None) -> PollStep:
        self.clock += advance_s
        step = self.watcher.read(await self.snap(), at)
        self.watcher.settle(step)
        return step

    def counted(self) -> list[int]:
        progress = self.watcher.state.progress
        assert progress is not None
        return [r.progress_count for r in progress.ranks]


async def test_progress_between_full_polls_is_quiet_and_folded_once_at_the_next(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.steps()
    assert (await job.poll()) is not QUIET  # the first poll is a full one
    offsets = dict(job.watcher.state.offsets)
    assert job.counted() == [1, 1]
    for _ in range(4):
        job.steps()
        assert (await job.poll()) is QUIET
    assert job.watcher.state.offsets == offsets and job.counted() == [1, 1]  # nothing read into the state
    job.steps()
    assert (await job.poll(advance_s=1.0)) is not QUIET  # 5 s since the full poll
    assert job.counted() == [6, 6]  # every line once
    assert job.watcher.state.offsets[str(job.files[0])] == job.files[0].stat().st_size


async def test_a_failure_line_makes_the_poll_a_full_one_at_once(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.steps()
    await job.poll()
    job.steps()
    with job.files[1].open("a") as f:
        f.write("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    step = await job.poll()
    assert step.facts is not None and [f.kind.value for f in step.facts.findings] != []


async def test_a_failure_line_written_in_two_pieces_is_tested_whole(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.steps()
    await job.poll()
    with job.files[0].open("a") as f:
        f.write("RuntimeError: CUDA error: an ille")
    assert (await job.poll()) is QUIET  # a partial line: nothing to test yet
    with job.files[0].open("a") as f:
        f.write("gal memory access was encountered\n")
    step = await job.poll()
    assert step.facts is not None and step.facts.findings


async def test_a_scheduler_change_makes_the_poll_a_full_one(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.steps()
    await job.poll()
    job.steps()
    job.sched.requeue_by_slurm(job.job.job_id)
    step = await job.poll()
    assert step is not QUIET and step.facts is not None


@pytest.mark.parametrize("change", ["truncated", "replaced", "removed"])
async def test_an_odd_file_makes_the_poll_a_full_one(tmp_path: Path, change: str) -> None:
    job = Job(tmp_path)
    job.steps(3)
    await job.poll()
    job.steps()
    target = job.files[0]
    if change == "truncated":
        target.write_text("")
    elif change == "replaced":
        fresh = target.with_suffix(".new")
        fresh.write_text(target.read_text())
        os.replace(fresh, target)
    else:
        target.unlink()
    assert (await job.poll()) is not QUIET


async def test_a_new_file_makes_the_poll_a_full_one_that_reads_it(tmp_path: Path) -> None:
    """A rank whose log appears between full polls (a late rank, a new attempt's file): its crash line is read at
    the next poll, not at the next full poll's glob."""
    job = Job(tmp_path)
    job.steps()
    await job.poll()
    late = tmp_path / f"job-{job.job.job_id}-rank-2.log"
    late.write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    step = await job.poll()
    assert step is not QUIET and step.facts is not None and step.facts.findings
    assert str(late) in job.watcher.state.offsets
    job.steps()
    assert (await job.poll()) is QUIET  # the directory looked at again from the poll that read the new file


def test_watched_directories_are_the_files_and_the_patterns_fixed_parts() -> None:
    found = watched_directories(
        ["/runs/a/logs/job-7-rank-%t.log", "/runs/*/logs/x.log", "/runs/b/%N/out.log", "rel.log"],
        ["/runs/a/logs/job-7-rank-0.log", "/runs/c/logs/x.log"],
    )
    assert found == {"/runs/a/logs", "/runs", "/runs/b", "/runs/c/logs", "."}


async def test_non_ascii_or_a_flood_is_read_in_full(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.steps()
    await job.poll()
    with job.files[0].open("a") as f:
        f.write("step=2 café\n")
    assert (await job.poll()) is not QUIET


async def test_unstamped_lines_are_dated_when_first_seen_not_at_the_fold(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.steps()
    await job.poll(at=T0)
    job.steps()
    seen = T0 + timedelta(seconds=1)
    assert job.watcher.read(await job.snap(), seen) is QUIET  # step 2 seen at T0 + 1 s
    job.clock += FULL_EVERY_S
    job.watcher.settle(job.watcher.read(await job.snap(), T0 + timedelta(seconds=6)))
    progress = job.watcher.state.progress
    assert progress is not None
    assert {r.last_progress_at for r in progress.ranks} == {seen}


async def test_quiet_polls_fold_the_same_progress_as_full_polls(tmp_path: Path) -> None:
    """The same stamped lines, polled every second with and without quiet polls, give the same progress once a
    full poll has folded them (the quiet ones only defer the folding)."""
    (tmp_path / "q").mkdir(exist_ok=True)
    (tmp_path / "f").mkdir(exist_ok=True)
    quiet, full = Job(tmp_path / "q"), Job(tmp_path / "f", 0.0)
    for second in range(23):
        for job in (quiet, full):
            job.steps(stamped=True)
            await job.poll(at=T0 + timedelta(seconds=second))
    quiet.clock += FULL_EVERY_S  # the deferred lines are folded now
    await quiet.poll(0.0, at=T0 + timedelta(seconds=23))
    await full.poll(0.0, at=T0 + timedelta(seconds=23))
    q, f = quiet.watcher.state.progress, full.watcher.state.progress
    assert q is not None and f is not None
    assert [(r.rank, r.last_step, r.progress_count, r.last_progress_at, r.step_times_s) for r in q.ranks] == [
        (r.rank, r.last_step, r.progress_count, r.last_progress_at, r.step_times_s) for r in f.ranks
    ]


def test_seen_at_finds_the_look_that_saw_a_line(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("step=1\n")
    info = log.stat()
    peek = Peek({str(log): info.st_size}, {str(log): (info.st_dev, info.st_ino)}, 1 << 20)
    times = [T0 + timedelta(seconds=s) for s in (1, 2)]
    for t in times:
        with log.open("a") as f:
            f.write("step=2\n")
        assert peek.look(t) is None
    assert peek.seen_at(str(log), 0) is None  # before the peek began: the full poll read it
    assert peek.seen_at(str(log), 7) == times[0] and peek.seen_at(str(log), 14) == times[1]
    assert peek.seen_at(str(log), 21) is None and peek.seen_at("other", 0) is None
