"""The Fleet's health check of a node it drained, where the node has a DCGM exporter: the agent's NVML read passes,
DCGM's reading (a failed GPU, or no reading at all) fails the check and the node is held, naming DCGM; fake
activities registered by name (``tests/workflows/test_fleet_node_check.py``'s)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from tests.workflows.test_fleet_node_check import OURS, Fakes
from workflows.constants import node_task_queue
from workflows.domain.fleet import FleetInput, FleetMode, FleetPolicy, FleetState, NodeLifecycle, NodeRecord
from workflows.domain.gpu import GpuHealthReport, GpuSample, NodeHealthCheckInput, NodeHealthCheckResult, XidCatalog
from workflows.domain.gpu_sources import DcgmNodeRead, DcgmReadInput, DcgmReadResult
from workflows.domain.node_check import CheckOutcome, NodeCheckPolicy
from workflows.fleet import FleetWorkflow
from workflows.policy.gpu_health import gpu_health_verdict


class DcgmFakes(Fakes):
    """The node's agent reads 2 healthy GPUs; its DCGM exporter shows ``dcgm_samples`` (or could not be read)."""

    def __init__(self, node: str, dcgm_samples: tuple[GpuSample, ...], error: str = "") -> None:
        super().__init__(node, CheckOutcome.PASSED)
        self.dcgm_samples, self.error = dcgm_samples, error

    @activity.defn(name="node_health_check")
    async def gpu_read(self, inp: NodeHealthCheckInput) -> NodeHealthCheckResult:
        self.calls.append("node_health_check")
        samples = tuple(GpuSample(host=self.node, index=i, uuid=f"GPU-{i}") for i in (0, 1))
        verdict = gpu_health_verdict(self.node, samples, catalog=XidCatalog(), source="nvml")
        return NodeHealthCheckResult(node=self.node, healthy=True, verdict=verdict, detail="2 GPU(s) healthy")

    @activity.defn(name="dcgm_read_gpus")
    async def dcgm(self, inp: DcgmReadInput) -> DcgmReadResult:  # type: ignore[override]
        self.calls.append("dcgm_read_gpus")
        report = GpuHealthReport(host=self.node, samples=self.dcgm_samples, error=self.error)
        verdict = gpu_health_verdict(
            self.node, self.dcgm_samples, catalog=XidCatalog(), source="dcgm", source_error=self.error
        )
        read = DcgmNodeRead(
            node=self.node, configured=True, url="http://x:9400/metrics", report=report, verdict=verdict
        )
        return DcgmReadResult(nodes=(read,))


async def _held(client: Client, task_queue: str, fakes: DcgmFakes) -> NodeRecord:
    node, cluster = fakes.node, f"dc{uuid.uuid4().hex[:6]}"
    drained = NodeRecord(
        node=node, state=NodeLifecycle.DRAINED, drained_at=datetime.now(UTC) - timedelta(minutes=5), drain_reason=OURS
    )
    policy = FleetPolicy(mode=FleetMode.ACT, health_check_after_s=0, node_check=NodeCheckPolicy())
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
    return record


def _gpus(**gpu1: object) -> tuple[GpuSample, ...]:
    return (GpuSample(host="x", index=0, uuid="GPU-0"), GpuSample(host="x", index=1, uuid="GPU-1", **gpu1))


async def test_a_gpu_dcgm_fails_holds_the_node_though_nvml_passes(temporal_client: Client, task_queue: str) -> None:
    fakes = DcgmFakes(f"dc{uuid.uuid4().hex[:8]}", _gpus(remap_failure=True))
    record = await _held(temporal_client, task_queue, fakes)
    # The failed check is recorded against a fresh view; no check job runs and nothing is resumed.
    assert fakes.calls == ["node_health_check", "dcgm_read_gpus", "fleet_view"], fakes.calls
    assert record.state is NodeLifecycle.HELD, record
    assert "GPU 1: dcgm: remap_failure=True" in record.reason, record.reason
    assert "fail: GPU 1: dcgm: remap_failure=True" in record.checks[-1]


async def test_an_exporter_that_cannot_be_read_holds_the_node(temporal_client: Client, task_queue: str) -> None:
    fakes = DcgmFakes(f"dc{uuid.uuid4().hex[:8]}", (), error="DCGM exporter http://x:9400/metrics: HTTP 503")
    record = await _held(temporal_client, task_queue, fakes)
    assert record.state is NodeLifecycle.HELD and "dcgm: no GPU data: DCGM exporter" in record.reason, record


async def test_a_healthy_dcgm_reading_lets_the_check_job_run(temporal_client: Client, task_queue: str) -> None:
    fakes = DcgmFakes(f"dc{uuid.uuid4().hex[:8]}", _gpus())
    record = await _held(temporal_client, task_queue, fakes)
    assert fakes.calls[:3] == ["node_health_check", "dcgm_read_gpus", "slurm_node_check_run"], fakes.calls
    assert record.state is NodeLifecycle.HEALTHY, record
