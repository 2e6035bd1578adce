"""What a scale run reads back from Temporal, through its public API only (so it reads the same whatever watches
the jobs): JobRecovery counts, each job's incidents (its ``status`` query), the history events of a time window,
and the activities that wait for a worker slot; and, from the workers' own Prometheus pages, how many jobs their
shard hubs hold."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import sys
import time
from collections import Counter
from datetime import UTC, datetime

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client
from temporalio.service import RPCError

from activities.temporal.rebound_workflows import query_job_status
from deploy.scale.measure import scrape
from deploy.scale.stack import CLUSTER, Stack
from workflows.constants import JOB_RECOVERY_WORKFLOW, job_workflow_id
from workflows.domain.incident import Incident
from workflows.domain.recovery import JobRecoveryStatus

__all__ = [
    "history_events",
    "hub_members",
    "incidents",
    "statuses",
    "wait_hub_members",
    "wait_steady",
    "wait_watched",
    "waiting_activities",
]

_MEMBERS = re.compile(r"^rebound_watch_shard_members\{[^}]*\}\s+([0-9.eE+-]+)$", re.MULTILINE)


def hub_members(metrics_urls: list[str]) -> int:
    """Jobs the workers' shard hubs poll now: the sum of their per-shard gauges (``rebound_watch_shard_members``;
    0 for a worker that runs no shard); -1 when a worker did not answer (too busy now: ask again)."""
    total = 0
    for url in metrics_urls:
        try:
            page = scrape(url, timeout_s=10.0, attempts=1)
        except OSError:
            return -1
        total += sum(int(float(v)) for v in _MEMBERS.findall(page))
    return total


async def wait_hub_members(stack: Stack, want: int, timeout_s: float) -> int:
    """Wait until the live workers' hubs hold ``want`` jobs, or ``timeout_s``; returns the last count."""
    deadline = time.monotonic() + timeout_s
    members = -1
    while time.monotonic() < deadline:
        stack.check_alive()
        members = await asyncio.to_thread(hub_members, list(stack.worker_metrics.values()))
        if members == want:
            return members
        await asyncio.sleep(1.0)
    return members


#: The worker keeps up when a sample of jobs all answer their ``status`` query within this long (a query is a
#: workflow task of its own: it waits behind every task the worker has not taken yet).
STEADY_QUERY_S = 2.0
_STEADY_SAMPLE = 24
_STEADY_ROUNDS = 2


async def wait_steady(client: Client, job_ids: list[int], stack: Stack, timeout_s: float) -> tuple[float, float]:
    """Wait until the worker has worked off the start-up's backlog, or ``timeout_s``: ``_STEADY_ROUNDS`` rounds in
    a row in which a random sample of jobs all answer their ``status`` query within ``STEADY_QUERY_S``. Returns
    the seconds waited and the slowest answer of the last round (a query not answered in 10 s counts as 10 s).

    Without it the window would open while 1,000 jobs' first workflow tasks still queue (stop 18: 533 waiting),
    and the faults of its first minutes would measure the start-up, not the steady state the issue asks about;
    how long the start-up takes is reported beside it."""
    started = time.monotonic()
    steady_rounds = 0
    slowest = float("inf")
    rng = random.Random(7)
    while time.monotonic() - started < timeout_s:
        stack.check_alive()
        sample = rng.sample(job_ids, min(_STEADY_SAMPLE, len(job_ids)))
        slowest = max(await asyncio.gather(*(_query_seconds(client, j) for j in sample)))
        steady_rounds = steady_rounds + 1 if slowest <= STEADY_QUERY_S else 0
        if steady_rounds >= _STEADY_ROUNDS:
            break
        await asyncio.sleep(2.0)
    return time.monotonic() - started, slowest


async def _query_seconds(client: Client, job_id: int, limit_s: float = 10.0) -> float:
    t0 = time.monotonic()
    try:
        await query_job_status(client, job_workflow_id(CLUSTER, job_id), timeout_s=limit_s)
    except Exception:  # noqa: BLE001 - unanswered (busy worker, query timeout): as slow as the limit
        return limit_s
    return time.monotonic() - t0


#: An activity scheduled this long ago and not started (nor waiting out a retry backoff) waits for a slot.
WAITING_AFTER_S = 10.0


async def wait_watched(client: Client, jobs: int, stack: Stack, timeout_s: float) -> int:
    """Wait until ``jobs`` JobRecovery workflows run, or ``timeout_s``; returns how many run (fewer at a timeout:
    the run goes on and says so, since how many jobs the code under test takes on in time is itself a result)."""
    query = f"WorkflowType='{JOB_RECOVERY_WORKFLOW}' AND ExecutionStatus='Running'"
    deadline = time.monotonic() + timeout_s
    count = 0
    while True:
        stack.check_alive()
        with contextlib.suppress(RPCError):  # a server busy starting the jobs' workflows answers late: ask again
            count = (await client.count_workflows(query)).count
        if count >= jobs or time.monotonic() > deadline:
            return count
        await asyncio.sleep(2.0)


async def incidents(
    client: Client, job_ids: list[int], *, attempts: int = 1, timeout_s: float = 30.0
) -> dict[int, tuple[Incident, ...]]:
    """Each job's incidents (``statuses``)."""
    found = await statuses(client, job_ids, attempts=attempts, timeout_s=timeout_s)
    return {job_id: status.incidents for job_id, status in found.items()}


async def statuses(
    client: Client, job_ids: list[int], *, attempts: int = 1, timeout_s: float = 30.0
) -> dict[int, JobRecoveryStatus]:
    """Each job's JobRecovery ``status`` query; a job whose query fails every attempt (a worker too busy to
    answer) is left out and named on stderr."""
    out: dict[int, JobRecoveryStatus] = {}
    sem = asyncio.Semaphore(16)

    async def one(job_id: int) -> None:
        async with sem:
            try:
                out[job_id] = await query_job_status(client, job_workflow_id(CLUSTER, job_id), timeout_s=timeout_s)
            except Exception as e:  # noqa: BLE001 - a job we cannot read now is asked again, then reported
                if attempts <= 1:
                    print(f"  job {job_id}: status query failed: {type(e).__name__} {e}", file=sys.stderr)

    missing = list(job_ids)
    for _ in range(attempts):
        await asyncio.gather(*(one(j) for j in missing))
        missing = [j for j in missing if j not in out]
        if not missing:
            break
    return out


async def history_events(client: Client, since: datetime, until: datetime) -> int:
    """Events of every workflow execution of the run that fall in the window (all of Rebound's workflows)."""
    sem = asyncio.Semaphore(16)
    counts: list[int] = []

    async def one(workflow_id: str, run_id: str) -> None:
        async with sem:
            n = 0
            async for event in client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events():
                t = event.event_time.ToDatetime(tzinfo=UTC)
                n += since <= t <= until
            counts.append(n)

    tasks = [one(wf.id, wf.run_id) async for wf in client.list_workflows()]
    await asyncio.gather(*tasks)
    return sum(counts)


async def waiting_activities(client: Client, job_ids: list[int]) -> Counter[str]:
    """Activities of the jobs' workflows scheduled more than ``WAITING_AFTER_S`` ago and still not started (not
    counting a retry's backoff), by activity type: work that waits for a free worker slot."""
    waiting: Counter[str] = Counter()
    sem = asyncio.Semaphore(16)
    now = datetime.now(UTC)

    async def one(job_id: int) -> None:
        async with sem:
            try:
                desc = await client.get_workflow_handle(job_workflow_id(CLUSTER, job_id)).describe()
            except Exception:  # noqa: BLE001 - a job we cannot describe is not counted
                return
            for pa in desc.raw_description.pending_activities:
                if pa.state != PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED:
                    continue
                since = pa.next_attempt_schedule_time if pa.HasField("next_attempt_schedule_time") else None
                since = since or pa.scheduled_time
                if (now - since.ToDatetime(tzinfo=UTC)).total_seconds() > WAITING_AFTER_S:
                    waiting[pa.activity_type.name] += 1

    await asyncio.gather(*(one(j) for j in job_ids))
    return waiting
