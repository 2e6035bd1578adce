"""Which lines of a job's files count for the attempt Rebound watches: offsets anchored when the attempt is first
seen, files that appear later read from 0, lines stamped before the attempt dropped (``activities.logs.tail``)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from activities.logs import tail as tail_module
from activities.logs.birth import birth_time
from activities.logs.crash import scan, to_findings
from activities.logs.job_logs import LogPolicy
from activities.logs.line import LogLine, decode_line
from activities.logs.tail import CLOCK_SKEW, ZONELESS_SLACK, LogTail, positions, predates
from workflows.domain.slurm import JobState, SlurmJob

OLD_CRASH = (
    "2026-11-30 03:12:09,117 [ERROR] rank=1/4 RuntimeError: CUDA error: an illegal memory access was encountered\n"
)


def _after_the_files() -> datetime:
    """An attempt start after every file written so far was created (birth times are stamped with a coarse clock)."""
    return datetime.now(UTC) + timedelta(seconds=2)


@pytest.fixture
def no_birth_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that keeps no birth time (NFS, most parallel file systems)."""
    monkeypatch.setattr(tail_module, "birth_time", lambda fd: None)


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def _texts(lines: list[LogLine]) -> list[str]:
    return [line.text for line in lines]


def _stamp(at: datetime, *, zone: bool = True) -> str:
    text = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    return text + "Z" if zone else text


def test_an_appended_log_with_an_old_crash_line_gives_no_finding(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    _append(log, "step=1 loss=2.0\n" + OLD_CRASH + "Traceback (most recent call last):\n")
    tail = LogTail([str(tmp_path / "*.log")], attempt_start=_after_the_files())

    lines, offsets = tail.read_new({})
    assert lines == []
    assert positions(offsets) == {str(log): log.stat().st_size}
    assert to_findings(scan(lines)) == []

    _append(log, f"{_stamp(datetime.now(UTC))} [INFO] step=2 loss=1.9\n")
    new, _ = tail.read_new(offsets)
    assert [line.text.endswith("step=2 loss=1.9") for line in new] == [True]
    assert to_findings(scan(new)) == []


def test_a_crash_of_the_current_attempt_after_discovery_is_read(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    _append(log, OLD_CRASH)
    tail = LogTail([str(log)], attempt_start=_after_the_files())
    _, offsets = tail.read_new({})

    _append(log, "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    lines, _ = tail.read_new(offsets)
    assert len(to_findings(scan(lines))) == 1


def test_a_file_that_appears_after_the_attempt_was_first_seen_is_read_from_0(tmp_path: Path) -> None:
    tail = LogTail([str(tmp_path / "*.log")], attempt_start=datetime.now(UTC))
    _, offsets = tail.read_new({})
    assert positions(offsets) == {}

    (tmp_path / "rank-3.log").write_text("loading\nstep=7\n")
    lines, _ = tail.read_new(offsets)
    assert _texts(lines) == ["loading", "step=7"]


@pytest.mark.usefixtures("no_birth_time")
def test_a_file_the_attempt_began_is_read_from_0_when_its_first_line_says_so(tmp_path: Path) -> None:
    """Discovered late: the attempt's first lines were written before Rebound first saw the job, on a file system
    that keeps no birth time."""
    started = datetime.now(UTC) - timedelta(minutes=2)
    ours, zoneless, unstamped = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "c.log"
    ours.write_text(f"{_stamp(started + timedelta(seconds=1))} [INFO] start\nstep=1\n")
    zoneless.write_text(f"{_stamp(started + timedelta(seconds=1), zone=False)} [INFO] start\nstep=1\n")
    unstamped.write_text("start\nstep=1\n")

    lines, offsets = LogTail([str(tmp_path / "*.log")], attempt_start=started).read_new({})
    # Only a stamp with a zone proves the file is this attempt's; local time of an unknown zone does not.
    assert {line.path for line in lines} == {str(ours)}
    assert _texts(lines)[1:] == ["step=1"]
    assert positions(offsets)[str(zoneless)] == zoneless.stat().st_size
    assert positions(offsets)[str(unstamped)] == unstamped.stat().st_size


def test_a_first_line_stamped_before_the_attempt_keeps_the_file_at_its_size(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    started = _after_the_files()
    log.write_text(f"{_stamp(started - timedelta(hours=30))} [INFO] start\n" + OLD_CRASH)
    lines, offsets = LogTail([str(log)], attempt_start=started).read_new({})
    assert lines == [] and positions(offsets) == {str(log): log.stat().st_size}


def test_lines_stamped_before_the_attempt_never_count_even_after_the_offset(tmp_path: Path) -> None:
    started = datetime.now(UTC)
    tail = LogTail([str(tmp_path / "*.log")], attempt_start=started)
    _, offsets = tail.read_new({})
    # A file that appears later (an old log copied or rotated in) is read from 0, but its old lines do not count.
    (tmp_path / "copied.log").write_text(
        f"{_stamp(started - timedelta(hours=2))} [ERROR] RuntimeError: CUDA error: old\n"
        f"{_stamp(started - timedelta(seconds=20))} [INFO] within the clock skew\n"
        f"{_stamp(started - timedelta(hours=2), zone=False)} [INFO] zoneless, maybe local time\n"
        f"{_stamp(started - timedelta(days=2), zone=False)} [ERROR] RuntimeError: zoneless and days old\n"
        "no stamp\n"
    )
    lines, _ = tail.read_new(offsets)
    assert [line.text.split(" [")[-1] for line in lines] == [
        "INFO] within the clock skew",
        "INFO] zoneless, maybe local time",
        "no stamp",
    ]


def test_predates_margins() -> None:
    since = datetime(2026, 12, 1, 12, tzinfo=UTC)

    def line(text: str) -> LogLine:
        return decode_line("/x.log", None, None, 0, text.encode())

    assert predates(line(f"{_stamp(since - CLOCK_SKEW - timedelta(seconds=1))} x"), since)
    assert not predates(line(f"{_stamp(since - CLOCK_SKEW + timedelta(seconds=1))} x"), since)
    assert predates(line("[2026-11-30 20:00:00,001 +0200] x"), since)
    assert not predates(line(f"{_stamp(since - ZONELESS_SLACK + timedelta(minutes=1), zone=False)} x"), since)
    assert predates(line(f"{_stamp(since - ZONELESS_SLACK - timedelta(minutes=1), zone=False)} x"), since)
    assert predates(line(f"3: {_stamp(since - timedelta(hours=1))} x"), since)  # after an srun label
    assert not predates(line("no stamp at all"), since)


def test_the_anchor_travels_with_the_offsets_and_is_set_once(tmp_path: Path) -> None:
    """A restarted activity (a new LogTail, a later attempt start) neither re-anchors nor re-reads."""
    log = tmp_path / "a.log"
    _append(log, OLD_CRASH)
    first = _after_the_files()
    _, offsets = LogTail([str(log)], attempt_start=first).read_new({})
    _append(log, "step=2\n")

    later = LogTail([str(log)], attempt_start=datetime.now(UTC) + timedelta(hours=1))
    lines, again = later.read_new(offsets)
    assert _texts(lines) == ["step=2"]
    assert {k: v for k, v in again.items() if k.startswith("\0since")} == {"\0since": int(first.timestamp())}


def test_offsets_of_an_earlier_version_count_as_anchored(tmp_path: Path) -> None:
    log, new = tmp_path / "a.log", tmp_path / "b.log"
    _append(log, "one\ntwo\n")
    new.write_text(f"{_stamp(datetime.now(UTC) - timedelta(days=3))} [INFO] old stamp, no anchor time to drop it\n")
    lines, offsets = LogTail([str(tmp_path / "*.log")], attempt_start=datetime.now(UTC)).read_new({str(log): 4})
    assert [(Path(line.path).name, line.text.endswith("drop it")) for line in lines] == [
        ("a.log", False),  # "two", from the offset it had
        ("b.log", True),  # read from 0 and kept
    ]
    assert "\0since" not in offsets


def test_without_an_attempt_everything_is_read(tmp_path: Path) -> None:
    """``rebound diagnose`` reads whole files: no anchoring, no dropped lines."""
    (tmp_path / "a.log").write_text(OLD_CRASH)
    lines, offsets = LogTail([str(tmp_path / "a.log")]).read_new({})
    assert len(lines) == 1 and "\0since" not in offsets


def test_the_log_policy_anchors_at_the_jobs_start_or_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "slurm-7.out"
    started = datetime.now(UTC) - timedelta(minutes=5)
    log.write_text(f"{_stamp(started + timedelta(seconds=2))} [INFO] begun by this attempt\n")
    running = SlurmJob(job_id=7, state=JobState.RUNNING, user_id=os.getuid(), start_time=started)
    lines, offsets = LogPolicy().tail([str(log)], running, 7).read_new({})
    assert len(lines) == 1 and offsets["\0since"] == int(started.timestamp())

    # Pending (no start yet): whatever exists is older than the attempt that will start (the file was created a
    # moment ago: its birth time, stamped with a coarse clock, cannot tell; a real log is older).
    monkeypatch.setattr(tail_module, "birth_time", lambda fd: None)
    pending = SlurmJob(job_id=7, state=JobState.PENDING)
    lines, offsets = LogPolicy().tail([str(log)], pending, 7).read_new({})
    assert lines == [] and positions(offsets) == {str(log): log.stat().st_size}


def test_a_file_truncated_by_a_requeue_is_read_from_0(tmp_path: Path) -> None:
    """Slurm truncates the default ``slurm-%j.out`` when it requeues the job (seen on the lab): the fingerprint of
    the anchored offset no longer matches, so the new run's lines are all read."""
    log = tmp_path / "slurm-9.out"
    log.write_text("first run\n" + OLD_CRASH)
    tail = LogTail([str(log)], attempt_start=_after_the_files())
    lines, offsets = tail.read_new({})
    assert lines == []
    log.write_text("second run, a longer first line than the old file had in all its lines........\n" * 2)
    lines, _ = tail.read_new(offsets)
    assert len(lines) == 2


def test_a_file_created_after_the_attempt_started_is_read_from_0(tmp_path: Path) -> None:
    """Discovered late, on a file system that keeps birth times: a file the attempt created is all the attempt's,
    stamped or not."""
    started = datetime.now(UTC) - timedelta(seconds=30)
    log = tmp_path / "slurm-5.out"
    log.write_text("loading\nstep=1\n")
    fd = os.open(log, os.O_RDONLY)
    try:
        born = birth_time(fd)
    finally:
        os.close(fd)
    if born is None:
        pytest.skip("this file system keeps no birth time")
    assert abs(born - datetime.now(UTC)) < timedelta(seconds=5)
    lines, _ = LogTail([str(log)], attempt_start=started).read_new({})
    assert _texts(lines) == ["loading", "step=1"]
    lines, _ = LogTail([str(log)], attempt_start=_after_the_files()).read_new({})
    assert lines == []


def test_anchor_records_where_each_file_ends_and_reads_nothing(tmp_path: Path, no_birth_time: None) -> None:
    # What JobRecovery records before its first watch: a watch cancelled later then loses no anchor.
    log = tmp_path / "train.log"
    _append(log, OLD_CRASH)
    tail = LogTail([str(tmp_path / "*.log")], attempt_start=_after_the_files())
    anchored = tail.anchor({})
    assert positions(anchored) == {str(log): log.stat().st_size}
    assert tail.anchor(anchored) == anchored  # anchored once: the same offsets again

    _append(log, "RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    lines, _ = LogTail([str(tmp_path / "*.log")], attempt_start=_after_the_files()).read_new(anchored)
    assert _texts(lines) == ["RuntimeError: CUDA error: uncorrectable ECC error encountered"]


def test_anchor_without_an_attempt_start_leaves_the_offsets_alone(tmp_path: Path) -> None:
    _append(tmp_path / "train.log", OLD_CRASH)
    assert LogTail([str(tmp_path / "*.log")]).anchor({}) == {}
