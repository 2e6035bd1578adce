"""JobRecovery's resume verification on a real (in-memory) Temporal dev server over the FakeScheduler: a restarted
job that fails again is judged on its own lines, and a job that prints no step line is verified by a new
checkpoint (a fake scanner behind the scanner's interface reads the test's checkpoint directory)."""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest_asyncio
from temporalio import activity
from temporalio.client import Client

from activities.logs.watch import WatchActivities
from tests.workflows.test_job_recovery import Handle, Harness, until
from workflows.domain.checkpoints import (
    CheckedCheckpoint,
    CheckpointFormat,
    CheckpointQuarantineInput,
    CheckpointQuarantineResult,
    CheckpointRef,
    CheckpointReport,
    CheckpointScanInput,
    CheckpointStatus,
    IncompleteCheckpoint,
    QuarantineAction,
)
from workflows.domain.incident import ActionKind, AnomalyKind
from workflows.domain.recovery import JobRecoveryInput, RecoverySpec, RecoveryState
from workflows.domain.resume_point import ResumePoint
from workflows.job_recovery import JobRecoveryWorkflow

_STEP = re.compile(r"step=(\d+)")


def scan_lightning_dir(directory: Path, owner_uid: int | None = None) -> CheckpointReport:
    """A fake scanner: every ``*step=N.ckpt`` file is a valid checkpoint saved at its mtime, every
    ``*step=N.ckpt.tmp`` an unfinished save; the newest valid step wins."""
    if not directory.is_dir():
        return CheckpointReport(dir=str(directory), format=None, latest_valid=None, error="missing")
    refs, incomplete, checked = [], [], []
    for path in sorted(directory.iterdir()):
        found = _STEP.search(path.name)
        if not found:
            continue
        step = int(found[1])
        if path.name.endswith(".ckpt"):
            saved = datetime.fromtimestamp(path.stat().st_mtime, UTC)
            refs.append(CheckpointRef(path=str(path), step=step, saved_at=saved, format=CheckpointFormat.LIGHTNING))
            status = CheckpointStatus.VALID
        elif path.name.endswith(".ckpt.tmp"):
            incomplete.append(IncompleteCheckpoint(path=str(path), step=step, reason="a .tmp file: save unfinished"))
            status = CheckpointStatus.INCOMPLETE
        else:
            continue
        checked.append(
            CheckedCheckpoint(path=str(path), format=CheckpointFormat.LIGHTNING, step=step, status=status, reason="")
        )
    latest = max(refs, key=lambda r: r.step or 0, default=None)
    return CheckpointReport(
        dir=str(directory),
        format=CheckpointFormat.LIGHTNING,
        latest_valid=latest,
        incomplete=tuple(incomplete),
        checked=tuple(checked),
    )


@activity.defn(name="checkpoint_scan")
async def fake_checkpoint_scan(inp: CheckpointScanInput) -> CheckpointReport:
    return scan_lightning_dir(Path(inp.dir))


QUARANTINED: list[CheckpointQuarantineInput] = []


@activity.defn(name="checkpoint_quarantine")
async def fake_checkpoint_quarantine(inp: CheckpointQuarantineInput) -> CheckpointQuarantineResult:
    """Renames every unfinished save aside (never deletes), as the real activity does."""
    QUARANTINED.append(inp)
    moved = []
    for name in sorted(os.listdir(inp.dir)):  # noqa: ASYNC240 - a test fake on a tmp dir
        if name.endswith(".ckpt.tmp"):
            source = os.path.join(inp.dir, name)
            os.rename(source, source + ".rebound-quarantined")
            moved.append(source)
    action = QuarantineAction.QUARANTINED if moved else QuarantineAction.NOTHING
    return CheckpointQuarantineResult(action=action, reason="unfinished saves", set_aside=tuple(moved))


class ResumeHarness(Harness):
    """The recovery harness with the checkpoint scanner wired into the resume check."""

    def watch_activities(self) -> WatchActivities:
        return WatchActivities(self.snapshots, checkpoints=scan_lightning_dir, checkpoint_scan_every_s=0.2)

    def extra_activities(self) -> list[Callable[..., Any]]:
        return [fake_checkpoint_scan, fake_checkpoint_quarantine]

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
    watching = [e.detail for e in st.timeline if e.event == "WATCHING"]
    assert watching[-1].endswith("epoch=0-step=200.ckpt (step 200) [signal: checkpoint]")
    first = st.incidents[0]
    assert first.outcome == "resumed" and first.checkpoint is not None
    assert first.checkpoint.latest_valid is not None and first.checkpoint.latest_valid.step == 180
    assert first.checkpoint.last_seen_step is None and first.checkpoint.steps_lost is None  # it logs no steps
    # A new checkpoint says it trains, not where it started: only a load line or a step line would.
    assert first.resume_point is ResumePoint.UNCONFIRMED
    await handle.terminate()


def _lightning_dir(h: ResumeHarness, *, partial: bool) -> Path:
    ckpt = h.tmp / "ckpt"
    ckpt.mkdir()
    valid = ckpt / "epoch=0-step=180.ckpt"
    valid.write_bytes(b"x")
    os.utime(valid, (1_000_000_000, 1_000_000_000))
    if partial:
        (ckpt / "epoch=0-step=200.ckpt.tmp").write_bytes(b"")
    return ckpt


async def _crash_and_restart(h: ResumeHarness, job_id: int, handle: Handle, last_step: int) -> None:
    h.step(job_id, 0, last_step, h.nodes[0])
    h.log(job_id, 2, f"{_now()} [ERROR] rank=2/4 node={h.nodes[1]} fatal error: exiting with code 13")
    h.sched.fail_job(job_id, exit_code=13)
    await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    h.sched.schedule()


async def test_the_incident_records_the_checkpoint_quarantines_a_partial_save_and_verifies_the_resume(
    h: ResumeHarness,
) -> None:
    ckpt = _lightning_dir(h, partial=True)
    job = h.sched.submit(h.nodes[:2], name="lightning")
    handle = await h.start_spec(job.job_id, checkpoint_dir=str(ckpt), checkpoint_fallback="quarantine")
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    await _crash_and_restart(h, job.job_id, handle, last_step=203)

    st = await handle.query(JobRecoveryWorkflow.status)
    found = st.incidents[0].checkpoint
    assert found is not None and found.latest_valid is not None and found.latest_valid.step == 180
    assert found.last_seen_step == 203 and found.steps_lost == 23
    assert found.partial_newest is not None and found.partial_newest.path.endswith("step=200.ckpt.tmp")
    assert found.quarantined == (str(ckpt / "epoch=0-step=200.ckpt.tmp"),)
    assert not (ckpt / "epoch=0-step=200.ckpt.tmp").exists()
    quarantine = [a for a in st.incidents[0].actions if a.kind is ActionKind.QUARANTINE]
    assert len(quarantine) == 1 and quarantine[0].verified_at is not None
    assert quarantine[0].key.endswith("/incident-1/quarantine")
    summary = next(e.detail for e in st.timeline if e.event == "CHECKPOINT")
    assert "epoch=0-step=180.ckpt (step 180)" in summary and "23 steps will be redone (last seen step 203)" in summary
    assert "partial newer save" in summary and "step=200.ckpt.tmp (step 200)" in summary

    new_node = h.sched.jobs[job.job_id].nodes[0]
    h.log(job.job_id, 0, f"{_now()} Restoring states from the checkpoint path at {ckpt}/epoch=0-step=180.ckpt")
    h.step(job.job_id, 0, 181, new_node)
    st = await until(handle, lambda s: s.incidents[0].resume_point is not None)
    assert st.incidents[0].resume_point is ResumePoint.VERIFIED
    assert len(st.incidents) == 1
    await handle.terminate()


async def test_a_job_restarted_from_scratch_with_a_valid_checkpoint_is_an_incident(h: ResumeHarness) -> None:
    ckpt = _lightning_dir(h, partial=False)
    job = h.sched.submit(h.nodes[:2], name="lightning")
    handle = await h.start_spec(job.job_id, checkpoint_dir=str(ckpt))
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    await _crash_and_restart(h, job.job_id, handle, last_step=190)
    h.step(job.job_id, 0, 1, h.sched.jobs[job.job_id].nodes[0])
    st = await until(handle, lambda s: len(s.incidents) == 2)
    assert st.incidents[0].resume_point is ResumePoint.FROM_SCRATCH
    second = st.incidents[1]
    assert second.anomaly.kind is AnomalyKind.RESTARTED_FROM_SCRATCH and second.outcome == "restarted from scratch"
    assert (
        "its first step is 1, although" in second.anomaly.summary
        and "step=180.ckpt (step 180)" in second.anomaly.summary
    )
    assert st.state is RecoveryState.WATCHING and st.restarts_used == 1  # reported; a restart would do the same
    await handle.terminate()


async def test_a_corrupt_checkpoint_is_retried_once_then_given_up_with_what_to_do(h: ResumeHarness) -> None:
    ckpt = _lightning_dir(h, partial=True)
    job = h.sched.submit(h.nodes[:2], name="lightning")
    handle = await h.start_spec(job.job_id, checkpoint_dir=str(ckpt))
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    await _crash_and_restart(h, job.job_id, handle, last_step=203)

    for attempt in (1, 2):
        node = h.sched.jobs[job.job_id].nodes[0]
        h.log(job.job_id, 0, f"{_now()} Restoring states from the checkpoint path at {ckpt}/epoch=0-step=200.ckpt")
        h.log(job.job_id, 0, f"{_now()} [ERROR] rank=0/4 node={node} RuntimeError: PytorchStreamReader failed "
              "reading zip archive: failed finding central directory")  # fmt: skip
        h.sched.fail_job(job.job_id, exit_code=1)
        if attempt == 1:
            await until(handle, lambda s: len(s.incidents) == 2 and s.state is RecoveryState.VERIFYING)
            h.sched.schedule()
    result = await asyncio.wait_for(handle.result(), 30)
    st = await handle.query(JobRecoveryWorkflow.status)
    retried, final = st.incidents[1], st.incidents[2]
    assert retried.attribution is not None and retried.attribution.cause == "checkpoint-unreadable"
    assert retried.attribution.retryable and "step=200.ckpt.tmp" in retried.attribution.explanation
    assert "failed again after it started (logged a checkpoint load)" in retried.anomaly.summary
    assert final.attribution is not None and not final.attribution.retryable
    assert (
        final.attribution.cause == "checkpoint-unreadable"
        and "ckpt_fallback=quarantine" in final.attribution.explanation
    )
    assert result.state is RecoveryState.GAVE_UP and st.restarts_used == 2  # not the whole budget of 5
