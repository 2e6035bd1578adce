"""The watch hub's harness for workflow tests (ADR 015), shared by the hub's and the scheduler feed's tests: the
real WatchShard workflows and shard activities on a dev server, with their own watch, shard and resume queues."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from activities.logs.job_logs import LogPolicy
from activities.logs.watch_shard import WatchShardActivities
from activities.temporal import rebound_workflows
from tests.workflows.test_job_recovery import Handle, Harness
from workers.watch_hub import build_watch_shards
from workflows.domain.recovery import JobRecoveryInput, RecoverySpec
from workflows.domain.watch_hub import WatchShardInput
from workflows.domain.watch_routing import WatchRouting, shard_of
from workflows.job_recovery import JobRecoveryWorkflow
from workflows.watch_shard import WatchShardWorkflow

__all__ = ["SHARDS", "HubHarness", "eventually"]

SHARDS = 2


class HubHarness(Harness):
    """The harness with the hub: WatchShard workflows on the test's queue, their activities on a watch queue,
    resume checks on a resume queue, each with its own slots."""

    def __init__(
        self, client: Client, task_queue: str, tmp: Path, *, acting_slots: int = 100, lease_s: float = 10
    ) -> None:
        super().__init__(client, task_queue, tmp)
        tag = uuid.uuid4().hex[:8]
        self.routing = WatchRouting(
            shards=SHARDS,
            shard_queue_prefix=f"hub-{tag}-shard-",
            lease_s=lease_s,
            resume_task_queue=f"hub-{tag}-resume",
        )
        self.watch_queue = f"hub-{tag}-watch"
        self.acting_slots = acting_slots
        self.shards: WatchShardActivities = build_watch_shards(client, self.snapshots, LogPolicy())
        self.heartbeat_timeout_s = 30.0
        self.watch_worker: Worker | None = None

    def shard_input(self, shard: int) -> WatchShardInput:
        """Watch shard ``shard``'s input: its hub polls every 0.1 s on the watch queue."""
        return WatchShardInput(
            cluster=self.cluster,
            shard=shard,
            shards=SHARDS,
            watch_task_queue=self.watch_queue,
            shard_queue_prefix=self.routing.shard_queue_prefix,
            poll_interval_s=0.1,
            lease_s=self.routing.lease_s,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
        )

    @contextlib.asynccontextmanager
    async def serving(self, *watchers: Worker) -> AsyncIterator[list[WorkflowHandle[Any, Any]]]:
        """The workflows' worker (``worker()``), the resume queue's and ``watchers`` running, every shard's
        WatchShard started. Yields the started workflows: they, and any the caller adds, are terminated at the end.
        """
        watch = self.watch_activities()
        resume = Worker(self.client, task_queue=self.routing.resume_task_queue, activities=[watch.wait_resume])
        async with contextlib.AsyncExitStack() as stack:
            for w in (self.worker(), resume, *watchers):
                await stack.enter_async_context(w)
            started = [
                await rebound_workflows.start_watch_shard(self.client, self.shard_input(k), task_queue=self.task_queue)
                for k in range(SHARDS)
            ]
            try:
                yield started
            finally:
                for handle in started:
                    await handle.terminate("test over")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[HubHarness]:
        """``serving`` with one watch worker running every shard's hub (``watch_worker``)."""
        self.watch_worker = Worker(self.client, task_queue=self.watch_queue, activities=[self.shards.watch_shard])
        async with self.serving(self.watch_worker):
            yield self

    def worker(self, **options: Any) -> Worker:
        # The acting queue's slots, explicit: watching must not need any of them.
        return super().worker(workflows=[WatchShardWorkflow], max_concurrent_activities=self.acting_slots, **options)

    async def start(self, job_id: int, budget: int = 5, restart: Any = None) -> Handle:
        spec = RecoverySpec(logs=(str(self.tmp / "job-%j-*.log"),), restart_budget=budget)
        return await self.client.start_workflow(
            JobRecoveryWorkflow.run,
            JobRecoveryInput(
                cluster=self.cluster, job_id=job_id, poll_interval_s=0.1, spec=spec, watch_hub=self.routing
            ),
            id=f"rebound/test/job/{job_id}/{uuid.uuid4().hex}",
            task_queue=self.task_queue,
        )

    def members(self, job_id: int) -> int:
        hub = self.shards.hubs.get(shard_of(job_id, SHARDS))
        return 0 if hub is None else sum(m.sub.watch.job_id == job_id for m in hub.members.values())


async def eventually(pred: Callable[[], bool], timeout: float = 15) -> None:
    """Wait until ``pred()`` holds (checked every 0.1 s); fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not met"
        await asyncio.sleep(0.1)
