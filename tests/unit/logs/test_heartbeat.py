"""Heartbeat files: each rank's newest mtime, found through the log tailer's patterns and access policy."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from activities.logs.access import LogAccess
from activities.logs.heartbeat import heartbeat_times
from workflows.domain.slurm import JobState, SlurmJob


def _touch(path: Path, epoch: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    os.utime(path, (epoch, epoch))


def test_ranks_from_the_placeholder_or_the_name_newest_mtime_wins(tmp_path: Path) -> None:
    _touch(tmp_path / "a" / "job-7-rank-0.hb", 1000)
    _touch(tmp_path / "a" / "job-7-rank-1.hb", 1010)
    _touch(tmp_path / "b" / "rank_1.beat", 1020)  # a second file for rank 1, newer
    _touch(tmp_path / "b" / "alive.beat", 1030)  # names no rank: ignored
    _touch(tmp_path / "a" / "job-8-rank-0.hb", 1040)  # another job
    got = heartbeat_times([str(tmp_path / "a" / "job-%j-rank-%t.hb"), str(tmp_path / "b" / "*.beat")], 7)
    assert got == {0: datetime.fromtimestamp(1000, UTC), 1: datetime.fromtimestamp(1020, UTC)}


def test_files_outside_the_roots_are_not_looked_at(tmp_path: Path) -> None:
    _touch(tmp_path / "runs" / "rank-0.hb", 1000)
    _touch(tmp_path / "elsewhere" / "rank-1.hb", 1000)
    access = LogAccess([tmp_path / "runs"])
    got = heartbeat_times([str(tmp_path / "runs" / "*.hb"), str(tmp_path / "elsewhere" / "*.hb")], 7, access)
    assert set(got) == {0}


def test_no_files_no_ranks(tmp_path: Path) -> None:
    assert heartbeat_times([str(tmp_path / "missing-%t.hb")], 7) == {}


def test_an_array_task_never_counts_a_siblings_heartbeat(tmp_path: Path) -> None:
    _touch(tmp_path / "hb-1_0-rank-0", 1000)
    _touch(tmp_path / "hb-1_1-rank-0", 2000)  # task 1 is alive; task 0 (job 8) may be hung
    task0 = SlurmJob(job_id=8, state=JobState.RUNNING, array_job_id=1, array_task_id=0)
    got = heartbeat_times([str(tmp_path / "hb-%A_%a-rank-%t")], 8, None, task0)
    assert got == {0: datetime.fromtimestamp(1000, UTC)}
