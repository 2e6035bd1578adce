"""The facts one attribution decides over (``AttributionFacts``), built the same way by every caller: the live
``attribute_failure`` activity, ``rebound bench attribution`` and ``rebound diagnose`` (``from_findings``). Pure.

The rules over these facts are ``workflows.policy.attribution``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from workflows.domain.findings import FindingKind
from workflows.domain.gpu import GpuEvent, NodeGpuVerdict
from workflows.domain.hang import HangVerdict
from workflows.domain.incident import LogFinding
from workflows.domain.procs import RankProcess
from workflows.domain.ranks import RankMap
from workflows.policy.rank_map import with_evidence

__all__ = ["AttributionFacts", "block_rank_layout"]


@dataclass(frozen=True)
class AttributionFacts:
    """Everything gathered about one failure."""

    job_nodes: tuple[str, ...]
    rank_nodes: Mapping[int, str]
    """Every rank the facts place (``RankMap.rank_nodes``)."""
    findings: Sequence[LogFinding] = ()
    gpu_events: Sequence[GpuEvent] = ()
    gpu_verdicts: Sequence[NodeGpuVerdict] = ()
    """Merged NVML + DCGM verdicts of job nodes read now (only nodes with a DCGM exporter)."""
    unresponsive_nodes: Sequence[str] = ()
    """Job nodes the scheduler shows DOWN or NOT_RESPONDING."""
    node_failure_nodes: Sequence[str] = ()
    """Nodes the scheduler or srun reported as failed for this job."""
    ranks_logging: Sequence[int] = field(default_factory=tuple)
    """Ranks that wrote any output in the failure window (to find ranks that went silent)."""
    hang: HangVerdict | None = None
    odd_ranks: Sequence[int] = ()
    processes: Sequence[RankProcess] = ()
    stack_summary: str = ""
    ranks: RankMap = field(default_factory=RankMap)
    """Rank -> node and task -> node, with why the rest is unknown."""

    @classmethod
    def from_findings(
        cls,
        job_nodes: Sequence[str],
        findings: Sequence[LogFinding],
        *,
        ranks: RankMap | None = None,
        ranks_logging: Iterable[int] = (),
        gpu_events: Sequence[GpuEvent] = (),
        gpu_verdicts: Sequence[NodeGpuVerdict] = (),
        unresponsive_nodes: Sequence[str] = (),
        hang: HangVerdict | None = None,
        odd_ranks: Sequence[int] = (),
        processes: Sequence[RankProcess] = (),
        stack_summary: str = "",
    ) -> AttributionFacts:
        """The facts of one failure around what its logs said: rank -> node from ``ranks`` (the facts gathered
        about the job: its processes, srun's layout) and what the findings name (``with_evidence``), and the nodes
        the findings report failed. The live activity, the attribution bench and ``rebound diagnose`` (no map) all
        build their facts here."""
        nodes = tuple(job_nodes)
        placed = with_evidence(ranks, findings, nodes)
        return cls(
            job_nodes=nodes,
            rank_nodes=placed.rank_nodes(),
            ranks=placed,
            findings=findings,
            gpu_events=gpu_events,
            gpu_verdicts=gpu_verdicts,
            unresponsive_nodes=unresponsive_nodes,
            node_failure_nodes=[f.node for f in findings if f.kind is FindingKind.NODE_FAILURE and f.node],
            ranks_logging=sorted(ranks_logging),
            hang=hang,
            odd_ranks=odd_ranks,
            processes=processes,
            stack_summary=stack_summary,
        )


def block_rank_layout(nodes: Sequence[str], task_count: int) -> dict[int, str]:
    """Rank -> node for srun's default block distribution (first nodes get the extra tasks).

    A layout, not a fact: right only for srun one task per rank without ``--distribution`` (a torchrun job's
    tasks are its nodes' launchers). Attribution places ranks with a ``RankMap`` instead.
    """
    if not nodes or task_count <= 0:
        return {}
    base, extra = divmod(task_count, len(nodes))
    layout: dict[int, str] = {}
    rank = 0
    for i, node in enumerate(nodes):
        for _ in range(base + (1 if i < extra else 0)):
            layout[rank] = node
            rank += 1
    return layout
