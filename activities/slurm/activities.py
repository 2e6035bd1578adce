"""Scheduler activities: thin, classified wrappers around the scheduler port."""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import activity

from activities.errors import classified_errors
from activities.slurm.port import SchedulerReads
from workflows.domain.recovery import ObserveJobInput, ObserveJobResult


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
