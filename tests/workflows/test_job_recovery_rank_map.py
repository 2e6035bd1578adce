"""JobRecovery places a torchrun job's ranks from the node agents' view of its processes (issue 11): the look is
taken while the attempt runs, kept in the state, and the attribution blames the node the failing rank really ran on,
not the one srun's task layout would name."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path

import pytest_asyncio
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from tests.workflows.test_job_recovery import Handle, Harness, _actions, until
from workflows.constants import node_task_queue
from workflows.domain.incident import ActionKind
from workflows.domain.procs import NodeProcessesInput, NodeProcessesResult, RankProcess
from workflows.domain.recovery import DetectionPolicy, JobRecoveryInput, RecoverySpec, RecoveryState
from workflows.job_recovery import JobRecoveryWorkflow


class FakeAgents:
    """One node agent per node answering ``node_rank_processes`` from ``alive`` (rank -> node): torchrun under
    srun, ``nproc`` workers per node, each with RANK, LOCAL_RANK, LOCAL_WORLD_SIZE and its node's SLURM_PROCID."""

    def __init__(self, nodes: list[str], nproc: int) -> None:
        self.nodes, self.nproc = nodes, nproc
        self.alive = {r: nodes[r // nproc] for r in range(len(nodes) * nproc)}
        self.asked = 0

    def activity_for(self, node: str) -> Callable[[NodeProcessesInput], Awaitable[NodeProcessesResult]]:
        @activity.defn(name="node_rank_processes")
        async def rank_processes(params: NodeProcessesInput) -> NodeProcessesResult:
            self.asked += 1
            procs = tuple(
                RankProcess(
                    pid=1000 + r,
                    rank=r,
                    job_id=params.job_id,
                    node=node,
                    state="S",
                    rank_source="RANK",
                    local_rank=r % self.nproc,
                    local_world_size=self.nproc,
                    world_size=len(self.nodes) * self.nproc,
                    task=self.nodes.index(node),
                )
                for r, n in sorted(self.alive.items())
                if n == node
            )
            return NodeProcessesResult(node=node, observed_at=datetime.now(UTC), processes=procs)

        return rank_processes


@pytest_asyncio.fixture
async def world(temporal_client: Client, task_queue: str, tmp_path: Path) -> AsyncIterator[tuple[Harness, FakeAgents]]:
    h = Harness(temporal_client, task_queue, tmp_path)
    agents = FakeAgents(h.nodes[:2], 2)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(h.worker())
        for node in agents.nodes:
            worker = Worker(temporal_client, task_queue=node_task_queue(node), activities=[agents.activity_for(node)])
            await stack.enter_async_context(worker)
        yield h, agents


async def test_torchrun_rank_1_is_blamed_on_its_own_node(world: tuple[Harness, FakeAgents]) -> None:
    h, agents = world
    job = h.sched.submit(agents.nodes)  # one Slurm task per node: srun's layout would put "rank 1" on the 2nd node
    spec = RecoverySpec(logs=(str(h.tmp / "slurm-%j.out"),))
    handle: Handle = await h.client.start_workflow(
        JobRecoveryWorkflow.run,
        JobRecoveryInput(
            cluster=h.cluster,
            job_id=job.job_id,
            poll_interval_s=0.1,
            spec=spec,
            detection=DetectionPolicy(rank_map_after_s=0.2),
        ),
        id=f"rebound/test/job/{job.job_id}/{uuid.uuid4().hex}",
        task_queue=h.task_queue,
    )
    await until(handle, lambda s: any(e.event == "RANKS" for e in s.timeline))
    # Rank 1 (the first node's second worker) dies of a CUDA error; its process is gone before attribution asks.
    del agents.alive[1]
    with (h.tmp / f"slurm-{job.job_id}.out").open("a") as f:
        f.write("[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    h.sched.fail_job(job.job_id, exit_code=1)

    st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING)
    # A CUDA error the job printed is the job's word, not node evidence: its node is kept out of the job's next
    # placement (the action ladder), never drained, and it is the rank's own node, not the task layout's.
    assert _actions(st, ActionKind.DRAIN) == []
    inc = st.incidents[0]
    assert inc.attribution is not None and inc.attribution.implicated_nodes == (agents.nodes[0],)
    assert inc.attribution.action == "exclude"
    assert agents.nodes[0] in h.sched.jobs[job.job_id].excluded_nodes
    assert agents.nodes[1] not in h.sched.jobs[job.job_id].excluded_nodes
    assert agents.asked >= 4  # one look while running, one at attribution, on each node
    ranks_entry = next(e for e in st.timeline if e.event == "RANKS")
    a, b = agents.nodes
    assert ranks_entry.detail == f"4 rank(s) placed on 2 node(s), launcher per-node: 0-1@{a} 2-3@{b}"
