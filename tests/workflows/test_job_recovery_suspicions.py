"""Suspicions end to end on the dev server with the FakeScheduler: a rank crash excludes its node
for the job and drains nothing; the same node implicated again by a job of another user is drained, both incidents
and users named; again by another job of the same user (a job's output is a claim), the drain waits for an operator;
the job's exclusion stands across its restarts; an exclusion that would leave the job unplaceable is not made;
a late node-level GPU fault on a suspected node drains it, naming the suspicion and the fault."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest_asyncio
from temporalio.client import Client

from activities.gpu.xid_catalog import default_xid_catalog
from activities.slurm.port import RestartRequest
from tests.workflows.test_job_recovery import Handle, Harness, agent, until
from workers.gpu_push import node_level_fault
from workers.jobs_cli import render_timeline
from workflows.constants import NODE_GPU_FAULT_SIGNAL, fleet_workflow_id
from workflows.domain.fleet import ApprovalKind, ApprovalOutcome, IsolationDecision
from workflows.domain.gpu import GpuAction, GpuEvent, GpuEventKind
from workflows.domain.incident import ActionKind, ActionRung
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState
from workflows.fleet import FleetWorkflow


@pytest_asyncio.fixture
async def h(temporal_client: Client, task_queue: str, tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(temporal_client, task_queue, tmp_path)
    async with harness.worker():
        yield harness


def crash(h: Harness, job_id: int, rank: int, node: str) -> None:
    """Rank ``rank`` on ``node`` exits on its own, its peer loses it, Slurm ends the job."""
    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    h.log(job_id, rank, f"{ts} [ERROR] rank={rank}/2 node={node} step=8 fatal error: exiting with code 137")
    h.log(job_id, 1 - rank, "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.1]:1")
    h.sched.fail_job(job_id, exit_code=137)


def drains(st: JobRecoveryStatus, number: int) -> list[str]:
    return [a.target for a in st.incidents[number - 1].actions if a.kind is ActionKind.DRAIN]


def restarts(h: Harness, job_id: int) -> list[tuple[str, ...]]:
    """The exclusion each restart of the job asked for."""
    requests = [c.args[0] for c in h.sched.calls if c.method == "restart_excluding"]
    return [r.exclude for r in requests if isinstance(r, RestartRequest) and r.job_id == job_id]


def fleet_notes(st: JobRecoveryStatus, number: int) -> str:
    return " | ".join(e.detail for e in st.timeline if e.event == "FLEET" and e.incident == number)


async def resumed(h: Harness, handle: Handle, job_id: int, count: int) -> JobRecoveryStatus:
    await until(handle, lambda s: s.state is RecoveryState.VERIFYING and len(s.incidents) == count)
    h.sched.schedule()
    h.step(job_id, 0, 9, h.sched.jobs[job_id].nodes[0])
    return await until(
        handle, lambda s: s.state is RecoveryState.WATCHING and s.incidents[-1].resumed_at is not None, timeout=30
    )


def owned_by(h: Harness, job_id: int, user: str) -> None:
    """The scheduler's record of the job names ``user`` as its owner (the fake submits every job as root)."""
    h.sched.jobs[job_id] = h.sched.jobs[job_id].model_copy(update={"user": user})


async def implicate_twice(h: Harness, user_a: str, user_b: str) -> tuple[JobRecoveryStatus, JobRecoveryStatus]:
    """Job a of ``user_a`` crashes on the second node (a suspicion), then job b of ``user_b`` on the same node."""
    a = h.sched.submit(h.nodes[:2], name="a")
    owned_by(h, a.job_id, user_a)
    handle_a = await h.start(a.job_id)
    await until(handle_a, lambda s: s.state is RecoveryState.WATCHING)
    crash(h, a.job_id, 1, h.nodes[1])
    st_a = await resumed(h, handle_a, a.job_id, 1)
    assert drains(st_a, 1) == [] and not h.sched.nodes[h.nodes[1]].is_drained
    assert restarts(h, a.job_id) == [(h.nodes[1],)]
    assert h.nodes[1] not in h.sched.jobs[a.job_id].nodes
    assert "suspicion recorded, not drained" in fleet_notes(st_a, 1)
    assert f"  action      exclude: exclude {h.nodes[1]} from this job's next placement" in render_timeline(st_a)

    b = h.sched.submit([h.nodes[1], h.nodes[3]], name="b")
    owned_by(h, b.job_id, user_b)
    handle_b = await h.start(b.job_id)
    await until(handle_b, lambda s: s.state is RecoveryState.WATCHING)
    crash(h, b.job_id, 0, h.nodes[1])
    st_b = await until(handle_b, lambda s: s.state is RecoveryState.VERIFYING)
    inc = st_b.incidents[0]
    assert inc.attribution is not None and inc.attribution.action is ActionRung.EXCLUDE
    await handle_a.terminate()
    await handle_b.terminate()
    return st_a, st_b


async def test_the_same_node_implicated_by_a_job_of_another_user_is_drained_naming_both(h: Harness) -> None:
    st_a, st_b = await implicate_twice(h, "alice", "bob")
    a, b = st_a.job_id, st_b.job_id
    assert drains(st_b, 1) == [h.nodes[1]] and h.sched.nodes[h.nodes[1]].is_drained
    notes = fleet_notes(st_b, 1)
    assert f"{h.nodes[1]}: implicated again" in notes
    assert f"{a}-1 (rank-crash, job {a} of alice)" in notes and f"now {b}-1 (rank-crash, job {b} of bob)" in notes
    assert f"{h.nodes[1]}: drain (confidence" in notes and "implicated by jobs of users alice and bob" in notes


async def test_the_same_node_implicated_by_another_job_of_the_same_user_waits_for_an_operator(h: Harness) -> None:
    st_a, st_b = await implicate_twice(h, "alice", "alice")
    assert drains(st_b, 1) == [] and not h.sched.nodes[h.nodes[1]].is_drained
    assert restarts(h, st_b.job_id) == [(h.nodes[1],)]  # excluded for this job
    notes = fleet_notes(st_b, 1)
    assert f"{h.nodes[1]}: implicated again within 1d only by jobs of user alice" in notes
    assert "a job's output is a claim" in notes
    fleet = h.client.get_workflow_handle(fleet_workflow_id(h.cluster))
    st = await fleet.query(FleetWorkflow.status)
    asked = [a for a in st.state.approvals if a.request.job_id == st_b.job_id]
    assert [(a.kind, a.nodes, a.outcome) for a in asked] == [
        (ApprovalKind.DRAIN, (h.nodes[1],), ApprovalOutcome.PENDING)
    ]
    assert any("only by jobs of user alice" in r for r in asked[0].reasons)
    assert st.policy.approval_default is ApprovalOutcome.REJECTED  # nobody answers: no drain
    suspicions = [i for i in st.state.nodes[h.nodes[1]].incidents if i.suspicion]
    assert [(i.job_id, i.user) for i in suspicions] == [(st_a.job_id, "alice"), (st_b.job_id, "alice")]


async def test_the_jobs_exclusion_stands_across_its_restarts(h: Harness) -> None:
    job = h.sched.submit(h.nodes[:2])
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    crash(h, job.job_id, 1, h.nodes[1])
    await resumed(h, handle, job.job_id, 1)
    second = h.sched.jobs[job.job_id].nodes[1]
    assert second != h.nodes[1]
    crash(h, job.job_id, 1, second)
    st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING and len(s.incidents) == 2)
    assert restarts(h, job.job_id) == [(h.nodes[1],), (second, h.nodes[1])]
    assert drains(st, 2) == []  # a different node: another suspicion, not a repeat
    await handle.terminate()


async def test_the_restart_keeps_the_owners_exclusion_and_drops_stale_ones(h: Harness) -> None:
    job = h.sched.submit(h.nodes[:2])
    # The owner submitted with --exclude=<4th node>: recorded when Rebound first sees the job.
    h.sched.jobs[job.job_id] = h.sched.jobs[job.job_id].model_copy(update={"excluded_nodes": (h.nodes[3],)})
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    # Later, an exclusion Rebound does not stand by shows on the job (left by an earlier restart).
    h.sched.jobs[job.job_id] = h.sched.jobs[job.job_id].model_copy(update={"excluded_nodes": (h.nodes[2], h.nodes[3])})
    crash(h, job.job_id, 1, h.nodes[1])
    await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    requests = [r for c in h.sched.calls if c.method == "restart_excluding" for r in c.args[:1]]
    asked = [(r.exclude, r.user_excluded) for r in requests if isinstance(r, RestartRequest)]
    assert asked == [((h.nodes[1],), (h.nodes[3],))]
    assert set(h.sched.jobs[job.job_id].excluded_nodes) == {h.nodes[1], h.nodes[3]}
    await handle.terminate()


async def test_the_placement_check_uses_the_nodes_gpus_and_cpus(h: Harness) -> None:
    for name, gpus in zip(h.nodes, (4, 4, 2, 2), strict=True):  # the last two cannot hold a 4-GPU node of the job
        h.sched.nodes[name] = h.sched.nodes[name].model_copy(update={"gpus": gpus, "cpus": 32})
    job = h.sched.submit(h.nodes[:2])
    h.sched.jobs[job.job_id] = h.sched.jobs[job.job_id].model_copy(update={"gpus_per_node": 4, "cpus_per_node": 8})
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    crash(h, job.job_id, 1, h.nodes[1])
    st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    assert restarts(h, job.job_id) == [()]  # a rough count (3 placeable nodes left) would have excluded it
    notes = fleet_notes(st, 1)
    assert f"{h.nodes[1]}: not excluded: the job needs 2 nodes with 4 GPUs, 8 CPUs" in notes
    assert "placement checked per node: 4 GPUs, 8 CPUs each" in notes
    await asyncio.wait_for(handle.terminate(), 10)


async def test_an_exclusion_that_leaves_the_job_unplaceable_is_not_made(h: Harness) -> None:
    job = h.sched.submit(h.nodes)  # every node of the cluster
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    crash(h, job.job_id, 1, h.nodes[1])
    st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    assert restarts(h, job.job_id) == [()]
    assert drains(st, 1) == [] and not h.sched.nodes[h.nodes[1]].is_drained
    notes = fleet_notes(st, 1)
    assert f"{h.nodes[1]}: not excluded: the job needs 4 nodes" in notes and "restarted without this exclusion" in notes
    assert "placement check was rough" in notes  # the fake's nodes and job say nothing of GPUs or CPUs
    assert not [e for e in st.timeline if e.event == "EXCLUDED"]
    await asyncio.wait_for(handle.terminate(), 10)


async def fleet_decision(h: Harness, request_id: str, timeout: float = 20) -> IsolationDecision:
    fleet = h.client.get_workflow_handle(fleet_workflow_id(h.cluster))
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        st = await fleet.query(FleetWorkflow.status)
        found = next((d for d in st.state.decisions if d.request_id == request_id), None)
        if found is not None:
            return found
        assert asyncio.get_running_loop().time() < deadline, [d.request_id for d in st.state.decisions]
        await asyncio.sleep(0.1)


def xid(node: str, code: int, sequence: int) -> GpuEvent:
    return GpuEvent(
        kind=GpuEventKind.XID, host=node, index=0, xid=code, observed_at=datetime.now(UTC), sequence=sequence
    )


async def test_a_late_hardware_fault_on_a_suspected_node_drains_it_naming_both(h: Harness) -> None:
    job = h.sched.submit(h.nodes[:2])
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    crash(h, job.job_id, 1, h.nodes[1])
    await resumed(h, handle, job.job_id, 1)
    assert not h.sched.nodes[h.nodes[1]].is_drained  # a suspicion only
    catalog = default_xid_catalog()
    # An application-class XID is the job's to handle: the agent does not even tell the Fleet.
    assert node_level_fault(xid(h.nodes[1], 13, 1), h.nodes[1], catalog) is None
    fleet = h.client.get_workflow_handle(fleet_workflow_id(h.cluster))
    # A node-level fault on a node that holds no suspicion: nothing for the Fleet to escalate.
    clean = node_level_fault(xid(h.nodes[3], 79, 2), h.nodes[3], catalog)
    late = node_level_fault(xid(h.nodes[1], 79, 3), h.nodes[1], catalog)
    assert clean is not None and late is not None and late.action is GpuAction.DRAIN_NODE
    forged = node_level_fault(xid(h.nodes[1], 79, 99), h.nodes[1], catalog)
    assert forged is not None
    # The node's agent lists the real fault (sequence 3) in a fresh read, never the forged one (sequence 99).
    async with agent(h, h.nodes[1], late.event):
        await fleet.signal(NODE_GPU_FAULT_SIGNAL, forged)  # not escalated: the agent does not list it
        await asyncio.sleep(2)
        st = await fleet.query(FleetWorkflow.status)
        assert not h.sched.nodes[h.nodes[1]].is_drained and not [
            d for d in st.state.decisions if "gpu-fault" in d.request_id
        ]
        await fleet.signal(NODE_GPU_FAULT_SIGNAL, clean)
        await fleet.signal(NODE_GPU_FAULT_SIGNAL, late)
        await fleet.signal(NODE_GPU_FAULT_SIGNAL, late)  # re-sent: one escalation per suspicion
        incident = f"{job.job_id}-1"
        decision = await fleet_decision(h, f"{fleet_workflow_id(h.cluster)}/gpu-fault/{h.nodes[1]}/{incident}")
    assert decision.act and decision.drained == (h.nodes[1],)
    why = decision.reasons[0]
    assert f"suspected since {incident} (rank-crash, job {job.job_id}" in why and "XID 79" in why
    assert "hardware evidence: drain requested" in why
    node = h.sched.nodes[h.nodes[1]]
    assert node.is_drained and node.reason == f"rebound: {incident} rank-crash+xid-79"
    assert not h.sched.nodes[h.nodes[3]].is_drained
    st = await fleet.query(FleetWorkflow.status)
    assert [d.request_id for d in st.state.decisions].count(decision.request_id) == 1
    assert not [d for d in st.state.decisions if h.nodes[3] in d.request_id]
    await handle.terminate()
