"""JobRecovery's resume verification on a real (in-memory) Temporal dev server over the FakeScheduler: a restarted
job that fails again is judged on its own lines, and a job that prints no step line is verified by a new
checkpoint (a fake scanner behind the scanner's interface reads the test's checkpoint directory)."""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest_asyncio
from temporalio.client import Client

from activities.logs.watch import WatchActivities
from tests.workflows.test_job_recovery import Handle, Harness, until
from workflows.domain.checkpoints import CheckpointFormat, CheckpointRef, CheckpointReport
from workflows.domain.recovery import JobRecoveryInput, RecoverySpec, RecoveryState
from workflows.job_recovery import JobRecoveryWorkflow

_STEP = re.compile(r"step=(\d+)")


def scan_lightning_dir(directory: Path) -> CheckpointReport:
    """A fake scanner: every ``*step=N.ckpt`` file is a valid checkpoint saved at its mtime; the newest step wins."""
    if not directory.is_dir():
        return CheckpointReport(dir=str(directory), format=None, latest_valid=None, error="missing")
    refs = []
    for path in directory.glob("*.ckpt"):
        found = _STEP.search(path.name)
        if found:
            saved = datetime.fromtimestamp(path.stat().st_mtime, UTC)
            refs.append(
                CheckpointRef(path=str(path), step=int(found[1]), saved_at=saved, format=CheckpointFormat.LIGHTNING)
            )
    latest = max(refs, key=lambda r: r.step or 0, default=None)
    return CheckpointReport(dir=str(directory), format=CheckpointFormat.LIGHTNING, latest_valid=latest)


class ResumeHarness(Harness):
    """The recovery harness with the checkpoint scanner wired into the resume check."""

    def watch_activities(self) -> WatchActivities:
        return WatchActivities(self.snapshots, checkpoints=scan_lightning_dir)

    async def start_spec(self, job_id: int, **spec: object) -> Handle:
        full = RecoverySpec.model_validate({"logs": (str(self.tmp / "job-%j-*.log"),), **spec})
        return await self.client.start_workflow(
            JobRecoveryWorkflow.run,
            JobRecoveryInput(cluster=self.cluster, job_id=job_id, poll_interval_s=0.1, spec=full),
            id=f"rebound/test/job/{job_id}/{uuid.uuid4().hex}",
            task_queue=self.task_queue,
        )


@pytest_asyncio.fixture
async def h(temporal_client: Client, task_queue: str, tmp_path: Path) -> AsyncIterator[ResumeHarness]:
    harness = ResumeHarness(temporal_client, task_queue, tmp_path)
    async with harness.worker():
        yield harness


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


async def test_a_restarted_job_that_fails_again_is_judged_on_its_own_lines(h: ResumeHarness) -> None:
    job = h.sched.submit(h.nodes[:2], name="llm")
    handle = await h.start_spec(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    h.step(job.job_id, 0, 7, h.nodes[0])
    h.log(job.job_id, 2, f"{_now()} [ERROR] rank=2/4 node={h.nodes[1]} step=8 fatal error: exiting with code 13")
    h.sched.fail_job(job.job_id, exit_code=13)
    await until(handle, lambda s: s.state is RecoveryState.VERIFYING)

    h.sched.schedule()
    new_node = h.sched.jobs[job.job_id].nodes[0]
    again = f"{_now()} [ERROR] rank=0/4 node={new_node} step=5 fatal error: exiting with code 13"
    h.log(job.job_id, 0, again)
    h.sched.fail_job(job.job_id, exit_code=13)
    st = await until(handle, lambda s: len(s.incidents) >= 2 and s.incidents[1].attribution is not None)

    second = st.incidents[1]
    assert second.anomaly.summary.startswith("the restarted job failed before it trained a step: ")
    assert any(e.text.endswith("fatal error: exiting with code 13") and e.rank == 0 for e in second.anomaly.evidence)
    attribution = second.attribution
    assert attribution is not None and attribution.cause != "unknown"
    assert attribution.implicated_ranks == (0,) and attribution.implicated_nodes == (new_node,)
    assert st.incidents[0].outcome == "failed again before resuming"
    await handle.terminate()


async def test_a_job_without_step_lines_is_verified_by_a_new_checkpoint(h: ResumeHarness) -> None:
    ckpt = h.tmp / "ckpt"
    ckpt.mkdir()
    old = ckpt / "epoch=0-step=180.ckpt"
    old.write_bytes(b"x")
    os.utime(old, (1_000_000_000, 1_000_000_000))
    job = h.sched.submit(h.nodes[:2], name="lightning")
    handle = await h.start_spec(job.job_id, checkpoint_dir=str(ckpt))
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    h.log(job.job_id, 2, f"{_now()} [ERROR] rank=2/4 node={h.nodes[1]} fatal error: exiting with code 13")
    h.sched.fail_job(job.job_id, exit_code=13)
    st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    assert "a new complete checkpoint in" in st.timeline[-1].detail

    h.sched.schedule()
    await asyncio.sleep(0.5)  # a few polls with nothing new: still verifying
    st = await handle.query(JobRecoveryWorkflow.status)
    assert st.state is RecoveryState.VERIFYING
    (ckpt / "epoch=0-step=200.ckpt").write_bytes(b"x")
    st = await until(handle, lambda s: s.state is RecoveryState.WATCHING and s.incidents[-1].resumed_at is not None)
    assert st.timeline[-1].detail.endswith("epoch=0-step=200.ckpt (step 200) [signal: checkpoint]")
    assert st.incidents[0].outcome == "resumed"
    await handle.terminate()
