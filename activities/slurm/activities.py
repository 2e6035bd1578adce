"""Scheduler activities: thin, classified wrappers around the scheduler port."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from temporalio import activity

from activities.errors import classified_errors
from activities.slurm.port import SchedulerReads
from workflows.domain.recovery import ObserveJobInput, ObserveJobResult, WatchJobInput, WatchJobResult
from workflows.domain.slurm import SlurmJob


class SlurmActivities:
    """Activities bound to one scheduler adapter (chosen by ``workers/``)."""

    def __init__(self, scheduler: SchedulerReads) -> None:
        self._scheduler = scheduler

    @activity.defn(name="slurm_observe_job")
    async def observe_job(self, inp: ObserveJobInput) -> ObserveJobResult:
        """A fresh observation of one job."""
        with classified_errors():
            job = await self._scheduler.get_job(inp.job_id)
        return ObserveJobResult(observed_at=datetime.now(UTC), job=job)

    @activity.defn(name="slurm_watch_job")
    async def watch_job(self, inp: WatchJobInput) -> WatchJobResult:
        """Poll until the job changes (state, restart count) or disappears; heartbeat every poll.

        The poll count travels in the heartbeat details, so a retried attempt continues the count instead of
        starting over (it re-reads the scheduler anyway: the job's state is the scheduler's, not ours).
        """
        details = activity.info().heartbeat_details
        polls = int(details[0]) if details else 0
        while True:
            with classified_errors():
                job = await self._scheduler.get_job(inp.job_id)
            polls += 1
            activity.heartbeat(polls)
            if job is None or _changed(job, inp):
                return WatchJobResult(observed_at=datetime.now(UTC), job=job, polls=polls)
            await asyncio.sleep(inp.poll_interval_s)


def _changed(job: SlurmJob, inp: WatchJobInput) -> bool:
    return job.state is not inp.last_state or job.restart_count != inp.last_restart_count
