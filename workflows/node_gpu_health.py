"""NodeGpuHealth: read one node's GPUs through its node agent (``rebound gpus NODE``, and a building block for
attribution). An agent that does not answer is reported as data, not as a failed workflow."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.gpu.activities import GpuActivities
    from workflows.constants import NODE_GPU_HEALTH_WORKFLOW, node_task_queue
    from workflows.domain.gpu import NodeGpuHealthInput, NodeGpuHealthResult, NvmlReadGpuHealthInput
    from workflows.options import NODE_AGENT_READ


@workflow.defn(name=NODE_GPU_HEALTH_WORKFLOW)
class NodeGpuHealthWorkflow:
    """One GPU health read on one node's agent."""

    @workflow.run
    async def run(self, inp: NodeGpuHealthInput) -> NodeGpuHealthResult:
        try:
            report = await workflow.execute_activity_method(
                GpuActivities.read_gpu_health,
                NvmlReadGpuHealthInput(event_cursor=inp.event_cursor),
                task_queue=node_task_queue(inp.node),
                summary=f"Read the GPUs of node {inp.node}",
                **NODE_AGENT_READ,
            )
        except ActivityError as e:
            if isinstance(e.cause, TimeoutError):
                return NodeGpuHealthResult(
                    node=inp.node, agent_reachable=False, error=f"node agent on {inp.node} did not answer ({e.cause})"
                )
            raise
        return NodeGpuHealthResult(node=inp.node, agent_reachable=True, report=report)
