"""Evidence JobRecovery gathers: GPU reads, which rank runs on which node (``rank_map``) and a hung job's processes
and stacks from the nodes' agents, and the attribution that weighs it.

Called from the workflow (these start activities on each node's own task queue). A node whose agent does not
answer is no evidence either way: it is noted and skipped, never a reason to fail or delay the recovery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.gpu.activities import GpuActivities
    from activities.gpu.dcgm_activities import DcgmActivities
    from activities.logs.attribution import AttributionActivities
    from activities.procs.activities import ProcsActivities
    from workflows.constants import node_task_queue
    from workflows.domain.gpu import GpuHealthReport, NvmlReadGpuHealthInput
    from workflows.domain.gpu_sources import DcgmReadInput, DcgmReadResult
    from workflows.domain.loop import AttributeInput, AttributeResult
    from workflows.domain.procs import (
        NodeProcessesInput,
        NodeProcessesResult,
        RankProcess,
        RankStack,
        StackDumpInput,
        StackDumpResult,
    )
    from workflows.domain.ranks import RankMap
    from workflows.options import ATTRIBUTE, DCGM_READ, NODE_AGENT_EVIDENCE, NODE_AGENT_QUICK_READ
    from workflows.policy.rank_map import build_rank_map
    from workflows.policy.stacks import describe_stacks, odd_ranks

__all__ = [
    "MAX_STACKS",
    "HangEvidence",
    "attribute",
    "hang_evidence",
    "rank_map",
    "read_all_gpus",
    "read_dcgm",
    "read_gpus",
    "summarise_hang_evidence",
]

#: Stacks and processes kept with a hang incident (the rest are summarised in its timeline).
MAX_STACKS = 64

#: What one node's agent gave: its ranks' processes and their stack dump (None: it did not answer).
NodeEvidence = tuple[NodeProcessesResult | None, StackDumpResult | None]


@dataclass(frozen=True)
class HangEvidence:
    """A hung job's ranks as their nodes' agents saw them, before the job is killed."""

    stacks: tuple[RankStack, ...]
    processes: tuple[RankProcess, ...]
    odd_ranks: tuple[int, ...]
    """Ranks whose stack differs from the majority's: the likely culprits."""
    detail: str
    """The timeline's summary: how many stacks and processes, the odd ranks, agents that did not answer."""


async def read_gpus(node: str) -> GpuHealthReport | None:
    """One node's GPU samples and events since its agent started; None when the agent does not answer."""
    try:
        return await workflow.execute_activity_method(
            GpuActivities.read_gpu_health,
            NvmlReadGpuHealthInput(event_cursor=0),
            task_queue=node_task_queue(node),
            summary=f"Read GPU events of {node}",
            **NODE_AGENT_QUICK_READ,
        )
    except ActivityError:
        return None  # a dead agent is no evidence either way; the scheduler has its own word on the node


async def read_all_gpus(nodes: Sequence[str]) -> list[GpuHealthReport | None]:
    """Every node's GPU read, concurrently (in the nodes' order)."""
    return list(await asyncio.gather(*(read_gpus(n) for n in nodes)))


async def read_dcgm(nodes: Sequence[str], nvml: Sequence[GpuHealthReport | None] = ()) -> DcgmReadResult | None:
    """The nodes' DCGM exporters read now by the central worker (nodes without one answered ``configured=False``),
    each merged with its NVML read from ``nvml`` where given; None when the read could not be made at all (then
    there is no DCGM evidence, which the caller says; never "healthy")."""
    try:
        result: DcgmReadResult = await workflow.execute_activity_method(
            DcgmActivities.read_gpus,
            DcgmReadInput(nodes=tuple(nodes), nvml=tuple(r for r in nvml if r is not None)),
            summary=f"Read the DCGM exporters of {', '.join(nodes)[:80]}",
            **DCGM_READ,
        )
    except ActivityError:
        return None
    return result


async def hang_evidence(job_id: int, nodes: Sequence[str], timeout_s: float) -> HangEvidence:
    """Every rank's process state and stack, from each node's agent (concurrently across nodes).

    Evidence is worth seconds, not the restart: each dump is bounded by ``timeout_s`` per rank.
    """
    found = await asyncio.gather(*(_node_evidence(job_id, n, timeout_s) for n in nodes))
    return summarise_hang_evidence(nodes, found)


def summarise_hang_evidence(nodes: Sequence[str], found: Sequence[NodeEvidence]) -> HangEvidence:
    """The nodes' answers as one incident's evidence (``MAX_STACKS`` kept, by rank). Pure."""
    processes: list[RankProcess] = []
    stacks: list[RankStack] = []
    notes: list[str] = []
    for node, (procs, dump) in zip(nodes, found, strict=True):
        if procs is not None:
            processes += procs.processes
        if dump is not None:
            stacks += dump.stacks
        if procs is None or dump is None or (dump.error and not dump.stacks):
            notes.append(f"{node}: {dump.error if dump is not None and dump.error else 'agent did not answer'}")
    stacks.sort(key=lambda st: st.rank)
    odd = tuple(odd_ranks(stacks))
    summary = describe_stacks(stacks) if stacks else "no stacks"
    detail = (
        f"{sum(1 for st in stacks if st.text)} stack(s), {len(processes)} process(es); odd rank(s): "
        f"{', '.join(map(str, odd)) or 'none'}; {summary}"[:400]
        + (f"; {'; '.join(notes)}" if notes else "")
    )
    return HangEvidence(
        stacks=tuple(stacks)[:MAX_STACKS],
        processes=tuple(sorted(processes, key=lambda p: p.rank))[:MAX_STACKS],
        odd_ranks=odd,
        detail=detail,
    )


async def rank_map(job_id: int, nodes: Sequence[str]) -> RankMap:
    """Which rank runs where, from every node agent's view of the job's processes (concurrently; a node whose
    agent does not answer places nothing, and the map says so)."""
    answers = await asyncio.gather(*(_node_processes(job_id, n) for n in nodes))
    return build_rank_map(answers, job_nodes=nodes, observed_at=workflow.now())


async def _node_processes(job_id: int, node: str) -> NodeProcessesResult | None:
    """One node's view of the job's rank processes; None when its agent does not answer."""
    try:
        return await workflow.execute_activity_method(
            ProcsActivities.rank_processes,
            NodeProcessesInput(job_id=job_id),
            task_queue=node_task_queue(node),
            summary=f"List job {job_id}'s rank processes on {node}",
            start_to_close_timeout=timedelta(seconds=10),
            **NODE_AGENT_EVIDENCE,
        )
    except ActivityError:
        return None


async def _node_evidence(job_id: int, node: str, timeout_s: float) -> NodeEvidence:
    """One node: its ranks' processes first (fast), then their stacks (py-spy, slower)."""
    procs = await _node_processes(job_id, node)
    try:
        dump = await workflow.execute_activity_method(
            ProcsActivities.dump_stacks,
            StackDumpInput(job_id=job_id, timeout_s=timeout_s),
            task_queue=node_task_queue(node),
            summary=f"Dump the stacks of job {job_id}'s ranks on {node} (py-spy)",
            start_to_close_timeout=timedelta(seconds=4 * timeout_s + 10),
            **NODE_AGENT_EVIDENCE,
        )
    except ActivityError:
        dump = None
    return procs, dump


async def attribute(inp: AttributeInput) -> AttributeResult:
    """Who is to blame: the attribution activity weighs the logs, the scheduler's word and the gathered evidence."""
    return await workflow.execute_activity_method(
        AttributionActivities.attribute_failure,
        inp,
        summary=f"Attribute: {inp.anomaly.summary[:80]}",
        **ATTRIBUTE,
    )
