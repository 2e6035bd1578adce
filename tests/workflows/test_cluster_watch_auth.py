"""ClusterWatch when the scheduler refuses Rebound's credentials: recorded in its status, notified once per outage,
never retried in a tight loop, and nothing discovered meanwhile (a refused read is never read as "no jobs")."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

import workflows.cluster_watch as cluster_watch
from activities.slurm.snapshots import SnapshotCache
from activities.temporal.discovery import DiscoveryActivities
from tests.fakes.scheduler import FakeScheduler
from workflows.cluster_watch import ClusterWatchWorkflow
from workflows.constants import cluster_watch_workflow_id, job_workflow_id
from workflows.domain.discovery import (
    ClusterWatchInput,
    ClusterWatchStatus,
    StartJobRecoveryInput,
    StartJobRecoveryResult,
)
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.notify import Notification, NotificationKind, NotifyResult, NotifyStatus, Severity

POLL_S = 0.05
_REFUSED = ReboundError(
    FailureKind.SCHEDULER_AUTH, "GET /slurm/v0.0.38/jobs: slurmrestd refused the JWT. Fix slurm.rest_token_file."
)


async def test_refused_credentials_are_reported_and_notified_once_per_outage(
    temporal_client: Client, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_watch, "DISCOVERY_BACKOFF", timedelta(seconds=0.2))
    sched = FakeScheduler()
    job = sched.submit(1, name="train")
    sched.jobs[job.job_id] = job.model_copy(update={"comment": "rebound"})
    sched.fail_next("snapshot", _REFUSED, times=3)
    sent: list[Notification] = []
    started: list[int] = []

    @activity.defn(name="notify_webhook")
    async def notify_webhook(n: Notification) -> NotifyResult:
        sent.append(n)
        return NotifyResult(status=NotifyStatus.SENT)

    async def start(inp: StartJobRecoveryInput) -> StartJobRecoveryResult:
        started.append(inp.job_id)
        return StartJobRecoveryResult(workflow_id=job_workflow_id(inp.cluster, inp.job_id), run_id="fake")

    acts = DiscoveryActivities(
        SnapshotCache(sched, max_age_s=POLL_S), (), temporal_client, task_queue=task_queue,
        poll_interval_s=POLL_S, start=start,
    )  # fmt: skip
    cluster = f"t-{uuid.uuid4().hex[:8]}"
    async with Worker(
        temporal_client,
        task_queue=task_queue,
        workflows=[ClusterWatchWorkflow],
        activities=[acts.discover_jobs, acts.start_job_recovery, notify_webhook],
        workflow_runner=UnsandboxedWorkflowRunner(),  # the shortened backoff is this module's attribute
    ):
        handle = await temporal_client.start_workflow(
            ClusterWatchWorkflow.run,
            ClusterWatchInput(cluster=cluster, max_wait_s=0.3, rounds_per_run=1000),
            id=cluster_watch_workflow_id(cluster),
            task_queue=task_queue,
        )
        try:
            st = await _until(handle, lambda s: s.known == (job.job_id,))
            # Three refused discoveries, one notification; each refusal recorded with its kind and what to fix.
            assert [e.kind for e in st.errors] == ["SCHEDULER_AUTH"] * 3
            assert "slurm.rest_token_file" in st.errors[0].message
            assert started == [job.job_id]  # only once the scheduler could be read
            assert len(sent) == 1
            assert sent[0].kind is NotificationKind.SCHEDULER_AUTH and sent[0].severity is Severity.CRITICAL
            assert sent[0].cluster == cluster and "slurm.rest_token_file" in sent[0].text
            # A second outage after reads worked again is a new alert.
            sched.fail_next("snapshot", _REFUSED, times=2)
            sched.finish_job(job.job_id)  # makes discovery return (a known job ended) and look again
            await _until(handle, lambda s: len(s.errors) >= 5)
            await _until(handle, lambda s: s.known == (), timeout_s=15)
            assert len(sent) == 2
            history = await handle.fetch_history()
        finally:
            await handle.terminate("test over")
    replayer = Replayer(
        workflows=[ClusterWatchWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    await replayer.replay_workflow(history)


async def _until(handle: object, ok: object, timeout_s: float = 15) -> ClusterWatchStatus:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        st = await handle.query(ClusterWatchWorkflow.status)  # type: ignore[attr-defined]  # a WorkflowHandle
        if ok(st):  # type: ignore[operator]  # a predicate
            return st  # type: ignore[no-any-return]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s; last status {st}")
        await asyncio.sleep(0.05)
