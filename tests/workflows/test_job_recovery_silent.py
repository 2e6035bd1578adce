"""A job that prints no step line, on a real (in-memory) Temporal dev server: JobRecovery samples its ranks through
fake node agents (one worker per node, activities registered by name) and its checkpoint directory, and a job
whose ranks stay parked in a collective past the window is a hang; the timeline says which window applied."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest_asyncio
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from tests.workflows.test_job_recovery import Handle, until
from tests.workflows.test_job_recovery_resume import ResumeHarness
from workflows.constants import node_task_queue
from workflows.domain.hang import HangPolicy, WindowBasis
from workflows.domain.incident import AnomalyKind
from workflows.domain.procs import (
    NodeProcessesInput,
    NodeProcessesResult,
    RankProcess,
    RankStack,
    StackDumpInput,
    StackDumpResult,
)
from workflows.domain.recovery import DetectionPolicy, JobRecoveryInput, RecoverySpec, RecoveryState
from workflows.domain.slurm import JobState
from workflows.job_recovery import JobRecoveryWorkflow

PARKED = (
    "wait (/venv/torch/distributed/distributed_c10d.py:2501)",
    "all_reduce (/venv/torch/distributed/distributed_c10d.py:2498)",
    "training_step (/home/u/train.py:40)",
)
#: Where a running rank is at each dump: another function every time (line numbers are not compared).
MOVING = ("layer_{n} (/home/u/model.py:10)", "training_step (/home/u/train.py:30)")


class FakeAgent:
    """One node's agent: its two ranks, parked in a collective or (``moving``) somewhere new at every dump."""

    def __init__(self, node: str, first_rank: int) -> None:
        self.node, self.ranks, self.moving, self.dumps = node, (first_rank, first_rank + 1), False, 0

    def activities(self) -> list[Callable[..., Any]]:
        @activity.defn(name="node_rank_processes")
        async def processes(inp: NodeProcessesInput) -> NodeProcessesResult:
            procs = tuple(
                RankProcess(pid=100 + r, rank=r, job_id=inp.job_id, node=self.node, state="R", cpu_time_s=self.dumps)
                for r in self.ranks
            )  # CPU time always advances: NCCL busy-polls
            return NodeProcessesResult(node=self.node, observed_at=datetime.now(UTC), processes=procs)

        @activity.defn(name="node_dump_stacks")
        async def stacks(inp: StackDumpInput) -> StackDumpResult:
            self.dumps += 1
            frames = tuple(f.format(n=self.dumps) for f in MOVING) if self.moving else PARKED
            dumped = tuple(RankStack(rank=r, pid=100 + r, node=self.node, main_frames=frames) for r in self.ranks)
            return StackDumpResult(node=self.node, stacks=dumped)

        return [processes, stacks]


@pytest_asyncio.fixture
async def h(temporal_client: Client, task_queue: str, tmp_path: Path) -> AsyncIterator[ResumeHarness]:
    harness = ResumeHarness(temporal_client, task_queue, tmp_path)
    async with harness.worker():
        yield harness


async def _start(h: ResumeHarness, job_id: int, agents: list[FakeAgent], stack: AsyncExitStack) -> Handle:
    for agent in agents:
        await stack.enter_async_context(
            Worker(h.client, task_queue=node_task_queue(agent.node), activities=agent.activities())
        )
    detection = DetectionPolicy(
        silent_sample_s=0.5, hang=HangPolicy(silent_default_s=3.0, floor_s=1.0), stack_dump_timeout_s=2.0
    )
    spec = RecoverySpec(logs=(str(h.tmp / "job-%j-*.log"),))
    return await h.client.start_workflow(
        JobRecoveryWorkflow.run,
        JobRecoveryInput(cluster=h.cluster, job_id=job_id, poll_interval_s=0.1, spec=spec, detection=detection),
        id=f"rebound/test/job/{job_id}/{uuid.uuid4().hex}",
        task_queue=h.task_queue,
    )


async def test_ranks_parked_in_a_collective_past_the_default_window_are_a_hang(h: ResumeHarness) -> None:
    job = h.sched.submit(h.nodes[:2], name="lightning")
    agents = [FakeAgent(h.nodes[0], 0), FakeAgent(h.nodes[1], 2)]
    async with AsyncExitStack() as stack:
        handle = await _start(h, job.job_id, agents, stack)
        st = await until(handle, lambda s: bool(s.incidents) and bool(s.incidents[0].stacks), timeout=30)
        incident = st.incidents[0]
        assert incident.anomaly.kind is AnomalyKind.HANG
        assert incident.hang is not None and incident.hang.basis is WindowBasis.DEFAULT
        assert "parked in wait (distributed_c10d.py)" in incident.hang.summary
        notes = [e.detail for e in st.timeline if e.event == "LIVENESS"]
        assert notes and "the operator's default 3 s" in notes[0]
        await handle.terminate()


async def test_ranks_whose_stacks_move_are_not_a_hang(h: ResumeHarness) -> None:
    job = h.sched.submit(h.nodes[:2], name="lightning")
    agents = [FakeAgent(h.nodes[0], 0), FakeAgent(h.nodes[1], 2)]
    for agent in agents:
        agent.moving = True
    async with AsyncExitStack() as stack:
        handle = await _start(h, job.job_id, agents, stack)
        await asyncio.sleep(6)  # twice the window
        st = await handle.query(JobRecoveryWorkflow.status)
        assert not st.incidents and st.state is RecoveryState.WATCHING
        assert agents[0].dumps >= 3  # sampled several times (the parked twin above is a hang in ~4 s)
        assert [e.event for e in st.timeline].count("LIVENESS") == 1  # the window said once
        await handle.terminate()


async def test_a_restarted_job_without_step_lines_is_verified_by_its_moving_stacks(h: ResumeHarness) -> None:
    job = h.sched.submit(h.nodes[:2], name="lightning")
    agents = [FakeAgent(node, 2 * i) for i, node in enumerate(h.nodes)]
    for agent in agents:
        agent.moving = True
    async with AsyncExitStack() as stack:
        handle = await _start(h, job.job_id, agents, stack)
        await until(handle, lambda s: s.state is RecoveryState.WATCHING)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        h.log(job.job_id, 2, f"{now} [ERROR] rank=2/4 node={h.nodes[1]} fatal error: exiting with code 13")
        h.sched.fail_job(job.job_id, exit_code=13)
        await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
        h.sched.schedule()
        st = await until(handle, lambda s: bool(s.incidents) and s.incidents[0].resumed_at is not None, timeout=30)
        watching = [e.detail for e in st.timeline if e.event == "WATCHING"]
        assert watching[-1].endswith("[signal: stacks]")
        assert st.incidents[0].outcome == "resumed"
        await handle.terminate()


async def test_after_a_resume_seen_by_stacks_the_old_attempts_last_words_are_not_a_new_incident(
    h: ResumeHarness,
) -> None:
    """The resume check, cancelled when the stacks moved, hands back no offsets: the watch that follows starts
    where the new attempt's files end when it was first seen running (``job_log_anchor``), not where the resume
    check began, so what the old attempt wrote while it was torn down is not read again as the new one's crash."""
    job = h.sched.submit(h.nodes[:2], name="lightning")
    agents = [FakeAgent(node, 2 * i) for i, node in enumerate(h.nodes)]
    for agent in agents:
        agent.moving = True
    async with AsyncExitStack() as stack:
        handle = await _start(h, job.job_id, agents, stack)
        await until(handle, lambda s: s.state is RecoveryState.WATCHING)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        h.log(job.job_id, 2, f"{now} [ERROR] rank=2/4 node={h.nodes[1]} fatal error: exiting with code 13")
        h.sched.requeue_completes_instantly = False  # Slurm tears the old attempt down after the requeue
        h.sched.fail_job(job.job_id, exit_code=13)
        await until(handle, lambda s: s.state is RecoveryState.RESTARTING)
        await until(handle, lambda s: h.sched.jobs[job.job_id].state is JobState.COMPLETING)
        # The old attempt's last words while it is torn down, unstamped: read only by the resume check.
        h.log(job.job_id, 3, "Traceback (most recent call last):", "RuntimeError: Connection closed by peer")
        h.log(job.job_id, 0, "srun: error: n2: task 1: Exited with exit code 1")
        h.sched.settle(job.job_id)
        await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
        await asyncio.sleep(0.5)  # the resume check reads them while the job waits to start
        h.sched.schedule()
        st = await until(handle, lambda s: bool(s.incidents) and s.incidents[0].resumed_at is not None, timeout=30)
        assert [e.detail for e in st.timeline if e.event == "WATCHING"][-1].endswith("[signal: stacks]")
        await asyncio.sleep(2)  # twenty watch polls
        st = await handle.query(JobRecoveryWorkflow.status)
        assert [i.number for i in st.incidents] == [1], [e.detail for e in st.timeline if e.event == "DETECTED"]
        assert st.state is RecoveryState.WATCHING
        await handle.terminate()
