"""ClusterWatch against a real (in-memory) Temporal dev server, with the FakeScheduler behind a SnapshotCache.

Most tests inject a recording start function into ``DiscoveryActivities``; the last ones use the real
Temporal starter against a stub ``JobRecovery`` workflow, to show that discovering a job twice starts it once.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from activities.slurm.snapshots import SnapshotCache
from activities.temporal.discovery import DiscoveryActivities, StartJobRecovery, TemporalJobRecoveryStarter
from tests.fakes.scheduler import FakeScheduler
from workflows.cluster_watch import MAX_STARTS_PER_ROUND, ClusterWatchWorkflow
from workflows.constants import CLUSTER, JOB_ID, JOB_RECOVERY_WORKFLOW, cluster_watch_workflow_id, job_workflow_id
from workflows.domain.checkpoints import CheckpointFallback
from workflows.domain.discovery import (
    ClusterWatchInput,
    ClusterWatchStatus,
    StartJobRecoveryInput,
    StartJobRecoveryResult,
)
from workflows.domain.recovery import JobRecoveryInput, RecoverySpec
from workflows.domain.slurm import SlurmJob
from workflows.policy.optin import JobSelector

POLL_S = 0.05


@dataclass
class _Recorder:
    """A start function that records every call; ``fail_first`` calls raise a non-retryable error."""

    fail_first: int = 0
    calls: list[StartJobRecoveryInput] = field(default_factory=list)

    async def __call__(self, inp: StartJobRecoveryInput) -> StartJobRecoveryResult:
        self.calls.append(inp)
        if len(self.calls) <= self.fail_first:
            raise ApplicationError("injected: Temporal refused the start", type="CONFIGURATION", non_retryable=True)
        return StartJobRecoveryResult(workflow_id=job_workflow_id(inp.cluster, inp.job_id), run_id="fake")

    def job_ids(self) -> list[int]:
        return [c.job_id for c in self.calls]


def _submit(sched: FakeScheduler, comment: str = "", *, name: str = "train") -> SlurmJob:
    job = sched.submit(1, name=name)
    sched.jobs[job.job_id] = job.model_copy(update={"comment": comment})
    return sched.jobs[job.job_id]


@asynccontextmanager
async def _cluster_watch(
    client: Client,
    task_queue: str,
    sched: FakeScheduler,
    start: StartJobRecovery | None = None,
    *,
    selectors: Sequence[JobSelector] = (),
    max_wait_s: float = 0.3,
    rounds_per_run: int = 1000,
    cluster: str | None = None,
    jobs_queue: str | None = None,
) -> AsyncIterator[WorkflowHandle[ClusterWatchWorkflow, None]]:
    """A worker with ClusterWatch and its activities, and a running ClusterWatch (a fresh cluster by default).

    The yielded handle has no run id, so its queries reach the latest run across continue-as-new.
    """
    acts = DiscoveryActivities(
        SnapshotCache(sched, max_age_s=POLL_S),
        selectors,
        client,
        task_queue=jobs_queue or task_queue,
        poll_interval_s=POLL_S,
        start=start,  # None: the real Temporal starter
    )
    cluster = cluster or f"t-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[ClusterWatchWorkflow],
        activities=[acts.discover_jobs, acts.start_job_recovery],
    ):
        handle = await client.start_workflow(
            ClusterWatchWorkflow.run,
            ClusterWatchInput(cluster=cluster, max_wait_s=max_wait_s, rounds_per_run=rounds_per_run),
            id=cluster_watch_workflow_id(cluster),
            task_queue=task_queue,
        )
        try:
            yield handle
        finally:
            await handle.terminate("test over")


async def _until(
    handle: WorkflowHandle[ClusterWatchWorkflow, None],
    ok: Callable[[ClusterWatchStatus], bool],
    timeout_s: float = 15,
) -> ClusterWatchStatus:
    """Poll the ``status`` query (of the latest run) until ``ok``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        st = await handle.query(ClusterWatchWorkflow.status)
        if ok(st):
            return st
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s; last status {st}")
        await asyncio.sleep(0.05)


async def test_opted_in_job_is_started_once_across_rounds_and_continue_as_new(
    temporal_client: Client, task_queue: str
) -> None:
    sched, rec = FakeScheduler(), _Recorder()
    plain = _submit(sched, "just a note")
    opted = _submit(sched, "team=nlp; rebound: budget=2;ckpt=/ckpt/llm")
    async with _cluster_watch(temporal_client, task_queue, sched, rec, rounds_per_run=1) as handle:
        st = await _until(handle, lambda s: s.known == (opted.job_id,))
        st = await _until(handle, lambda s: s.runs >= 3)  # one round per run: state crossed two continue-as-new
    assert rec.job_ids() == [opted.job_id]
    assert rec.calls[0] == StartJobRecoveryInput(
        cluster=st.cluster, job_id=opted.job_id, spec=RecoverySpec(restart_budget=2, checkpoint_dir="/ckpt/llm")
    )
    assert st.known == (opted.job_id,) and plain.job_id not in st.known
    assert st.started == 1
    assert st.discoveries >= 2 and st.last_discovery_at is not None  # the last run may not have finished a round
    assert st.errors == ()


async def test_a_round_starts_at_most_its_cap_and_the_next_round_the_rest(
    temporal_client: Client, task_queue: str
) -> None:
    """501 opted-in jobs at once: 500 are started in the first round, the last one in the next (after a look at
    the history's size), so one round never adds thousands of events."""
    sched, rec = FakeScheduler(nodes=[f"n{i}" for i in range(MAX_STARTS_PER_ROUND + 1)]), _Recorder()
    jobs = [_submit(sched, "rebound: budget=1") for _ in range(MAX_STARTS_PER_ROUND + 1)]
    async with _cluster_watch(temporal_client, task_queue, sched, rec) as handle:
        st = await _until(handle, lambda s: len(s.known) == len(jobs), timeout_s=120)
    assert st.discoveries >= 2 and st.started == len(jobs)
    assert sorted(rec.job_ids()) == sorted(j.job_id for j in jobs)


async def test_jobs_without_opt_in_are_never_started(temporal_client: Client, task_queue: str) -> None:
    sched, rec = FakeScheduler(), _Recorder()
    _submit(sched, "")
    _submit(sched, "tested the rebound fix")
    _submit(sched, "", name="other")
    llm_only = [JobSelector(name_regex="llm-.*")]
    async with _cluster_watch(temporal_client, task_queue, sched, rec, selectors=llm_only) as handle:
        st = await _until(handle, lambda s: s.discoveries >= 3)
    assert rec.calls == []
    assert st.known == () and st.rejected == ()


async def test_selector_opts_jobs_in_and_the_comment_wins_key_by_key(temporal_client: Client, task_queue: str) -> None:
    sched, rec = FakeScheduler(), _Recorder()
    selector = JobSelector(name_regex="llm-.*", spec=RecoverySpec(checkpoint_dir="/sel", restart_budget=1))
    selected = _submit(sched, "", name="llm-7b")
    both = _submit(sched, "rebound: budget=4", name="llm-70b")
    _submit(sched, "", name="vision")
    async with _cluster_watch(temporal_client, task_queue, sched, rec, selectors=[selector]) as handle:
        await _until(handle, lambda s: len(s.known) == 2)
    specs = {c.job_id: c.spec for c in rec.calls}
    assert specs == {
        selected.job_id: RecoverySpec(checkpoint_dir="/sel", restart_budget=1),
        # The selector's budget is a ceiling for the comment too (workflows.policy.optin_caps), and says so.
        both.job_id: RecoverySpec(
            checkpoint_dir="/sel",
            restart_budget=1,
            capped=("budget=4 capped at 1 by operator policy (the job's selector)",),
        ),
    }


async def test_malformed_comment_is_skipped_with_one_warning(
    temporal_client: Client, task_queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    sched, rec = FakeScheduler(), _Recorder()
    bad = _submit(sched, "rebound: budget=lots")
    async with _cluster_watch(temporal_client, task_queue, sched, rec) as handle:
        st = await _until(handle, lambda s: s.discoveries >= 3 and bool(s.rejected))
        assert rec.calls == []
        assert st.rejected[0].job_id == bad.job_id and "budget" in st.rejected[0].reason
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and f"job {bad.job_id} " in r.message]
        assert len(warnings) == 1, [r.message for r in warnings]  # once per job, not once per poll
        assert "budget" in warnings[0].message

        # The owner fixes the comment (scontrol update comment=...): the job is picked up.
        sched.jobs[bad.job_id] = sched.jobs[bad.job_id].model_copy(update={"comment": "rebound: budget=3"})
        st = await _until(handle, lambda s: s.known == (bad.job_id,))
    assert st.rejected == ()
    assert rec.calls[0].spec == RecoverySpec(restart_budget=3)


async def test_jobs_that_end_or_vanish_are_pruned(temporal_client: Client, task_queue: str) -> None:
    sched, rec = FakeScheduler(), _Recorder()
    ends = _submit(sched, "rebound")
    vanishes = _submit(sched, "rebound")
    requeued = _submit(sched, "rebound")
    async with _cluster_watch(temporal_client, task_queue, sched, rec, max_wait_s=30) as handle:
        await _until(handle, lambda s: len(s.known) == 3)
        sched.finish_job(ends.job_id)
        sched.forget_job(vanishes.job_id)
        sched.requeue_by_slurm(requeued.job_id)  # still active (PENDING again): stays known
        # Discovery returns on the change itself, long before its 30 s max wait.
        st = await _until(handle, lambda s: s.known == (requeued.job_id,), timeout_s=10)
    assert sorted(rec.job_ids()) == [ends.job_id, vanishes.job_id, requeued.job_id]  # pruning starts nothing
    assert st.started == 3


async def test_failed_start_is_reported_and_retried(temporal_client: Client, task_queue: str) -> None:
    sched, rec = FakeScheduler(), _Recorder(fail_first=1)
    job = _submit(sched, "rebound")
    async with _cluster_watch(temporal_client, task_queue, sched, rec) as handle:
        st = await _until(handle, lambda s: s.known == (job.job_id,))
    assert rec.job_ids() == [job.job_id, job.job_id]
    assert len(st.errors) == 1
    assert st.errors[0].job_id == job.job_id and st.errors[0].kind == "CONFIGURATION"
    assert "refused" in st.errors[0].message
    assert st.started == 1
    # The history (failed start included) replays against the current code: the workflow is deterministic.
    replayer = Replayer(workflows=[ClusterWatchWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(await handle.fetch_history())


async def test_discovery_rides_out_a_scheduler_outage(temporal_client: Client, task_queue: str) -> None:
    sched, rec = FakeScheduler(), _Recorder()
    sched.unreachable = True
    job = _submit(sched, "rebound")
    async with _cluster_watch(temporal_client, task_queue, sched, rec) as handle:
        await asyncio.sleep(0.5)
        sched.unreachable = False  # Temporal retried the discovery activity meanwhile
        st = await _until(handle, lambda s: s.known == (job.job_id,))
    assert st.errors == ()


# ----- the real starter: business-key id + USE_EXISTING ------------------------------------------------------


@workflow.defn(name=JOB_RECOVERY_WORKFLOW)
class _StubJobRecovery:
    """Stands in for JobRecovery: runs until terminated."""

    @workflow.run
    async def run(self, inp: JobRecoveryInput) -> None:
        await workflow.wait_condition(lambda: False)


def _stub_worker(client: Client, task_queue: str) -> Worker:
    # Unsandboxed: the stub lives in a test module the sandbox would have to re-import.
    return Worker(
        client, task_queue=task_queue, workflows=[_StubJobRecovery], workflow_runner=UnsandboxedWorkflowRunner()
    )


async def test_real_starter_starts_each_job_once(temporal_client: Client, task_queue: str) -> None:
    cluster = f"t-{uuid.uuid4().hex[:8]}"
    starter = TemporalJobRecoveryStarter(temporal_client, task_queue=task_queue, poll_interval_s=0.5)
    inp = StartJobRecoveryInput(cluster=cluster, job_id=42, spec=RecoverySpec(restart_budget=2))
    async with _stub_worker(temporal_client, task_queue):
        first = await starter(inp)
        second = await starter(inp)  # a second start (another worker, a retry, a rediscovery) is a no-op
        handle = temporal_client.get_workflow_handle(first.workflow_id)
        try:
            assert first.workflow_id == job_workflow_id(cluster, 42) == second.workflow_id
            assert first.run_id is not None and first.run_id == second.run_id
            desc = await handle.describe()
            assert desc.workflow_type == "JobRecovery"
            assert desc.typed_search_attributes.get(JOB_ID) == "42"
            assert desc.typed_search_attributes.get(CLUSTER) == cluster
            history = await handle.fetch_history()
            started = history.events[0].workflow_execution_started_event_attributes
            [args] = await temporal_client.data_converter.decode(started.input.payloads, [JobRecoveryInput])
            # The operator's checkpoint fallback (default off) is filled in for a spec that does not choose one.
            spec = RecoverySpec(restart_budget=2, checkpoint_fallback=CheckpointFallback.OFF)
            assert args == JobRecoveryInput(cluster=cluster, job_id=42, poll_interval_s=0.5, spec=spec)
        finally:
            await handle.terminate("test over")


async def test_rediscovery_by_a_fresh_cluster_watch_starts_nothing_new(
    temporal_client: Client, task_queue: str
) -> None:
    """A ClusterWatch that lost its state (terminated, started afresh) discovers the job again: still one run."""
    sched = FakeScheduler()
    job = _submit(sched, "rebound: budget=2")
    cluster, jobs_queue = f"t-{uuid.uuid4().hex[:8]}", f"{task_queue}-jobs"
    job_handle = temporal_client.get_workflow_handle(job_workflow_id(cluster, job.job_id))
    run_ids = []
    async with _stub_worker(temporal_client, jobs_queue):
        try:
            for _ in range(2):
                async with _cluster_watch(
                    temporal_client, task_queue, sched, cluster=cluster, jobs_queue=jobs_queue
                ) as handle:
                    st = await _until(handle, lambda s: s.known == (job.job_id,))
                    assert st.runs == 1 and st.started == 1  # a fresh watch, with nothing carried over
                run_ids.append((await job_handle.describe()).run_id)
        finally:
            await job_handle.terminate("test over")
    assert run_ids[0] == run_ids[1]
