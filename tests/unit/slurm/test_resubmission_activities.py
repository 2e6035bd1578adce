"""The capture and resubmission activities: the script stays on the worker, a retry after a crash adopts."""

from __future__ import annotations

import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.slurm.resubmission import SubmissionActivities
from activities.slurm.submission import token_in
from tests.fakes.scheduler import FakeScheduler
from workflows.domain.submission import CaptureSubmissionInput, ResubmitInput

SCRIPT = b"#!/bin/bash\n#SBATCH -N 2\nexport WANDB_API_KEY=secret\nsrun python train.py\n"


async def test_capture_then_resubmit_once_across_a_lost_answer(tmp_path: Path) -> None:
    fake = FakeScheduler()
    old = fake.submit(2, requeue=False, comment="rebound: budget=2", user_id=1000)
    fake.scripts[old.job_id] = SCRIPT
    acts = SubmissionActivities(fake, tmp_path)
    env = ActivityEnvironment()
    captured = await env.run(acts.capture_submission, CaptureSubmissionInput(cluster="lab", job_id=old.job_id))
    facts = captured.facts
    assert facts is not None and facts.script_bytes == len(SCRIPT)
    assert b"secret" not in captured.model_dump_json().encode()  # history holds a path and a digest only
    assert _file(facts.script_path) == (SCRIPT, 0o600, 0o700)
    assert "not captured" in facts.environment_note and facts.environment_path == ""

    fake.fail_job(old.job_id)
    inp = ResubmitInput(facts=facts, exclude=("n1",), token="1.1.00000000", reserved_at=datetime.now(UTC), key="k")
    fake.lose_submit_answer = 1
    with pytest.raises(ApplicationError) as caught:
        await env.run(acts.resubmit_job, inp)
    assert not caught.value.non_retryable  # Temporal retries it...
    outcome = await env.run(acts.resubmit_job, inp)  # ...and the retry adopts
    assert outcome.adopted and len(fake.submitted) == 1
    assert token_in(fake.jobs[outcome.job_id].comment) == "1.1.00000000"
    args, script, job_env = fake.submitted[0]
    assert script == SCRIPT and "--uid=1000" in args and "--exclude=n1" in args
    assert job_env["PATH"] == "/usr/local/bin:/usr/bin:/bin"


async def test_a_changed_script_is_refused(tmp_path: Path) -> None:
    fake = FakeScheduler()
    old = fake.submit(1, requeue=False, user_id=0)
    acts = SubmissionActivities(fake, tmp_path)
    env = ActivityEnvironment()
    facts = (await env.run(acts.capture_submission, CaptureSubmissionInput(cluster="lab", job_id=old.job_id))).facts
    assert facts is not None
    _tamper(facts.script_path)
    inp = ResubmitInput(facts=facts, token="1.1.00000000", reserved_at=datetime.now(UTC), key="k")
    with pytest.raises(ApplicationError) as caught:
        await env.run(acts.resubmit_job, inp)
    assert caught.value.non_retryable and fake.submitted == []


async def test_an_unknown_job_is_not_captured_and_says_why(tmp_path: Path) -> None:
    acts = SubmissionActivities(FakeScheduler(), tmp_path)
    result = await ActivityEnvironment().run(acts.capture_submission, CaptureSubmissionInput(cluster="lab", job_id=99))
    assert result.facts is None and "JOB_NOT_FOUND" in result.note


def _file(name: str) -> tuple[bytes, int, int]:
    path = Path(name)
    return path.read_bytes(), stat.S_IMODE(path.stat().st_mode), stat.S_IMODE(path.parent.stat().st_mode)


def _tamper(name: str) -> None:
    Path(name).write_bytes(b"#!/bin/sh\nrm -rf ~\n")


async def test_a_captured_environment_stays_in_a_private_file_and_reaches_sbatch(tmp_path: Path) -> None:
    fake = FakeScheduler()
    old = fake.submit(1, requeue=False, user_id=0)
    fake.environments[old.job_id] = {"PATH": "/opt/venv/bin", "HF_TOKEN": "hf_secret", "SLURM_JOB_ID": "1"}
    acts = SubmissionActivities(fake, tmp_path)
    env = ActivityEnvironment()
    captured = await env.run(acts.capture_submission, CaptureSubmissionInput(cluster="lab", job_id=old.job_id))
    facts = captured.facts
    assert facts is not None and "hf_secret" not in captured.model_dump_json()
    assert _file(facts.environment_path)[1] == 0o600
    fake.fail_job(old.job_id)
    inp = ResubmitInput(facts=facts, token="1.1.00000000", reserved_at=datetime.now(UTC), key="k")
    await env.run(acts.resubmit_job, inp)
    assert fake.submitted[0][2] == {"PATH": "/opt/venv/bin", "HF_TOKEN": "hf_secret"}  # Slurm's own left out
