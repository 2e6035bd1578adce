"""Node agent side of GPU fault detection: push every new GPU event to the workflows of the jobs on this node.

Monitors publish, workflows act: the agent only reports (a signal per affected job); the job's workflow decides.
A fault NVIDIA's catalogue puts on the node (reset the GPU, drain) that no monitored job's workflow hears of goes to
the cluster's Fleet, which drains the node when it already holds a suspicion (a rank that died there earlier with no
hardware evidence; ADR 008).
Pushing, rather than having every workflow poll every node, is what makes detection take a fraction of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime, timedelta

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from activities.gpu.port import GpuSource
from activities.gpu.xid_catalog import default_xid_catalog
from activities.slurm.port import SchedulerReads
from activities.slurm.submission import token_in
from activities.temporal.rebound_workflows import lineage_workflow_id, report_gpu_fault, report_node_gpu_fault
from workflows.constants import GPU_FAULT_REPORTED_SIGNAL
from workflows.domain.errors import ReboundError
from workflows.domain.fleet import NodeGpuFault
from workflows.domain.gpu import GpuEvent, GpuEventKind, XidCatalog
from workflows.domain.slurm import JobState, SlurmJob
from workflows.policy.fleet.late_fault import NODE_LEVEL_ACTIONS
from workflows.policy.gpu_event_rules import event_findings, is_gpu_fault
from workflows.policy.node_events import is_actionable
from workflows.policy.xid_copies import LINE_WAIT, awaits_line, told_better

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
    *,
    kernel_log_followed: bool = False,
) -> None:
    """Forward new events until ``stop`` is set. Never raises: a failed push is logged and the loop goes on.

    With ``kernel_log_followed``, an NVLink5 XID from NVML (no Fatal/Nonfatal label) is held up to ``LINE_WAIT``
    for the driver's labelled line, which the kernel-log follower adds to the same stream: when that copy is there
    the NVML one is dropped and the line's copy is judged (a Nonfatal link notice interrupts nothing); when not, the
    NVML event is judged by the catalogue (``workflows/policy/xid_copies.py``)."""
    started = datetime.now(UTC)
    cursor = 0
    held: list[tuple[GpuEvent, float]] = []  # (event, monotonic deadline)
    while not stop.is_set():
        batch = source.events_after(cursor)
        cursor = batch.next_cursor
        due: list[GpuEvent] = []
        for event in batch.events:
            if awaits_line(event, kernel_log_followed=kernel_log_followed):
                held.append((event, time.monotonic() + LINE_WAIT.total_seconds()))
            else:
                due.append(event)
        if held:
            known = source.events_after(0).events
            now = time.monotonic()
            for event, deadline in held:
                if told_better(event, known):
                    log.info("not pushing NVML's XID %s on GPU %s: its kernel line is judged", event.xid, event.index)
                elif deadline <= now:
                    log.info(
                        "XID %s on GPU %s: no labelled line in %s; judged by the catalogue",
                        event.xid,
                        event.index,
                        LINE_WAIT,
                    )
                    due.append(event)
            held = [(e, d) for e, d in held if d > now and not told_better(e, known)]
        for event in due:
            if _should_push(event, started):
                await _push(event, scheduler, client, cluster, node)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=poll_s)


def _should_push(event: GpuEvent, started: datetime) -> bool:
    if event.kind is GpuEventKind.SOURCE_DOWN:
        return False
    if not is_actionable(event):
        # A kernel-log event that only asks to be watched (a hung task, a corrected AER): evidence in the agent's
        # reads, no reason to interrupt a job (workflows/policy/node_events.py).
        log.info("not pushing %s (%s): informational", event.node_event, event.severity)
        return False
    if not worth_pushing(event):
        return False
    if event.observed_at is not None and event.observed_at < started + STARTUP_GRACE:
        log.info("not pushing %s seen at start-up (possibly a replay)", event.kind.value)
        return False
    return True


def worth_pushing(event: GpuEvent) -> bool:
    """Whether the event is a fault at all (``is_gpu_fault``): an informational XID, an NVLink5 XID the driver labels
    Nonfatal or XID 154 back to None stays evidence in the agent's reads but interrupts no job. The catalogue
    unreadable: pushed, the job's recovery judges it."""
    try:
        fault = is_gpu_fault(event, default_xid_catalog())
    except ReboundError as e:
        log.warning("cannot read the XID catalogue to judge %s: %s; pushing it", event.kind.value, e)
        return event.kind is not GpuEventKind.SOURCE_DOWN
    if not fault:
        log.info("not pushing %s (xid %s): the evidence asks for no action", event.kind.value, event.xid)
    return fault


def node_level_fault(event: GpuEvent, node: str, catalog: XidCatalog) -> NodeGpuFault | None:
    """The event as the node's fault (the catalogue says reset the GPU or drain), or None (the job's to handle)."""
    findings = event_findings(event, catalog, pinned=event.index is not None)
    if not findings:
        return None
    worst = max(findings, key=lambda f: f.action.rank)
    if worst.action not in NODE_LEVEL_ACTIONS:
        return None
    return NodeGpuFault(node=node, event=event, action=worst.action, finding=worst.reason)


async def _push_to_lineage(event: GpuEvent, job: SlurmJob, client: Client, cluster: str) -> bool:
    """Tell the JobRecovery that follows ``job`` as a resubmission; True when one was told."""
    token = token_in(job.comment)
    if token is None:
        return False  # the job is not monitored by Rebound; nothing to tell
    try:
        owner = await lineage_workflow_id(client, cluster, job.job_id, token, timeout_s=10.0)
        if owner is not None:
            await client.get_workflow_handle(owner).signal(GPU_FAULT_REPORTED_SIGNAL, event)
            log.warning("reported %s to job %s through its lineage %s", event.kind.value, job.job_id, owner)
            return True
    except (RPCError, TimeoutError, WorkflowQueryFailedError) as e:
        log.warning("signal to the lineage of job %s failed: %s", job.job_id, e)
    return False


async def _push_to_jobs(event: GpuEvent, scheduler: SchedulerReads, client: Client, cluster: str, node: str) -> int:
    """Tell the JobRecovery of every monitored job running on ``node``; how many were told (-1: the jobs could
    not be listed)."""
    try:
        jobs = affected_jobs(await scheduler.list_jobs(), node, event)
    except ReboundError as e:
        log.warning("cannot list jobs to report %s on %s: %s", event.kind.value, node, e)
        return -1
    told = 0
    for job in jobs:
        try:
            await report_gpu_fault(client, cluster, job.job_id, event)
            log.warning("reported %s (gpu %s xid %s) to job %s", event.kind.value, event.index, event.xid, job.job_id)
            told += 1
        except RPCError as e:
            if e.status is not RPCStatusCode.NOT_FOUND:
                log.warning("signal to job %s failed: %s", job.job_id, e)
            elif await _push_to_lineage(event, job, client, cluster):
                told += 1  # not monitored under its own id, but a resubmission its lineage's JobRecovery follows
    return told


async def _push(event: GpuEvent, scheduler: SchedulerReads, client: Client, cluster: str, node: str) -> None:
    """The jobs first; the Fleet only when no job's recovery heard of it. A job that hears of a node-level fault
    asks the Fleet to drain with its own incident (the drain is then that incident's action, breaker and approvals
    included); the Fleet's own escalation of a suspected node is for a node no monitored job runs on any more."""
    told = await _push_to_jobs(event, scheduler, client, cluster, node)
    if told > 0:
        return
    try:
        fault = node_level_fault(event, node, default_xid_catalog())
    except ReboundError as e:
        log.warning("cannot read the XID catalogue to judge %s on %s: %s", event.kind.value, node, e)
        return
    if fault is None:
        return
    try:
        await report_node_gpu_fault(client, cluster, fault)
    except RPCError as e:  # NOT_FOUND: no Fleet runs (nothing suspected); anything else is logged
        if e.status is not RPCStatusCode.NOT_FOUND:
            log.warning("signal to the Fleet failed: %s", e)
