"""The Fleet's operator actions, signed with a real munged: who may approve, reject, switch the mode and reset the
breaker, and what a forged, replayed, stale or unsigned attempt changes (nothing, checked by a fresh query)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.worker import Worker

from tests.munge_support import MungeLab
from workflows.constants import OPERATOR_REQUEST_UPDATE
from workflows.domain.fleet import (
    ApprovalAnswer,
    ApprovalKind,
    ApprovalOutcome,
    FleetInput,
    FleetMode,
    FleetPolicy,
    FleetState,
    FleetStatus,
    IsolationRequest,
)
from workflows.domain.operators import OperatorAction, OperatorActionKind, OperatorCredential, OperatorRequest
from workflows.fleet import FleetWorkflow
from workflows.policy import operators as rules
from workflows.policy.fleet import open_approval


@dataclass
class World:
    handle: WorkflowHandle[FleetWorkflow, None]
    cluster: str
    munge: MungeLab
    operators: list[str]

    def action(self, kind: OperatorActionKind, **fields: object) -> OperatorAction:
        return OperatorAction(kind=kind, cluster=self.cluster, nonce=uuid.uuid4().hex, **fields)

    async def send(self, req: OperatorRequest) -> FleetStatus:
        st: FleetStatus = await self.handle.execute_update(OPERATOR_REQUEST_UPDATE, req, result_type=FleetStatus)
        return st

    async def refused(self, req: OperatorRequest) -> str:
        with pytest.raises(WorkflowUpdateFailedError) as e:
            await self.send(req)
        return str(getattr(e.value.cause, "message", e.value.cause))

    async def status(self) -> FleetStatus:
        return await self.handle.query(FleetWorkflow.status)


def _pending_state(cluster: str) -> FleetState:
    """A Fleet with two pending restart approvals (nobody waits for their answer: ``reply_to`` is empty)."""
    now = datetime.now(UTC)  # at the test's start, not the module's import: the approvals must still be pending
    state = FleetState(cluster=cluster, mode=FleetMode.ACT)
    for job in (1, 2):
        req = IsolationRequest(request_id=f"r{job}", reply_to="", job_id=job, incident="1", cause="rank-crash",
                               requested_at=now)  # fmt: skip
        state, _ = open_approval(state, ApprovalKind.RESTART, req, (), ("test",), FleetPolicy(), now)
    return state


@pytest_asyncio.fixture
async def world(temporal_client: Client, task_queue: str, munge_lab: MungeLab) -> AsyncIterator[World]:
    cluster = f"ops{uuid.uuid4().hex[:6]}"
    operators = ["root"]
    worker = Worker(
        temporal_client,
        task_queue=task_queue,
        workflows=[FleetWorkflow],
        activities=[munge_lab.verifier(operators).verify],
    )
    async with worker:
        handle = await temporal_client.start_workflow(
            FleetWorkflow.run,
            FleetInput(cluster=cluster, policy=FleetPolicy(mode=FleetMode.ACT), carried=_pending_state(cluster)),
            id=f"rebound/{cluster}/fleet",
            task_queue=task_queue,
        )
        yield World(handle, cluster, munge_lab, operators)
        await handle.terminate("test over")


async def test_an_operator_approves_as_the_verified_user(world: World) -> None:
    act = world.action(OperatorActionKind.APPROVE, approval_id="a-1", note="checked")
    st = await world.send(world.munge.request(act, claimed="lab"))  # the claim is not who acts
    a1 = next(a for a in st.state.approvals if a.id == "a-1")
    assert (a1.outcome, a1.decided_by, a1.note) == (ApprovalOutcome.APPROVED, "root", "checked")
    assert st.state.auth.events[-1].user == "root" and st.state.auth.events[-1].allowed


async def test_a_non_operator_changes_nothing(world: World) -> None:
    before = await world.status()
    for act in (
        world.action(OperatorActionKind.APPROVE, approval_id="a-1"),
        world.action(OperatorActionKind.MODE, mode=FleetMode.OBSERVE),
        world.action(OperatorActionKind.BREAKER_RESET),
    ):
        reason = await world.refused(world.munge.request(act, user="nobody", claimed="root"))
        assert "nobody is not an operator" in reason
    after = await world.status()
    assert after.state.approvals == before.state.approvals
    assert (after.state.mode, after.state.breaker_reset_at) == (FleetMode.ACT, None)
    assert [e.user for e in after.state.auth.events] == ["nobody"] * 3


async def test_replayed_stale_forged_and_unsigned_attempts_are_refused(world: World) -> None:
    req = world.munge.request(world.action(OperatorActionKind.MODE, mode=FleetMode.CANARY, canary_partition="gpu"))
    await world.send(req)
    assert "replay" in await world.refused(req)  # the same credential again, even by the operator
    stale = req.model_copy(
        update={"credential": req.credential.model_copy(update={"encoded_at": datetime.now(UTC) - timedelta(hours=1)})}
    )
    assert "old" in await world.refused(stale)
    forged_cred = OperatorCredential(munge="MUNGE:" + "A" * 120 + ":", claimed_user="root",
                                     encoded_at=datetime.now(UTC))  # fmt: skip
    forged = OperatorRequest(action=world.action(OperatorActionKind.BREAKER_RESET), credential=forged_cred)
    assert "did not verify" in await world.refused(forged)
    # A real credential made for another action cannot carry this one.
    signed = world.munge.request(world.action(OperatorActionKind.APPROVE, approval_id="a-1"))
    swapped = signed.model_copy(update={"action": world.action(OperatorActionKind.APPROVE, approval_id="a-2")})
    assert "another action" in await world.refused(swapped)
    with pytest.raises(WorkflowUpdateFailedError, match="update failed"):
        await world.handle.execute_update(
            FleetWorkflow.answer_approval, ApprovalAnswer(approval_id="a-2", operator="root", approve=True)
        )
    with pytest.raises(WorkflowUpdateFailedError):
        await world.handle.execute_update(FleetWorkflow.reset_breaker, "root")
    st = await world.status()
    assert st.state.mode is FleetMode.CANARY and st.state.breaker_reset_at is None
    assert all(a.outcome is ApprovalOutcome.PENDING for a in st.state.approvals)


async def test_forged_attempts_are_rate_limited_before_any_activity(world: World) -> None:
    def forged(i: int) -> OperatorRequest:
        cred = OperatorCredential(munge=f"MUNGE:{i:04d}" + "A" * 100 + ":", claimed_user="mallory",
                                  encoded_at=datetime.now(UTC))  # fmt: skip
        return OperatorRequest(action=world.action(OperatorActionKind.BREAKER_RESET), credential=cred)

    for i in range(rules.REFUSALS_PER_CALLER):
        assert "did not verify" in await world.refused(forged(i))
    events_before = len([e async for e in world.handle.fetch_history_events()])
    assert "mallory: 5 failed verifications" in await world.refused(forged(99))
    events_after = len([e async for e in world.handle.fetch_history_events()])
    assert events_after == events_before  # the validator refused: nothing written to the history


async def test_the_operator_list_is_live_and_its_change_audited(world: World) -> None:
    await world.send(world.munge.request(world.action(OperatorActionKind.BREAKER_RESET)))
    world.operators.append("nobody")  # the configuration changes; nothing is restarted
    st = await world.send(world.munge.request(world.action(OperatorActionKind.REJECT, approval_id="a-2"),
                                              user="nobody"))  # fmt: skip
    a2 = next(a for a in st.state.approvals if a.id == "a-2")
    assert (a2.outcome, a2.decided_by) == (ApprovalOutcome.REJECTED, "nobody")
    change = [e for e in st.state.auth.events if e.action == "operators-changed"]
    assert len(change) == 1 and "added: nobody" in change[0].detail
    world.operators.remove("root")  # revoked: refused at once
    reason = await world.refused(world.munge.request(world.action(OperatorActionKind.BREAKER_RESET)))
    assert "root is not an operator" in reason
