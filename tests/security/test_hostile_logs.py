"""Red team: a job's own files (it names them and writes them) cannot make the worker read what it must not, block,
or grow without bound. Each check reads back what happened: the lines returned, ``LogTail.refused``, the entries a
walk visited, the state a heartbeat would carry, the CPU a poll took, a worker process's exit and message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import activities.logs.globbing as globbing
from activities.logs.job_logs import LogPolicy
from activities.logs.job_watcher import JobWatcher, WatchState
from activities.logs.tail import LogTail
from tests.fakes.scheduler import FakeScheduler
from workers.log_policy import MISSING_ROOTS, build_log_policy
from workers.settings import Settings
from workflows.domain.bounds import DEFAULT_GLOB_ENTRIES, DEFAULT_MAX_LINES_PER_CALL, PROGRESS_STATE_MAX_BYTES
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.loop import JobWatchInput
from workflows.domain.slurm import JobState, SlurmJob

ROOT = Path(__file__).resolve().parents[2]
#: What one poll of a one-task job that prints a step line for 16,384 distinct ranks may cost the worker. Measured
#: on the 2-core dev box: ~53 KB of heartbeat state; ~0.9 s of CPU per poll, all of it reading and parsing the
#: 10,000 lines a poll may take (DEFAULT_MAX_LINES_PER_CALL: any flood of lines costs the same, whatever ranks they
#: name), of which tracking the ranks is 0.03 s. Before the rank cap (082de7b^): 7 MB of state and 2.3 s of
#: tracking per poll. The CPU bound leaves room for a loaded machine.
FLOOD_STATE_MAX_BYTES = PROGRESS_STATE_MAX_BYTES
FLOOD_CPU_PER_POLL_MAX_S = 1.5


def _job(user_id: int | None = None) -> SlurmJob:
    return SlurmJob(job_id=7, name="x", user="mallory", state=JobState.RUNNING, user_id=user_id)


# ----- watch.log_roots is required -----------------------------------------------------------------------------


def test_a_worker_without_log_roots_refuses_to_start_and_names_the_setting() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REBOUND_")}
    env["REBOUND_TEMPORAL__ADDRESS"] = "127.0.0.1:9"  # nothing listens: had it tried to connect, it would say so
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0
    assert "watch.log_roots is not set" in run.stderr and "REBOUND_WATCH__LOG_ROOTS" in run.stderr, run.stderr
    assert "9" not in run.stderr.split("watch.log_roots")[0]  # refused before any connection attempt
    assert time.monotonic() - started < 30


def test_the_policy_is_built_with_the_roots_and_the_glob_bounds(tmp_path: Path) -> None:
    with pytest.raises(ReboundError) as refused:
        build_log_policy(Settings())
    assert refused.value.kind is FailureKind.CONFIGURATION and refused.value.message == MISSING_ROOTS
    policy = build_log_policy(Settings(watch={"log_roots": [tmp_path]}, logs={"glob_max_entries": 100, "max_files": 3}))
    tail = policy.tail(["/etc/*"], _job(os.getuid()), 7)
    lines, _ = tail.read_new({})
    assert lines == [] and "outside the log roots" in tail.refused["/etc/*"]
    for i in range(150):
        (tmp_path / f"f{i:03}.log").write_text("")
    wide = policy.tail([str(tmp_path / "*.log")], _job(os.getuid()), 7)
    wide.read_new({})
    assert "more than 100 directory entries (logs.glob_max_entries)" in wide.refused[str(tmp_path / "*.log")]
    (tmp_path / "few").mkdir()
    for i in range(5):
        (tmp_path / "few" / f"r{i}.log").write_text(f"{i}\n")
    few = policy.tail([str(tmp_path / "few" / "*.log")], _job(os.getuid()), 7)
    _, offsets = few.read_new({})
    assert len([p for p in offsets if not p.startswith("\x00")]) == 3
    assert "more than 3 files match (logs.max_files)" in few.refused[str(tmp_path / "few" / "*.log")]


# ----- logs=/** ------------------------------------------------------------------------------------------------


def _count_listings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Entries visited by every directory listing from now on (GlobBudget.listdir, wrapped)."""
    seen: list[int] = []
    real = globbing.GlobBudget.listdir

    def counted(self: globbing.GlobBudget, directory: str) -> list[os.DirEntry[str]]:
        out = real(self, directory)
        seen.append(len(out))
        return out

    monkeypatch.setattr(globbing.GlobBudget, "listdir", counted)
    return seen


def test_logs_slash_star_star_is_refused_without_listing_anything_under_log_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _count_listings(monkeypatch)
    tail = LogPolicy([tmp_path], require_owner=True).tail(["/**"], _job(os.getuid()), 7)
    lines, _ = tail.read_new({})
    assert lines == [] and seen == []
    assert tail.refused["/**"].startswith("outside the log roots: its directory resolves to '/'")


def test_logs_slash_star_star_walks_once_within_its_budget_then_never_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # No roots at all (a unit-level LogTail): the glob budget alone bounds the walk of the whole host.
    seen = _count_listings(monkeypatch)
    tail = LogTail(["/**"], glob_entries=2_000)
    started = time.process_time()
    lines, _ = tail.read_new({})
    first_walk_s = time.process_time() - started
    visited = sum(seen) + len(seen)  # entries, plus one per listing
    assert lines == []
    assert visited <= 2_000 + 1, visited
    assert "more than 2000 directory entries (logs.glob_max_entries)" in tail.refused["/**"]
    assert first_walk_s < 1.0, first_walk_s
    seen.clear()
    for _ in range(5):  # the watcher globs again every GLOB_EVERY_S: the refused pattern is not walked again
        tail.read_new({}, rescan=True)
    assert seen == [] and "logs.glob_max_entries" in tail.refused["/**"]


def test_the_default_glob_budget_is_the_documented_one() -> None:
    assert globbing.GlobBudget().limit == DEFAULT_GLOB_ENTRIES == Settings().logs.glob_max_entries == 10_000


# ----- symlinks and ownership ---------------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/etc/shadow").exists(), reason="no /etc/shadow on this host")
def test_a_symlink_to_etc_shadow_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "rank-0.log").symlink_to("/etc/shadow")
    pattern = str(tmp_path / "rank-*.log")
    # Under log roots: its real path is outside them.
    tail = LogPolicy([tmp_path], require_owner=True).tail([pattern], _job(os.getuid()), 7)
    lines, offsets = tail.read_new({})
    assert lines == [] and str(tmp_path / "rank-0.log") not in offsets
    assert "outside the log roots" in tail.refused[str(tmp_path / "rank-0.log")]
    assert "/etc/shadow" in tail.refused[str(tmp_path / "rank-0.log")]
    # Even with / as a root, /etc/shadow is root's, not the job's user's.
    tail = LogPolicy(["/"], require_owner=True).tail([pattern], _job(os.getuid() + 4242), 7)
    lines, _ = tail.read_new({})
    assert lines == []
    assert tail.refused[str(tmp_path / "rank-0.log")].startswith(f"owned by uid {os.stat('/etc/shadow').st_uid}")


def test_a_file_of_another_user_under_the_roots_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "rank-0.log").write_text("secret of someone else\n")
    tail = LogPolicy([tmp_path], require_owner=True).tail([str(tmp_path / "*.log")], _job(os.getuid() + 1), 7)
    lines, _ = tail.read_new({})
    assert lines == []
    assert "not by the job's user" in tail.refused[str(tmp_path / "rank-0.log")]


def test_a_symlinked_directory_swapped_to_outside_the_roots_is_caught(tmp_path: Path) -> None:
    inside, outside = tmp_path / "runs", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (outside / "rank-0.log").write_text("not yours\n")
    (inside / "latest").symlink_to(outside)
    tail = LogPolicy([inside], require_owner=True).tail([str(inside / "latest" / "*.log")], _job(os.getuid()), 7)
    lines, _ = tail.read_new({})
    assert lines == [] and any("outside the log roots" in r for r in tail.refused.values())


# ----- FIFOs and other special files --------------------------------------------------------------------------


def _read_within(tail: LogTail, seconds: float) -> tuple[bool, object]:
    """Read on a thread; (finished in time, its result)."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(tail.read_new({})), daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), out[0] if out else None


def test_a_fifo_named_as_a_log_never_blocks_the_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "rank-0.log"
    os.mkfifo(fifo)
    (tmp_path / "rank-1.log").write_text("")
    tail = LogPolicy([tmp_path], require_owner=True).tail([str(tmp_path / "*.log")], _job(os.getuid()), 7)
    done, _ = _read_within(tail, 5.0)
    assert done, "reading a job's FIFO blocked the worker"
    assert tail.refused[str(fifo)] == "not a regular file (fifo)"


def test_a_fifo_swapped_in_after_the_check_is_opened_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race: the path was a regular file when stat'ed, a FIFO (no writer) when opened.
    regular = tmp_path / "was-regular.log"
    regular.write_text("x\n")
    fifo = tmp_path / "rank-0.log"
    os.mkfifo(fifo)
    tail = LogTail([str(fifo)])
    monkeypatch.setattr(tail, "_inspect", lambda path: os.stat(regular))
    done, _ = _read_within(tail, 5.0)
    assert done, "opening a swapped-in FIFO blocked"
    assert tail.refused[str(fifo)] == "replaced while it was being opened; read again next time"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_symlink_to_a_device_is_not_opened(tmp_path: Path) -> None:
    (tmp_path / "rank-0.log").symlink_to("/dev/zero")  # reading it would never end
    tail = LogTail([str(tmp_path / "*.log")])
    done, _ = _read_within(tail, 5.0)
    assert done and tail.refused[str(tmp_path / "rank-0.log")] == "not a regular file (character device)"


# ----- 16,384 ranks from one task -----------------------------------------------------------------------------


async def test_a_one_task_job_naming_16384_ranks_stays_bounded(tmp_path: Path) -> None:
    """Through the real watcher (tail, line parsing, progress, crash scan, the poll's decision) on a real file: one
    step line per rank per poll, more than a poll may read (the rest waits, nothing is dropped)."""
    sched = FakeScheduler()
    job = sched.submit(1, user_id=os.getuid())
    log = tmp_path / "one-task.out"
    log.write_text("")
    inp = JobWatchInput(job_id=job.job_id, log_patterns=(str(log),), last_state=JobState.RUNNING)
    policy = LogPolicy([tmp_path], require_owner=True)
    watcher = JobWatcher(inp, policy, WatchState(offsets={}), started=datetime.now(UTC))
    snap = await sched.snapshot()
    watcher.read(snap)  # anchors the (empty) file
    cpu: list[float] = []
    for poll in range(1, 7):
        at = datetime.now(UTC) + timedelta(seconds=poll)
        stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        with log.open("a") as f:
            f.writelines(f"{stamp} rank={r} step={poll} loss=2.5 step_time=0.5s\n" for r in range(16_384))
        before = dict(watcher.state.offsets)
        started = time.process_time()
        watcher.read(snap)
        cpu.append(time.process_time() - started)
        assert watcher.state.offsets != before
    state_bytes = len(json.dumps(watcher.state.details()))
    progress = watcher.state.progress
    assert progress is not None and progress.untracked is not None
    assert len(progress.ranks) == 128 and progress.untracked.highest_rank == 16_383
    assert state_bytes < FLOOD_STATE_MAX_BYTES, state_bytes
    assert max(cpu) < FLOOD_CPU_PER_POLL_MAX_S, cpu
    # Each poll read at most the line cap; what did not fit waits in the file (the offset is behind its size).
    assert watcher.state.offsets[str(log)] < log.stat().st_size
    assert progress.untracked.samples + len(progress.ranks) <= 6 * DEFAULT_MAX_LINES_PER_CALL
    print(f"16,384 ranks: state {state_bytes:,} bytes, CPU per poll max {max(cpu):.3f} s, median {sorted(cpu)[3]:.3f}")


async def test_a_heartbeat_glob_that_walks_too_much_is_not_walked_at_every_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # heartbeat=/scratch/*/rank-%t.hb over a wide directory: heartbeat files are looked for at every poll.
    for i in range(150):
        (tmp_path / "hb" / f"d{i:03}").mkdir(parents=True)
    sched = FakeScheduler()
    job = sched.submit(1, user_id=os.getuid())
    inp = JobWatchInput(
        job_id=job.job_id,
        log_patterns=(str(tmp_path / "none.log"),),
        heartbeat_patterns=(str(tmp_path / "hb" / "*" / "rank-%t.hb"),),
        last_state=JobState.RUNNING,
    )
    policy = build_log_policy(Settings(watch={"log_roots": [tmp_path]}, logs={"glob_max_entries": 100}))
    watcher = JobWatcher(inp, policy, WatchState(offsets={}), started=datetime.now(UTC), clock=lambda: 5.0)
    snap = await sched.snapshot()
    seen = _count_listings(monkeypatch)
    watcher.read(snap)
    assert sum(seen) >= 99  # the first poll walked up to the budget
    seen.clear()
    for _ in range(3):
        watcher.read(snap)
    assert seen == [], f"walked again: {len(seen)} listings"
