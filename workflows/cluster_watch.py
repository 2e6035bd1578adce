"""ClusterWatch: one durable workflow per cluster (id ``rebound/{cluster}/watch``) that finds opted-in jobs and
starts their JobRecovery workflows.

Each round waits in one heartbeating discovery activity until opted-in active jobs appear that are not known
yet, or known ones end (or the activity's max wait runs out), then starts a JobRecovery per new job through an
activity (business-key id, ``USE_EXISTING``: a second start is a no-op). A job Rebound itself resubmitted is not
started again: the start activity finds it in its lineage's JobRecovery (ADR 014), and it is only marked known.
The known job ids live in workflow state and travel across continue-as-new. Failures are recorded for the
``status`` query and retried on the next round; the watch itself never ends on its own. A discovery the scheduler
refused for Rebound's credentials (``SCHEDULER_AUTH``: an expired slurmrestd token, munge, TLS) is also sent as a
``scheduler_auth`` notification, once per outage: until it is fixed Rebound sees nothing of the cluster.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.temporal.discovery import DiscoveryActivities
    from workflows.constants import CLUSTER_WATCH_WORKFLOW, STATUS_QUERY
    from workflows.domain.discovery import (
        MAX_RECENT_ERRORS,
        ClusterWatchInput,
        ClusterWatchStatus,
        DiscoveredJob,
        DiscoverJobsInput,
        StartJobRecoveryInput,
        WatchError,
    )
    from workflows.domain.errors import FailureKind
    from workflows.domain.notify import Notification, NotificationKind, Severity
    from workflows.history import continue_as_new_due
    from workflows.notify import notify
    from workflows.options import CLUSTER_DISCOVERY, TEMPORAL_START

#: Pause after a discovery that failed for good (a permanent scheduler error), before trying again.
DISCOVERY_BACKOFF = timedelta(seconds=30)
#: Continue as new once the history passes Rebound's own bound, and start at most ``MAX_STARTS_PER_ROUND`` jobs a
#: round (histories from before started every new job of a round at once).
HISTORY_BOUND_PATCH = "12-cluster-watch-history-bound"
#: JobRecovery starts per discovery round (about 3 history events each).
MAX_STARTS_PER_ROUND = 500
#: Notify operators when the scheduler refuses Rebound's credentials (histories from before never took that branch).
SCHEDULER_AUTH_ALERT_PATCH = "13-scheduler-auth-alert"


@workflow.defn(name=CLUSTER_WATCH_WORKFLOW)
class ClusterWatchWorkflow:
    """Discovers opted-in jobs of one cluster and starts their JobRecovery workflows."""

    @workflow.init
    def __init__(self, inp: ClusterWatchInput) -> None:
        carried = inp.carried
        self._status = (
            carried.model_copy(update={"runs": carried.runs + 1})
            if carried is not None
            else ClusterWatchStatus(cluster=inp.cluster)
        )
        self._known: set[int] = set(self._status.known)
        self._auth_alerted = False
        """A ``scheduler_auth`` notification went for the current outage (reset by a discovery that works)."""

    @workflow.run
    async def run(self, inp: ClusterWatchInput) -> None:
        """Discover and start, round after round; continue-as-new when the history grows (never returns)."""
        rounds = 0
        while True:
            await self._round(inp)
            rounds += 1
            if rounds >= inp.rounds_per_run or continue_as_new_due(HISTORY_BOUND_PATCH):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    ClusterWatchInput(
                        cluster=inp.cluster,
                        max_wait_s=inp.max_wait_s,
                        rounds_per_run=inp.rounds_per_run,
                        carried=self._status,
                    )
                )

    @workflow.query(
        name=STATUS_QUERY, description="Known jobs, the last discovery, jobs with a malformed opt-in, recent errors."
    )
    def status(self) -> ClusterWatchStatus:
        """The watch's state (also what continue-as-new carries)."""
        return self._status

    async def _round(self, inp: ClusterWatchInput) -> None:
        try:
            found = await workflow.execute_activity_method(
                DiscoveryActivities.discover_jobs,
                DiscoverJobsInput(cluster=inp.cluster, known=tuple(sorted(self._known)), max_wait_s=inp.max_wait_s),
                summary=f"Wait for opted-in jobs on {inp.cluster} ({len(self._known)} known)",
                **CLUSTER_DISCOVERY,
            )
        except ActivityError as e:
            self._error(e, None)
            await self._alert_on_refused_credentials(e, inp.cluster)
            await workflow.sleep(DISCOVERY_BACKOFF, summary="back off after a failed discovery")
            return
        self._auth_alerted = False
        self._known.difference_update(found.gone)
        # At most MAX_STARTS_PER_ROUND: the rest stay unknown, so the next discovery offers them at once, after a
        # look at the history's size (5,000 new jobs in one round would add some 15,000 events at once).
        new = found.new[:MAX_STARTS_PER_ROUND] if workflow.patched(HISTORY_BOUND_PATCH) else found.new
        # Starts are independent and idempotent: issue them together, record each outcome on its own.
        started = await asyncio.gather(*(self._start(inp.cluster, job) for job in new))
        self._known.update(job.job_id for job, ok in zip(new, started, strict=True) if ok)
        self._status = self._status.model_copy(
            update={
                "known": tuple(sorted(self._known)),
                "rejected": found.rejected,
                "last_discovery_at": found.observed_at,
                "discoveries": self._status.discoveries + 1,
                "started": self._status.started + sum(started),
            }
        )
        workflow.set_current_details(self._details_markdown())

    async def _start(self, cluster: str, job: DiscoveredJob) -> bool:
        try:
            await workflow.execute_activity_method(
                DiscoveryActivities.start_job_recovery,
                StartJobRecoveryInput(
                    cluster=cluster, job_id=job.job_id, spec=job.spec, resubmit_token=job.resubmit_token
                ),
                summary=f"Start JobRecovery for job {job.job_id} ({job.name or 'unnamed'}, {job.user or '?'})",
                **TEMPORAL_START,
            )
        except ActivityError as e:
            # Not known yet, so the next discovery offers the job again: that is the retry.
            self._error(e, job.job_id)
            return False
        return True

    async def _alert_on_refused_credentials(self, error: ActivityError, cluster: str) -> None:
        """Tell operators, once per outage, that the scheduler refuses Rebound's credentials (see the docstring)."""
        cause = error.cause
        if not isinstance(cause, ApplicationError) or cause.type != FailureKind.SCHEDULER_AUTH.value:
            return
        if self._auth_alerted or not workflow.patched(SCHEDULER_AUTH_ALERT_PATCH):
            return
        self._auth_alerted = True
        await notify(
            Notification(
                kind=NotificationKind.SCHEDULER_AUTH,
                job_id="-",
                cluster=cluster,
                title=f"Rebound cannot read the scheduler of {cluster}: its credentials were refused",
                text=f"{cause.message[:1500]}\n\nNo job is watched or recovered until this is fixed "
                "(docs/operations.md, 'Scheduler authentication failed').",
                severity=Severity.CRITICAL,
            )
        )

    def _error(self, error: ActivityError, job_id: int | None) -> None:
        cause = error.cause
        kind = cause.type if isinstance(cause, ApplicationError) and cause.type else type(cause or error).__name__
        entry = WatchError(at=workflow.now(), kind=kind, message=str(cause or error), job_id=job_id)
        errors = (*self._status.errors, entry)[-MAX_RECENT_ERRORS:]
        self._status = self._status.model_copy(update={"errors": errors})
        workflow.set_current_details(self._details_markdown())

    def _details_markdown(self) -> str:
        st = self._status
        seen = f"{st.last_discovery_at:%Y-%m-%d %H:%M:%S} UTC" if st.last_discovery_at else "never"
        lines = [
            f"## ClusterWatch {st.cluster}",
            "",
            f"- watching {len(st.known)} job(s): {', '.join(map(str, st.known)) or '-'}",
            f"- last discovery: {seen}; rounds {st.discoveries}; starts {st.started}; run {st.runs}",
        ]
        lines += [f"- not monitored, malformed opt-in: job {r.job_id}: {r.reason}" for r in st.rejected]
        lines += [f"- error {e.at:%H:%M:%S} {e.kind}: {e.message}" for e in st.errors[-5:]]
        return "\n".join(lines) + "\n"
