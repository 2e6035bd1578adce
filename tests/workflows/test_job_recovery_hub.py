"""JobRecovery through the watch hub (ADR 015) on a real dev server: the real WatchShard workflows and shard
activities, their per-shard subscription queues and signals, over the FakeScheduler and real rank log files."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest_asyncio
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.logs.job_logs import LogPolicy
from tests.workflows.hub_support import SHARDS, HubHarness, eventually
from tests.workflows.test_job_recovery import _actions, agent, until
from workers.watch_hub import build_watch_shards
from workflows.constants import WATCH_RETURNED_SIGNAL
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.incident import ActionKind
from workflows.domain.loop import JobWatchResult, WatchOutcome
from workflows.domain.recovery import RecoveryState
from workflows.domain.watch_hub import WatchEvent
from workflows.domain.watch_routing import shard_of
from workflows.job_recovery import JobRecoveryWorkflow


@pytest_asyncio.fixture
async def hh(temporal_client: Client, task_queue: str, tmp_path: Path) -> AsyncIterator[HubHarness]:
    async with HubHarness(temporal_client, task_queue, tmp_path).running() as harness:
        yield harness


async def test_a_crash_seen_by_the_hub_wakes_the_job_and_recovery_proceeds(hh: HubHarness) -> None:
    job = hh.sched.submit(hh.nodes[:2], name="llm")
    handle = await hh.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    await eventually(lambda: hh.members(job.job_id) == 1)
    hh.step(job.job_id, 0, 7, hh.nodes[0])
    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    hh.log(job.job_id, 2, f"{ts} [ERROR] rank=2/4 node={hh.nodes[1]} step=8 fatal error: exiting with code 13")
    hh.sched.fail_job(job.job_id, exit_code=13)

    st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    assert _actions(st, ActionKind.REQUEUE) == [str(job.job_id)]
    shard = shard_of(job.job_id, SHARDS)
    assert any(e.event == "WATCHED" and e.detail == f"watched by shard {shard} of {SHARDS}" for e in st.timeline)
    assert len(st.incidents) == 1
    # The resume check runs on its own queue; the job trains again and is watched again (subscription 2).
    hh.sched.schedule()
    hh.step(job.job_id, 0, 9, hh.sched.jobs[job.job_id].nodes[0])
    st = await until(handle, lambda s: s.state is RecoveryState.WATCHING and s.incidents[-1].resumed_at is not None)
    await eventually(lambda: hh.members(job.job_id) == 1)
    hh.sched.finish_job(job.job_id)
    result = await asyncio.wait_for(handle.result(), 20)
    assert result.state is RecoveryState.FINISHED
    assert len((await handle.query(JobRecoveryWorkflow.status)).incidents) == 1
    await eventually(lambda: hh.members(job.job_id) == 0)


async def test_a_gpu_signal_unsubscribes_the_job(hh: HubHarness) -> None:
    job = hh.sched.submit(hh.nodes[:2])
    handle = await hh.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    await eventually(lambda: hh.members(job.job_id) == 1)
    event = GpuEvent(
        kind=GpuEventKind.XID, host=hh.nodes[0], index=1, xid=79, observed_at=datetime.now(UTC), sequence=1
    )
    async with agent(hh, hh.nodes[0], event), agent(hh, hh.nodes[1]):  # the agent confirms what it signalled
        await handle.signal(JobRecoveryWorkflow.gpu_fault_reported, event)
        st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    assert st.incidents[0].attribution is not None and st.incidents[0].attribution.cause == "xid-79"
    # Unsubscribed: the hub stopped watching the job while its recovery ran (none watches a requeued attempt).
    await eventually(lambda: hh.members(job.job_id) == 0)


async def test_duplicate_and_stale_events_are_ignored_and_the_lease_is_renewed(hh: HubHarness) -> None:
    job = hh.sched.submit(hh.nodes[:2])
    handle = await hh.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    await eventually(lambda: hh.members(job.job_id) == 1)
    hub = hh.shards.hubs[shard_of(job.job_id, SHARDS)]
    [member] = [m for m in hub.members.values() if m.sub.watch.job_id == job.job_id]
    first_renewal = member.renewed_at
    # Events for another run or an old subscription (a predecessor's, a replay after a takeover) change nothing.
    gone = JobWatchResult(outcome=WatchOutcome.GONE, observed_at=datetime.now(UTC))
    for run_id, seq in (("another-run", member.sub.seq), (member.sub.run_id, member.sub.seq + 5)):
        await handle.signal(WATCH_RETURNED_SIGNAL, WatchEvent(run_id=run_id, seq=seq, shard=0, result=gone))
    # The lease (10 s here) runs out: the workflow renews the same subscription, the hub keeps its member.
    await eventually(lambda: member.renewed_at > first_renewal, timeout=20)
    assert hub.members[member.sub.workflow_id] is member
    st = await handle.query(JobRecoveryWorkflow.status)
    assert st.state is RecoveryState.WATCHING and st.incidents == ()
    hh.sched.finish_job(job.job_id)
    assert (await asyncio.wait_for(handle.result(), 20)).state is RecoveryState.FINISHED


async def test_an_answer_to_an_older_subscription_renews_the_current_one_at_once(
    temporal_client: Client, task_queue: str, tmp_path: Path
) -> None:
    """A shard taken over restores its members from a heartbeat that may predate the current subscription; it
    answers the old one and drops the member. The workflow ignores that answer but sends its current subscription
    again at once (not after a lease), so the job is watched again and its crash recovered."""
    hh = HubHarness(temporal_client, task_queue, tmp_path, lease_s=600)  # no lease renewal within the test
    async with hh.running():
        job = hh.sched.submit(2, start=False)
        handle = await hh.start(job.job_id)
        await eventually(lambda: hh.members(job.job_id) == 1)
        hub = hh.shards.hubs[shard_of(job.job_id, SHARDS)]
        hh.sched.schedule()  # the job starts: the first subscription's answer, the run subscribes again (seq 2)
        await eventually(lambda: any(m.sub.seq == 2 for m in hub.members.values()), timeout=15)
        await until(handle, lambda s: s.state is RecoveryState.WATCHING)
        [(key, member)] = [(k, m) for k, m in hub.members.items() if m.sub.watch.job_id == job.job_id]
        del hub.members[key]  # the restored shard answered an older subscription and dropped the member
        gone = JobWatchResult(outcome=WatchOutcome.GONE, observed_at=datetime.now(UTC))
        older = WatchEvent(run_id=member.sub.run_id, seq=member.sub.seq - 1, shard=0, result=gone)
        await handle.signal(WATCH_RETURNED_SIGNAL, older)
        await eventually(lambda: hh.members(job.job_id) == 1, timeout=15)  # subscribed again, seconds later
        assert hub.members[key].sub.seq == member.sub.seq
        st = await handle.query(JobRecoveryWorkflow.status)
        assert st.state is RecoveryState.WATCHING and st.incidents == ()  # the old answer itself changed nothing
        hh.sched.fail_job(job.job_id, exit_code=1)
        st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING, timeout=30)
        assert _actions(st, ActionKind.REQUEUE) == [str(job.job_id)]
        await handle.terminate("test over")


async def test_recovery_proceeds_while_more_jobs_are_watched_than_the_acting_queue_has_slots(
    temporal_client: Client, task_queue: str, tmp_path: Path
) -> None:
    """Twelve watched jobs, four acting slots: with a per-job watch activity none would ever be recovered."""
    harness = HubHarness(temporal_client, task_queue, tmp_path, acting_slots=4)
    harness.nodes += [f"{harness.nodes[0]}x{i}" for i in range(24)]
    harness.sched = type(harness.sched)(harness.nodes)
    harness.snapshots = type(harness.snapshots)(harness.sched, max_age_s=0.05)
    harness.shards = build_watch_shards(temporal_client, harness.snapshots, LogPolicy())
    async with harness.running() as hh:
        jobs = [hh.sched.submit(2) for _ in range(12)]
        handles = [await hh.start(j.job_id) for j in jobs]
        for handle in handles:
            await until(handle, lambda s: s.state is RecoveryState.WATCHING, timeout=60)
        await eventually(lambda: all(hh.members(j.job_id) == 1 for j in jobs), timeout=30)
        victim = jobs[5]
        hh.sched.fail_job(victim.job_id, exit_code=1)
        st = await until(handles[5], lambda s: s.state is RecoveryState.VERIFYING, timeout=30)
        assert _actions(st, ActionKind.REQUEUE) == [str(victim.job_id)]
        assert all(hh.members(j.job_id) == 1 for j in jobs if j is not victim)
        for handle in handles:
            await handle.terminate("test over")


async def test_a_shard_moves_to_another_worker_with_its_members_and_the_crash_is_seen_once(
    temporal_client: Client, task_queue: str, tmp_path: Path
) -> None:
    """Two processes' worth of shard workers; the one running the job's shard stops; the other restores the
    shard's members from the heartbeat and sees the crash that happened meanwhile (the SIGKILL case is the lab's
    ``tests/e2e/test_watch_takeover.py``)."""
    hh = HubHarness(temporal_client, task_queue, tmp_path, lease_s=600)  # no renewal within the test: a restore
    hh.heartbeat_timeout_s = 5.0
    async with hh.running():
        job = hh.sched.submit(hh.nodes[:2])
        handle = await hh.start(job.job_id)
        await until(handle, lambda s: s.state is RecoveryState.WATCHING)
        await eventually(lambda: hh.members(job.job_id) == 1)
        shard = shard_of(job.job_id, SHARDS)
        first = hh.shards.hubs[shard]
        hh.step(job.job_id, 0, 1, hh.nodes[0])
        await eventually(lambda: not first.changed)  # the member is in the details; the SDK sends within ~4 s
        await asyncio.sleep(5)
        # Another process: its own connection (the SDK allows one worker per queue and connection).
        second = await Client.connect(
            temporal_client.service_client.config.target_host, data_converter=pydantic_data_converter
        )
        other = build_watch_shards(second, hh.snapshots, LogPolicy())
        async with Worker(second, task_queue=hh.watch_queue, activities=[other.watch_shard]):
            assert hh.watch_worker is not None
            await hh.watch_worker.shutdown()  # its shard activities are cancelled, retried on the other worker
            await eventually(lambda: shard in other.hubs, timeout=30)
            assert other.hubs[shard].members.keys() == first.members.keys()  # restored from the heartbeat
            hh.log(job.job_id, 1, "RuntimeError: CUDA error: an illegal memory access was encountered")
            hh.sched.fail_job(job.job_id, exit_code=1)
            st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING, timeout=30)
            assert len(st.incidents) == 1
            assert _actions(st, ActionKind.REQUEUE) == [str(job.job_id)]
            await handle.terminate("test over")
