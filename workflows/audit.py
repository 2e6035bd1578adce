"""Audit: one report of how Rebound did on a cluster over a period (a Schedule runs it hourly; ``rebound audit``
runs one on demand).

Collect (an activity reads visibility, every JobRecovery run's ``status`` and the Fleet's approvals), summarise
(pure, here, in the workflow: ``workflows.policy.audit``), write (an activity renders JSON, Markdown and HTML under
the report directory). A scheduled run audits the period ending at its *scheduled* time, so consecutive runs tile the
timeline even when one starts late.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from activities.temporal.audit import AuditActivities
    from workflows.constants import AUDIT_WORKFLOW
    from workflows.domain.audit import AuditCollectInput, AuditInput, AuditResult, AuditWriteInput
    from workflows.domain.errors import FailureKind
    from workflows.policy.audit import summarise
    from workflows.policy.audit_measures import utc

_PERMANENT = [k.value for k in FailureKind if not k.retryable]

#: Reading every run of the period: one query per run (a closed run's is a replay), heartbeating per run.
AUDIT_COLLECT: dict[str, Any] = {
    "start_to_close_timeout": timedelta(minutes=15),
    "heartbeat_timeout": timedelta(minutes=1),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=2),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=5,
        non_retryable_error_types=_PERMANENT,
    ),
}
#: Writing three files: quick; a directory that cannot be written is permanent (CONFIGURATION).
AUDIT_WRITE: dict[str, Any] = {
    "start_to_close_timeout": timedelta(minutes=2),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=1), maximum_attempts=3, non_retryable_error_types=_PERMANENT
    ),
}

#: Set by the server on every workflow a Schedule starts.
SCHEDULED_START_TIME = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")


@workflow.defn(name=AUDIT_WORKFLOW)
class AuditWorkflow:
    """Reads the period's JobRecovery workflows and Fleet approvals, and writes the audit report."""

    @workflow.run
    async def run(self, inp: AuditInput) -> AuditResult:
        since, until = inp.window(self._default_until())
        workflow.set_current_details(f"## Audit of {inp.cluster}\n\n{since:%Y-%m-%d %H:%M:%S} .. {until:%H:%M:%S} UTC")
        collection = await workflow.execute_activity_method(
            AuditActivities.collect,
            AuditCollectInput(cluster=inp.cluster, since=since, until=until),
            summary=f"Read JobRecovery workflows and the Fleet of {inp.cluster} "
            f"({(until - since).total_seconds() / 3600:.1f} h)",
            **AUDIT_COLLECT,
        )
        summary = summarise(collection)
        paths = await workflow.execute_activity_method(
            AuditActivities.write_report,
            AuditWriteInput(summary=summary, out_dir=inp.out_dir),
            summary=f"Write the report: {summary.incidents} incident(s) of {summary.jobs} job(s)",
            **AUDIT_WRITE,
        )
        result = AuditResult(
            cluster=inp.cluster,
            since=since,
            until=until,
            paths=paths,
            jobs=summary.jobs,
            incidents=summary.incidents,
            cluster_goodput=summary.cluster_goodput,
            detection_p50_s=summary.detection.p50,
            detection_p95_s=summary.detection.p95,
            action_p50_s=summary.action.p50,
            action_p95_s=summary.action.p95,
            approvals_waited=summary.approvals.total,
            approvals_pending=summary.approvals.pending_at_end,
            unreadable_runs=len(summary.failures),
        )
        workflow.set_current_details(f"## Audit of {inp.cluster}\n\n{result.headline()}\n\n- {paths.html_path}\n")
        return result

    @staticmethod
    def _default_until() -> datetime:
        scheduled = workflow.info().typed_search_attributes.get(SCHEDULED_START_TIME)
        return utc(scheduled) if scheduled is not None else workflow.now()
