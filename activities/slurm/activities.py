"""Scheduler activities: thin, classified wrappers around the scheduler port."""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import activity

from activities.errors import classified_errors
from activities.slurm.port import SchedulerReads
from activities.slurm.snapshots import SnapshotCache
from workflows.domain.recovery import ObserveJobInput, ObserveJobResult


class SlurmActivities:
    """Activities bound to one scheduler adapter (chosen by ``workers/``)."""

    def __init__(self, scheduler: SchedulerReads, snapshots: SnapshotCache | None = None) -> None:
        self._scheduler = scheduler
        # The worker's shared snapshot cache: squeue --json ignores -j on Slurm 22.05, so one job's fresh
        # observation is a whole listing; JobRecoveries starting together share one instead of each running its own.
        self._snapshots = snapshots

    @activity.defn(name="slurm_observe_job")
    async def observe_job(self, inp: ObserveJobInput) -> ObserveJobResult:
        """A fresh observation of one job: a listing begun after this was asked (shared with concurrent asks)."""
        with classified_errors():
            if self._snapshots is None:
                job = await self._scheduler.get_job(inp.job_id)
            else:
                job = (await self._snapshots.taken_after(self._snapshots.now())).job(inp.job_id)
        return ObserveJobResult(observed_at=datetime.now(UTC), job=job)
