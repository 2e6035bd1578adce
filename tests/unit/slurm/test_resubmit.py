"""Resubmission at the port (ADR 014): the recorded options, sbatch's arguments, and one new job per token."""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from activities.slurm.parse import load_payload, parse_submission
from activities.slurm.port import ResubmitRequest
from activities.slurm.submission import (
    comment_with_token,
    job_environment,
    parse_saved_environment,
    sbatch_arguments,
    token_in,
)
from tests.fakes.scheduler import FakeScheduler
from tests.unit.slurm import golden
from tests.unit.slurm.fake_bin import FakeSlurmBin
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.submission import SubmissionOptions
from workflows.policy.optin import parse_comment

TOKEN = "7.1.0123456789abcdef"


def test_options_as_slurm_recorded_them() -> None:
    payload = load_payload(golden.read("squeue.json"), source="squeue --json")
    jobs = payload["jobs"]
    assert isinstance(jobs, list)
    sub = parse_submission(jobs[0])
    assert (sub.job_id, sub.user_id, sub.group_id, sub.working_directory) == (1, 0, 0, "/lab/jobs")
    o = sub.options
    assert (o.name, o.partition, o.nodes, o.ntasks, o.ntasks_per_node) == ("train-a", "main", 2, 2, 1)
    assert (o.gres, o.time_limit_min, o.comment, o.requeue) == ("gpu:2", 525600, "rebound:watch", True)
    assert o.output == "/lab/jobs/train-%j.out"  # the pattern, not the first job's path


def test_a_job_without_owner_cannot_be_resubmitted() -> None:
    with pytest.raises(ReboundError) as caught:
        parse_submission({"job_id": 3, "user_id": 4294967294, "group_id": 0, "current_working_directory": "/x"})
    assert caught.value.kind is FailureKind.SCHEDULER_BAD_RESPONSE


def test_sbatch_arguments_run_as_the_owner_off_the_bad_nodes() -> None:
    options = SubmissionOptions(
        name="llm",
        partition="gpu",
        nodes=2,
        ntasks=8,
        ntasks_per_node=4,
        gres="gpu:4",
        time_limit_min=60,
        output="/runs/%x-%j.out",
        comment="rebound: budget=3",
        excluded_nodes=("n9",),
        account="ml",
    )
    args = sbatch_arguments(
        options, user_id=1001, group_id=1002, working_directory="/home/u", exclude=["n2", "n3"], token=TOKEN
    )
    assert args[:4] == ["--parsable", "--uid=1001", "--gid=1002", "--chdir=/home/u"]
    for expected in (
        "--job-name=llm",
        "--partition=gpu",
        "--nodes=2",
        "--ntasks=8",
        "--ntasks-per-node=4",
        "--gres=gpu:4",
        "--time=60",
        "--output=/runs/%x-%j.out",
        "--account=ml",
        "--exclude=n[2-3,9]",
        "--no-requeue",
        f"--comment=rebound: budget=3 |rb-resubmit={TOKEN}",
    ):
        assert expected in args
    assert not any(a.startswith("--qos") for a in args)


def test_a_derived_tasks_per_node_that_disagrees_is_left_out() -> None:
    options = SubmissionOptions(nodes=2, ntasks=3, ntasks_per_node=1)
    args = sbatch_arguments(options, user_id=1, group_id=1, working_directory="/", exclude=(), token=TOKEN)
    assert "--ntasks=3" in args and not any(a.startswith("--ntasks-per-node") for a in args)


def test_the_token_keeps_the_opt_in_and_replaces_an_older_token() -> None:
    once = comment_with_token("rebound: budget=2", TOKEN)
    assert token_in(once) == TOKEN
    again = comment_with_token(once, "7.2.ffffffffffffffff")
    assert token_in(again) == "7.2.ffffffffffffffff" and again.count("rb-resubmit=") == 1
    spec = parse_comment(again)
    assert spec is not None and spec.restart_budget == 2
    assert comment_with_token("", TOKEN) == f"rb-resubmit={TOKEN}" and parse_comment(f"rb-resubmit={TOKEN}") is None


def test_environment_without_slurm_variables_or_a_minimal_one() -> None:
    env, note = job_environment(
        {"PATH": "/opt/bin", "SLURM_JOB_ID": "7", "SBATCH_ACCOUNT": "x", "HF_HOME": "/h"}, user_id=0
    )
    assert env == {"PATH": "/opt/bin", "HF_HOME": "/h"} and "captured" in note
    env, note = job_environment(None, user_id=0)
    assert env["USER"] == "root" and env["PATH"] == "/usr/local/bin:/usr/bin:/bin" and "not captured" in note


def _request(job_id: int, user_id: int, *, exclude: tuple[str, ...] = ("n1",)) -> ResubmitRequest:
    return ResubmitRequest(
        job_id=job_id,
        user="u",
        user_id=user_id,
        group_id=user_id,
        working_directory="/lab/runs",
        options=SubmissionOptions(name="train", nodes=2, requeue=False, comment="rebound"),
        script=b"#!/bin/sh\n",
        environment={"PATH": "/bin"},
        exclude=exclude,
        token=TOKEN,
        not_before=datetime.now(UTC),
    )


async def test_a_lost_answer_is_adopted_by_the_retry_not_submitted_again() -> None:
    fake = FakeScheduler()
    old = fake.submit(2, requeue=False, comment="rebound", user_id=1000)
    fake.fail_job(old.job_id)
    fake.lose_submit_answer = 1  # sbatch goes through, then the worker dies before the id is recorded
    with pytest.raises(ReboundError):
        await fake.resubmit_excluding(_request(old.job_id, 1000))
    assert len(fake.submitted) == 1
    result = await fake.resubmit_excluding(_request(old.job_id, 1000))
    assert result.adopted and len(fake.submitted) == 1
    new = fake.jobs[result.job_id]
    assert new.user_id == 1000 and token_in(new.comment) == TOKEN and new.excluded_nodes == ("n1",)
    assert [j.job_id for j in fake.jobs.values() if token_in(j.comment) == TOKEN] == [result.job_id]


async def test_a_token_in_another_users_job_or_an_old_job_is_not_adopted() -> None:
    fake = FakeScheduler()
    old = fake.submit(2, requeue=False, comment="rebound", user_id=1000)
    fake.submit(1, start=False, comment=f"x |rb-resubmit={TOKEN}", user_id=2000)  # someone copied the token
    stale = fake.submit(1, start=False, comment=f"rb-resubmit={TOKEN}", user_id=1000)
    fake._update(stale.job_id, submit_time=datetime.now(UTC) - timedelta(hours=1))  # before the reservation
    result = await fake.resubmit_excluding(_request(old.job_id, 1000))
    assert not result.adopted and len(fake.submitted) == 1


def _saved(*entries: str) -> bytes:
    return struct.pack("=I", len(entries)) + b"".join(e.encode() + b"\0" for e in entries)


def test_slurmctld_saved_environment() -> None:
    assert parse_saved_environment(_saved("PATH=/opt/bin", "HF_TOKEN=x=y")) == {"PATH": "/opt/bin", "HF_TOKEN": "x=y"}
    assert parse_saved_environment(_saved("A=1")[:-1]) is None  # truncated
    assert parse_saved_environment(struct.pack("=I", 3) + b"A=1\0") is None  # fewer entries than counted
    assert parse_saved_environment(b"") is None


async def test_cli_reads_the_script_and_submits_with_an_argument_list(tmp_path: Path) -> None:
    bin_ = FakeSlurmBin(tmp_path)
    ctld = tmp_path / "ctld"
    (ctld / "hash.1" / "job.1").mkdir(parents=True)
    (ctld / "hash.1" / "job.1" / "environment").write_bytes(_saved("PATH=/opt/venv/bin", "SLURM_CONF=/x"))
    bin_.respond("scontrol", stdout=b"#!/bin/bash\n#SBATCH -N 2\nsrun python train.py\n", call=1)
    bin_.respond("scontrol", stdout=f"SlurmUser = slurm\nStateSaveLocation = {ctld}\n", call=2)
    bin_.respond("sbatch", stdout=b"42\n")
    cli = bin_.scheduler()
    sub = await cli.read_submission(1)
    assert sub.script.startswith(b"#!/bin/bash") and sub.options.name == "train-a"
    assert bin_.calls("scontrol")[0] == ["scontrol", "write", "batch_script", "1", "-"]
    assert sub.environment == {"PATH": "/opt/venv/bin", "SLURM_CONF": "/x"} and "2 variables" in sub.environment_note
    req = _request(1, 0).model_copy(update={"environment": {"PATH": "/bin", "FAKE_SLURM_DIR": str(bin_.state)}})
    result = await cli.resubmit_excluding(req)
    assert result.job_id == 42 and not result.adopted
    argv = bin_.calls("sbatch")[-1]
    assert "--uid=0" in argv and "--exclude=n1" in argv and f"--comment=rebound |rb-resubmit={TOKEN}" in argv


async def test_cli_adopts_a_job_carrying_the_token(tmp_path: Path) -> None:
    bin_ = FakeSlurmBin(tmp_path)
    bin_.respond(
        "squeue",
        stdout=golden.squeue_with(
            job_5={"comment": f"rebound |rb-resubmit={TOKEN}", "submit_time": int(datetime.now(UTC).timestamp())}
        ),
    )
    result = await bin_.scheduler().resubmit_excluding(_request(1, 0))
    assert result.adopted and result.job_id == 5 and bin_.calls("sbatch") == []


async def test_cli_sbatch_refusal_is_classified(tmp_path: Path) -> None:
    bin_ = FakeSlurmBin(tmp_path)
    bin_.respond("sbatch", stderr="sbatch: error: Batch job submission failed: Invalid job id specified\n", rc=1)
    req = _request(1, 0).model_copy(update={"environment": {"FAKE_SLURM_DIR": str(bin_.state)}})
    with pytest.raises(ReboundError) as caught:
        await bin_.scheduler().resubmit_excluding(req)
    assert not caught.value.kind.retryable


async def test_cli_without_a_readable_saved_environment_says_so(tmp_path: Path) -> None:
    bin_ = FakeSlurmBin(tmp_path)
    bin_.respond("scontrol", stdout=b"#!/bin/sh\n", call=1)
    bin_.respond("scontrol", stdout=f"StateSaveLocation = {tmp_path / 'nowhere'}\n", call=2)
    sub = await bin_.scheduler().read_submission(1)
    assert sub.environment is None and "not captured" in sub.environment_note
