"""The Fleet's health check of a node it drained, with the node check job (ADR 018), against fake activities
registered by name: the agent's GPU read, then the check, then the release the result calls for."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from activities.temporal.fleet import ResumeNodeInput, ResumeNodeResult
from workflows.constants import node_task_queue
from workflows.domain.fleet import FleetInput, FleetMode, FleetPolicy, FleetState, NodeLifecycle, NodeRecord
from workflows.domain.fleet_view import FleetView, FleetViewInput
from workflows.domain.gpu import NodeHealthCheckInput, NodeHealthCheckResult
from workflows.domain.node_check import (
    CheckOutcome,
    NodeCheckPolicy,
    NodeCheckReleaseInput,
    NodeCheckReleaseResult,
    NodeCheckRunInput,
    NodeCheckRunResult,
)
from workflows.domain.slurm import NodeBaseState, SlurmNode
from workflows.fleet import FleetWorkflow

OURS = "rebound: 42-1 xid-79"


class Fakes:
    def __init__(self, node: str, outcome: CheckOutcome) -> None:
        self.node = node
        self.outcome = outcome
        self.calls: list[str] = []
        self.runs: list[NodeCheckRunInput] = []
        self.releases: list[NodeCheckReleaseInput] = []

    @activity.defn(name="node_health_check")
    async def gpu_read(self, inp: NodeHealthCheckInput) -> NodeHealthCheckResult:
        self.calls.append("node_health_check")
        return NodeHealthCheckResult(node=self.node, healthy=True, detail="4 GPU(s) healthy")

    @activity.defn(name="dcgm_read_gpus")
    async def dcgm(self, inp: dict[str, Any]) -> dict[str, Any]:
        """Where the health check also reads DCGM: the node has no exporter (a plain payload: this test does not
        depend on the DCGM models)."""
        return {"nodes": [{"node": n, "configured": False} for n in inp["nodes"]]}

    @activity.defn(name="fleet_view")
    async def view(self, inp: FleetViewInput) -> FleetView:
        self.calls.append("fleet_view")
        node = SlurmNode(name=self.node, state=NodeBaseState.IDLE, flags=("DRAIN",), reason=OURS)
        return FleetView(observed_at=datetime.now(UTC), asked=inp.nodes, node_count=4, nodes=(node,))

    @activity.defn(name="fleet_resume_node")
    async def resume(self, inp: ResumeNodeInput) -> ResumeNodeResult:
        self.calls.append("fleet_resume_node")
        return ResumeNodeResult(node=inp.node, resumed=True, verified_at=datetime.now(UTC))

    @activity.defn(name="slurm_node_check_run")
    async def run(self, inp: NodeCheckRunInput) -> NodeCheckRunResult:
        self.calls.append("slurm_node_check_run")
        self.runs.append(inp)
        return NodeCheckRunResult(
            node=inp.node, outcome=self.outcome, detail="check job 77: rank 1 gloo-all-reduce: timed out", job_id=77,
            reservation=f"rebound-check-{inp.node}",
        )  # fmt: skip

    @activity.defn(name="slurm_node_check_release")
    async def release(self, inp: NodeCheckReleaseInput) -> NodeCheckReleaseResult:
        self.calls.append("slurm_node_check_release")
        self.releases.append(inp)
        return NodeCheckReleaseResult(node=inp.node, drained=bool(inp.drain_reason), current_reason=inp.drain_reason)


async def _run(
    client: Client, task_queue: str, outcome: CheckOutcome, check: NodeCheckPolicy
) -> tuple[Fakes, NodeRecord]:
    node = f"nc{uuid.uuid4().hex[:8]}"
    fakes = Fakes(node, outcome)
    cluster = f"nc{uuid.uuid4().hex[:6]}"
    drained = NodeRecord(
        node=node, state=NodeLifecycle.DRAINED, drained_at=datetime.now(UTC) - timedelta(minutes=5), drain_reason=OURS
    )
    policy = FleetPolicy(mode=FleetMode.ACT, health_check_after_s=0, node_check=check)
    carried = FleetState(cluster=cluster, mode=FleetMode.ACT, nodes={node: drained})
    central = Worker(
        client, task_queue=task_queue, workflows=[FleetWorkflow],
        activities=[fakes.view, fakes.resume, fakes.run, fakes.release, fakes.dcgm],
    )  # fmt: skip
    agent = Worker(client, task_queue=node_task_queue(node), activities=[fakes.gpu_read])
    async with central, agent:
        handle = await client.start_workflow(
            FleetWorkflow.run,
            FleetInput(cluster=cluster, policy=policy, carried=carried),
            id=f"rebound/{cluster}/fleet",
            task_queue=task_queue,
        )
        record = drained
        for _ in range(100):
            record = (await handle.query(FleetWorkflow.status)).state.nodes[node]
            if record.state not in (NodeLifecycle.DRAINED, NodeLifecycle.CHECKING):
                break
            await asyncio.sleep(0.1)
        await handle.terminate("test over")
    return fakes, record


async def test_a_failed_check_holds_the_node_drained_again_with_the_job_in_its_reason(
    temporal_client: Client, task_queue: str
) -> None:
    fakes, record = await _run(temporal_client, task_queue, CheckOutcome.FAILED, NodeCheckPolicy(timeout_s=30, ranks=2))
    assert fakes.calls == ["node_health_check", "slurm_node_check_run", "slurm_node_check_release"], fakes.calls
    assert fakes.runs[0].drain_reason == OURS and fakes.runs[0].timeout_s == 30 and fakes.runs[0].ranks == 2
    assert record.state is NodeLifecycle.HELD and "check job 77" in record.reason, record
    assert fakes.releases[0].drain_reason.startswith("rebound: held for repair: node check job 77 failed")
    assert record.drain_reason == fakes.releases[0].drain_reason


async def test_a_passed_check_returns_the_node_through_the_release(temporal_client: Client, task_queue: str) -> None:
    fakes, record = await _run(temporal_client, task_queue, CheckOutcome.PASSED, NodeCheckPolicy())
    assert fakes.calls == ["node_health_check", "slurm_node_check_run", "slurm_node_check_release"], fakes.calls
    assert fakes.releases[0].drain_reason == "" and record.state is NodeLifecycle.HEALTHY, record


@pytest.mark.parametrize("check", [NodeCheckPolicy(enabled=False)])
async def test_without_the_check_the_gpu_read_alone_resumes_the_node(
    temporal_client: Client, task_queue: str, check: NodeCheckPolicy
) -> None:
    fakes, record = await _run(temporal_client, task_queue, CheckOutcome.PASSED, check)
    assert fakes.calls == ["node_health_check", "fleet_view", "fleet_resume_node"], fakes.calls
    assert record.state is NodeLifecycle.HEALTHY
