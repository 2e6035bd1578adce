"""The cluster's audit Schedule (id ``rebound/{cluster}/audit``): created or brought up to date at worker start.

Every worker calls ``ensure_audit_schedule``; the Schedule id is the business key, so N workers make one
Schedule. A Schedule that already matches the settings is left alone (no update, no new conflict token); one that
differs (another interval, period, task queue) is updated in place, keeping its paused state and note, so an
operator's ``temporal schedule toggle --pause`` survives worker restarts. ``audit.enabled = false`` deletes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleDescription,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.temporal.audit import AuditActivities
from activities.temporal.rebound_workflows import audit_schedule_action
from workers.settings import Settings
from workflows.constants import audit_schedule_id
from workflows.domain.audit import AuditInput
from workflows.domain.errors import FailureKind, ReboundError

__all__ = [
    "ScheduleOutcome",
    "audit_report_dir",
    "build_audit_activities",
    "desired_audit_schedule",
    "ensure_audit_schedule",
    "start_audit_schedule",
]

log = logging.getLogger("rebound.audit")

#: An audit that runs longer than this is stuck (collecting is bounded well below it).
AUDIT_EXECUTION_TIMEOUT = timedelta(minutes=30)


class ScheduleOutcome(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    DELETED = "deleted"
    ABSENT = "absent"
    """Disabled, and there was none."""


def audit_report_dir(settings: Settings) -> Path:
    """Where this worker writes audit reports."""
    return settings.audit.report_dir or settings.state_dir / "reports"


def desired_audit_schedule(settings: Settings) -> Schedule:
    """The Schedule the settings ask for: AuditWorkflow every ``audit.interval_s`` over ``audit.period_s``.

    Overlap SKIP (an audit still running when the next is due makes the next one wait for the following slot);
    catch-up of one interval (after an outage, one audit of the latest period, not one per missed hour).
    """
    interval = timedelta(seconds=settings.audit.interval_s)
    return Schedule(
        action=audit_schedule_action(
            AuditInput(cluster=settings.cluster_name, period_s=settings.audit.effective_period_s),
            schedule_id=audit_schedule_id(settings.cluster_name),
            task_queue=settings.temporal.task_queue,
            execution_timeout=AUDIT_EXECUTION_TIMEOUT,
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=interval)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=max(interval, timedelta(minutes=1))),
    )


async def _matches(client: Client, current: ScheduleDescription, desired: Schedule) -> bool:
    have, want = current.schedule, desired
    if not isinstance(have.action, ScheduleActionStartWorkflow):
        return False
    assert isinstance(want.action, ScheduleActionStartWorkflow)
    try:
        [args] = await client.data_converter.decode(list(have.action.args), [AuditInput])
    except Exception:  # an older or foreign payload: replace it
        return False
    return (
        have.action.workflow == want.action.workflow
        and have.action.id == want.action.id
        and have.action.task_queue == want.action.task_queue
        and have.action.execution_timeout == want.action.execution_timeout
        and args == want.action.args[0]
        and [i.every for i in have.spec.intervals] == [i.every for i in want.spec.intervals]
        and not have.spec.calendars
        and not have.spec.cron_expressions
        and have.policy.overlap == want.policy.overlap
        and have.policy.catchup_window == want.policy.catchup_window
    )


async def ensure_audit_schedule(client: Client, settings: Settings) -> ScheduleOutcome:
    """Create, update, leave alone, or (disabled) delete the cluster's audit Schedule. Idempotent.

    Raises:
        ReboundError: ``TEMPORAL_UNREACHABLE`` when Temporal does not answer, ``CONFIGURATION`` when it refuses
            (schedules disabled on the server, a missing permission, the cluster search attribute unregistered).
    """
    schedule_id = audit_schedule_id(settings.cluster_name)
    handle = client.get_schedule_handle(schedule_id)
    try:
        if not settings.audit.enabled:
            try:
                await handle.delete()
            except RPCError as e:
                if e.status is RPCStatusCode.NOT_FOUND:
                    return ScheduleOutcome.ABSENT
                raise
            log.info("audit schedule %s deleted (audit.enabled is false)", schedule_id)
            return ScheduleOutcome.DELETED
        desired = desired_audit_schedule(settings)
        try:
            await client.create_schedule(schedule_id, desired)
            log.info("audit schedule %s created: every %.0f s", schedule_id, settings.audit.interval_s)
            return ScheduleOutcome.CREATED
        except ScheduleAlreadyRunningError:
            pass
        if await _matches(client, await handle.describe(), desired):
            return ScheduleOutcome.UNCHANGED

        def update(inp: ScheduleUpdateInput) -> ScheduleUpdate:
            desired.state = inp.description.schedule.state  # keep an operator's pause and note
            return ScheduleUpdate(schedule=desired)

        await handle.update(update)
        log.info("audit schedule %s updated: every %.0f s", schedule_id, settings.audit.interval_s)
        return ScheduleOutcome.UPDATED
    except RPCError as e:
        kind = (
            FailureKind.TEMPORAL_UNREACHABLE
            if e.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)
            else FailureKind.CONFIGURATION
        )
        raise ReboundError(kind, f"audit schedule {schedule_id}: {e.status.name}: {e.message}") from e


async def start_audit_schedule(client: Client, settings: Settings) -> ScheduleOutcome | None:
    """``ensure_audit_schedule`` at worker start: a failure is logged, never fatal (recovery matters more than
    reports; the next worker start tries again)."""
    try:
        return await ensure_audit_schedule(client, settings)
    except ReboundError as e:
        log.error("audit schedule not set up: %s", e)
        return None


def build_audit_activities(client: Client, settings: Settings) -> list[Callable[..., Any]]:
    """The Audit workflow's activities for the central worker, ready for ``Worker(activities=...)``."""
    acts = AuditActivities(
        client, report_dir=audit_report_dir(settings), query_timeout_s=settings.temporal.query_timeout_s
    )
    return [acts.collect, acts.write_report]
