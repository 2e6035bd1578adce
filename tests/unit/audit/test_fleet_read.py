"""``audit_collect`` reading the Fleet: every answer it can get (or not get) becomes a coverage state, never a crash.

A fake client stands in for Temporal: no JobRecovery run is listed, and the Fleet's ``status`` query answers with
what each case gives (a status, an error, nothing in time).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment

from activities.temporal.audit import AuditActivities
from tests.unit.audit.builders import CLUSTER, SINCE, UNTIL, fleet_approvals, status
from workflows.constants import fleet_workflow_id
from workflows.domain.audit import AuditCollectInput, FleetRead
from workflows.domain.fleet import BreakerStatus, FleetPolicy, FleetState, FleetStatus
from workflows.policy.audit_approvals import fleet_approvals as approvals_of_period

HANG = object()


class _Handle:
    def __init__(self, client: _Client, wf_id: str) -> None:
        self._client, self._id = client, wf_id

    async def query(self, name: str, *, result_type: type) -> object:
        self._client.queries.append((self._id, name, result_type))
        if self._client.answer is HANG:
            await asyncio.sleep(30)
        if isinstance(self._client.answer, BaseException):
            raise self._client.answer
        return self._client.answer


class _Client:
    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.queries: list[tuple[str, str, type]] = []

    async def _nothing(self) -> AsyncIterator[Any]:
        for _ in ():
            yield _

    def list_workflows(self, query: str) -> AsyncIterator[Any]:
        return self._nothing()

    def get_workflow_handle(self, wf_id: str, *, run_id: str | None = None) -> _Handle:
        return _Handle(self, wf_id)


def _fleet_status() -> FleetStatus:
    state = FleetState(cluster=CLUSTER, approvals=fleet_approvals())
    return FleetStatus(state=state, breaker=BreakerStatus(drained_in_window=0, cap=4, open=False), policy=FleetPolicy())


async def _collect(answer: object, tmp_path: Path) -> tuple[Any, _Client]:
    client = _Client(answer)
    acts = AuditActivities(cast(Client, client), report_dir=tmp_path, query_timeout_s=0.2)
    got = await ActivityEnvironment().run(acts.collect, AuditCollectInput(cluster=CLUSTER, since=SINCE, until=UNTIL))
    return got, client


async def test_the_fleets_approvals_of_the_period_are_collected(tmp_path: Path) -> None:
    got, client = await _collect(_fleet_status(), tmp_path)
    assert client.queries == [(fleet_workflow_id(CLUSTER), "status", FleetStatus)]
    fleet = got.fleet
    assert (fleet.read, fleet.workflow_id, fleet.message, fleet.dropped) == (
        FleetRead.READ,
        fleet_workflow_id(CLUSTER),
        "",
        0,
    )
    # a-1 (decided before the period) and a-7 (requested after it) are left out; oldest request first.
    assert [a.id for a in fleet.approvals] == ["a-8", "a-4", "a-2", "a-3", "a-9", "a-5", "a-6"]
    assert fleet.approvals[0].requested_at.tzinfo is not None


@pytest.mark.parametrize(
    ("answer", "read", "message"),
    [
        (RPCError("workflow not found for ID: x", RPCStatusCode.NOT_FOUND, b""), FleetRead.MISSING, ""),
        (HANG, FleetRead.UNREADABLE, "QUERY_TIMEOUT: no answer within 0.2 s (is a worker running?)"),
        (
            RPCError("bad query", RPCStatusCode.INVALID_ARGUMENT, b""),
            FleetRead.UNREADABLE,
            "QUERY_INVALID_ARGUMENT: bad query",
        ),
        (
            WorkflowQueryFailedError("nondeterminism"),
            FleetRead.UNREADABLE,
            "QUERY_FAILED: WorkflowQueryFailedError: nondeterminism",
        ),
        (
            status(101, ()),
            FleetRead.UNREADABLE,
            "QUERY_FAILED: status is a JobRecoveryStatus, not a FleetStatus",
        ),
    ],
    ids=["missing", "timeout", "refused", "replay-failed", "wrong-type"],
)
async def test_a_fleet_that_cannot_be_read_is_named_not_fatal(
    answer: object, read: FleetRead, message: str, tmp_path: Path
) -> None:
    got, _ = await _collect(answer, tmp_path)
    assert (got.fleet.read, got.fleet.message, got.fleet.approvals) == (read, message, ())
    assert got.fleet.workflow_id == fleet_workflow_id(CLUSTER)


async def test_temporal_unreachable_while_reading_the_fleet_retries_the_attempt(tmp_path: Path) -> None:
    with pytest.raises(ApplicationError) as err:
        await _collect(RPCError("connection refused", RPCStatusCode.UNAVAILABLE, b""), tmp_path)
    assert err.value.type == "TEMPORAL_UNREACHABLE" and not err.value.non_retryable
    assert "rebound/audit-test/fleet" in str(err.value)


def test_fleet_status_times_are_read_as_utc() -> None:
    naive = fleet_approvals()[1].model_copy(update={"requested_at": datetime(2025, 1, 1, 1, 0, 1)})  # noqa: DTZ001
    [digest] = [a for a in approvals_of_period("f", (naive,), SINCE, UNTIL).approvals]
    assert digest.requested_at == datetime(2025, 1, 1, 1, 0, 1, tzinfo=UTC)
