"""What ``rebound bench slurm-scale`` measures on the real lab (I/O): the scheduler's JSON reads and which
monitored jobs hold a running watch (the processes' CPU and memory: the synthetic bench's ``deploy.scale.measure``).

Every figure comes from the real thing: ``squeue --json`` / ``sinfo --json`` run as subprocesses (wall time, the
child's own CPU time from ``wait4``, bytes printed) and parsed by Rebound's own parser (``activities.slurm.parse``);
watches from Temporal's description of each JobRecovery workflow (its pending
activities and their state).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from workflows.domain.base import Frozen

if TYPE_CHECKING:
    from temporalio.client import Client

    from workers.settings import Settings

__all__ = [
    "CommandCost",
    "WatchCensus",
    "census_of",
    "incidents_by_job",
    "measure_json_read",
    "watch_census",
]


class CommandCost(Frozen):
    """One run of a scheduler read: what it cost the machine and what Rebound then spent parsing it."""

    command: str
    wall_s: float
    cpu_s: float
    """The command's own user + system CPU (``wait4``), not counting slurmctld's side of the RPC."""
    bytes: int
    parse_s: float
    """Rebound's parser (``parse_jobs`` / ``parse_nodes``) on the output, in this process."""
    items: int
    """Jobs or nodes parsed."""


def measure_json_read(argv: Sequence[str], env: Mapping[str, str], *, timeout_s: float = 60.0) -> CommandCost:
    """Run ``squeue --json`` or ``sinfo --json`` once and parse its output as the worker does.

    Raises:
        RuntimeError: the command failed or ran past ``timeout_s``.
    """
    import resource

    from activities.slurm.parse import load_payload, parse_jobs, parse_nodes

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    try:
        done = subprocess.run(list(argv), env=dict(env), capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(argv)} ran past {timeout_s:.0f} s") from None
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child is reaped: its CPU is what this grew by
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode(errors='replace')[:300]}")
    parse_started = time.perf_counter()
    payload = load_payload(done.stdout, source=argv[0])
    items = len(parse_jobs(payload) if Path(argv[0]).name == "squeue" else parse_nodes(payload))
    parse_s = time.perf_counter() - parse_started
    return CommandCost(
        command=" ".join(Path(argv[0]).name if i == 0 else a for i, a in enumerate(argv)),
        wall_s=wall,
        cpu_s=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        bytes=len(done.stdout),
        parse_s=parse_s,
        items=items,
    )


class WatchCensus(Frozen):
    """Which monitored jobs' watches run, from Temporal's description of every JobRecovery workflow."""

    workflows: int
    """JobRecovery workflows described."""
    watching: tuple[int, ...]
    """Jobs whose ``job_watch`` activity is running on a worker slot."""
    watch_waiting: tuple[int, ...]
    """Jobs whose ``job_watch`` is scheduled and never started (no free slot)."""
    anchor_waiting: tuple[int, ...]
    """Jobs still waiting for a slot for ``job_log_anchor``, the step before their first watch."""
    other: tuple[int, ...]
    """Jobs with neither (between steps, or in an incident)."""


def census_of(pending: Mapping[int, Sequence[tuple[str, bool]]]) -> WatchCensus:
    """Sort jobs by their pending activities: ``{job_id: [(activity type, started), ...]}``. Pure."""
    watching, waiting, anchor, other = [], [], [], []
    for job_id, activities in sorted(pending.items()):
        kinds = {(name, started) for name, started in activities}
        if ("job_watch", True) in kinds:
            watching.append(job_id)
        elif ("job_watch", False) in kinds:
            waiting.append(job_id)
        elif any(name == "job_log_anchor" for name, _ in kinds):
            anchor.append(job_id)
        else:
            other.append(job_id)
    return WatchCensus(
        workflows=len(pending),
        watching=tuple(watching),
        watch_waiting=tuple(waiting),
        anchor_waiting=tuple(anchor),
        other=tuple(other),
    )


async def watch_census(client: Client, cluster: str, job_ids: Sequence[int]) -> WatchCensus:
    """Describe each job's JobRecovery (a job without one counts as ``other``) and sort them."""
    from temporalio.api.enums.v1 import PendingActivityState
    from temporalio.service import RPCError

    from workflows.constants import job_workflow_id

    pending: dict[int, list[tuple[str, bool]]] = {}
    for job_id in job_ids:
        try:
            desc = await client.get_workflow_handle(job_workflow_id(cluster, job_id)).describe()
        except RPCError:
            pending[job_id] = []
            continue
        pending[job_id] = [
            (a.activity_type.name, a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED)
            for a in desc.raw_description.pending_activities
        ]
    return census_of(pending)


async def incidents_by_job(client: Client, settings: Settings, job_ids: Sequence[int]) -> dict[int, list[str]]:
    """Every job whose JobRecovery recorded an incident, with the incidents' kinds (``status`` queries, a few at a
    time); a job whose workflow does not answer is left out and counted under ``-1``."""
    import asyncio

    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError

    from workers.jobs_cli import query_status
    from workflows.domain.errors import ReboundError

    gate = asyncio.Semaphore(8)
    found: dict[int, list[str]] = {}
    unanswered = 0

    async def one(job_id: int) -> None:
        nonlocal unanswered
        async with gate:
            try:
                st = await query_status(client, settings, job_id)
            except (ReboundError, RPCError, WorkflowQueryFailedError):
                unanswered += 1
                return
        if st.incidents:
            found[job_id] = [i.anomaly.kind.value for i in st.incidents]

    await asyncio.gather(*(one(j) for j in job_ids))
    if unanswered:
        found[-1] = [f"{unanswered} unanswered"]
    return found
