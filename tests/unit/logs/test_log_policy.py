"""The watch's log policy: a job's log patterns are read only under the configured roots and only if its user owns
the files (the job owner writes the patterns; the worker often runs as root)."""

from __future__ import annotations

import os
from pathlib import Path

from activities.logs.job_logs import LogPolicy
from workflows.domain.slurm import JobState, SlurmJob


def _job(uid: int | None) -> SlurmJob:
    return SlurmJob(job_id=7, state=JobState.RUNNING, user_id=uid)


def test_files_under_the_roots_and_owned_by_the_jobs_user_are_read(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "runs", tmp_path / "etc"
    allowed.mkdir()
    outside.mkdir()
    policy = LogPolicy([allowed], require_owner=True)
    tail = policy.tail([str(allowed / "rank-*.log"), str(outside / "*")], _job(os.getuid()), 7)
    _, offsets = tail.read_new({})  # first seen: what exists now is older than the attempt (none here)
    (allowed / "rank-0.log").write_text("step=1\n")
    (outside / "secret").write_text("password\n")

    lines, _ = tail.read_new(offsets)
    assert [line.text for line in lines] == ["step=1"]
    assert any(str(outside) in key for key in tail.refused), tail.refused


def test_a_symlink_out_of_the_roots_is_refused(tmp_path: Path) -> None:
    allowed = tmp_path / "runs"
    allowed.mkdir()
    (tmp_path / "secret").write_text("password\n")
    (allowed / "rank-0.log").symlink_to(tmp_path / "secret")
    tail = LogPolicy([allowed]).tail([str(allowed / "*.log")], _job(os.getuid()), 7)
    lines, _ = tail.read_new({})
    assert lines == []
    assert tail.refused


def test_another_users_file_or_an_unknown_user_reads_nothing(tmp_path: Path) -> None:
    (tmp_path / "rank-0.log").write_text("step=1\n")
    policy = LogPolicy(require_owner=True)
    other = os.getuid() + 1
    for job in (_job(other), _job(None), None):
        tail = policy.tail([str(tmp_path / "*.log")], job, 7)
        lines, _ = tail.read_new({})
        assert lines == [], job
        assert tail.refused, job


def test_no_policy_configured_reads_everything(tmp_path: Path) -> None:
    tail = LogPolicy().tail([str(tmp_path / "*.log")], None, 7)
    _, offsets = tail.read_new({})
    (tmp_path / "rank-0.log").write_text("step=1\n")
    lines, _ = tail.read_new(offsets)
    assert [line.text for line in lines] == ["step=1"]
