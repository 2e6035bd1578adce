"""Node agent side of GPU fault detection: push every new GPU event to the workflows of the jobs on this node.

Monitors publish, workflows act: the agent only reports (a signal per affected job); the job's workflow decides.
Pushing, rather than having every workflow poll every node, is what makes detection take a fraction of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from activities.gpu.port import GpuSource
from activities.slurm.port import SchedulerReads
from activities.slurm.submission import token_in
from activities.temporal.rebound_workflows import lineage_workflow_id, report_gpu_fault
from workflows.constants import GPU_FAULT_REPORTED_SIGNAL
from workflows.domain.errors import ReboundError
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.slurm import JobState, SlurmJob

log = logging.getLogger("rebound.node_agent.gpu_push")

#: Events the source delivers this soon after the agent started may be replays of old faults (the lab's fake
#: NVML replays its event log to every new event set): they stay evidence for attribution, not push triggers.
STARTUP_GRACE = timedelta(seconds=2)


def affected_jobs(jobs: tuple[SlurmJob, ...], node: str, event: GpuEvent) -> list[SlurmJob]:
    """Running jobs on ``node`` that were already running when the event happened."""
    at = event.observed_at
    return [
        j
        for j in jobs
        if j.state is JobState.RUNNING
        and node in j.nodes
        and (j.start_time is None or at is None or at >= j.start_time)
    ]


async def push_gpu_events(
    source: GpuSource,
    scheduler: SchedulerReads,
    client: Client,
    cluster: str,
    node: str,
    stop: asyncio.Event,
    poll_s: float = 0.1,
) -> None:
    """Forward new events until ``stop`` is set. Never raises: a failed push is logged and the loop goes on."""
    started = datetime.now(UTC)
    cursor = 0
    while not stop.is_set():
        batch = source.events_after(cursor)
        cursor = batch.next_cursor
        for event in batch.events:
            if event.kind is GpuEventKind.SOURCE_DOWN:
                continue
            if event.observed_at is not None and event.observed_at < started + STARTUP_GRACE:
                log.info("not pushing %s seen at start-up (possibly a replay)", event.kind.value)
                continue
            await _push(event, scheduler, client, cluster, node)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=poll_s)


async def _push_to_lineage(event: GpuEvent, job: SlurmJob, client: Client, cluster: str) -> None:
    token = token_in(job.comment)
    if token is None:
        return  # the job is not monitored by Rebound; nothing to tell
    try:
        owner = await lineage_workflow_id(client, cluster, job.job_id, token, timeout_s=10.0)
        if owner is not None:
            await client.get_workflow_handle(owner).signal(GPU_FAULT_REPORTED_SIGNAL, event)
            log.warning("reported %s to job %s through its lineage %s", event.kind.value, job.job_id, owner)
    except (RPCError, TimeoutError, WorkflowQueryFailedError) as e:
        log.warning("signal to the lineage of job %s failed: %s", job.job_id, e)


async def _push(event: GpuEvent, scheduler: SchedulerReads, client: Client, cluster: str, node: str) -> None:
    try:
        jobs = affected_jobs(await scheduler.list_jobs(), node, event)
    except ReboundError as e:
        log.warning("cannot list jobs to report %s on %s: %s", event.kind.value, node, e)
        return
    for job in jobs:
        try:
            await report_gpu_fault(client, cluster, job.job_id, event)
            log.warning("reported %s (gpu %s xid %s) to job %s", event.kind.value, event.index, event.xid, job.job_id)
        except RPCError as e:
            if e.status is not RPCStatusCode.NOT_FOUND:
                log.warning("signal to job %s failed: %s", job.job_id, e)
            else:  # not monitored under its own id: perhaps a resubmission its lineage's JobRecovery follows
                await _push_to_lineage(event, job, client, cluster)
