"""Which node each rank (and each Slurm task) of a job ran on, and how that is known: ``RankMap``.

Built from facts only (``workflows.policy.rank_map``): the node agents' view of the job's processes, the step
layout Slurm reports when it is unambiguous, and log lines that name a rank and its node. A rank the facts do not
place is *unknown*, with the reason; attribution never implicates a node on a guess.

Ranks and Slurm tasks are different things: under srun one task per rank they are equal; under torchrun (one srun
task per node, the ranks spawned by torchrun) a task is a node's launcher and its ranks are torchrun's. An srun
``--label`` names a task, so the map places tasks as well as ranks.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from workflows.domain.base import Frozen

__all__ = ["MAX_RANK_SPANS", "Launcher", "RankMap", "RankSource", "RankSpan", "StepLayout"]

#: Spans kept per map (ranks and tasks each): contiguous ranks on one node are one span, so a block or torchrun
#: layout of any size is one span per node; a map of scattered ranks is cut here, and the rest is unknown.
MAX_RANK_SPANS = 512


class RankSource(StrEnum):
    """How a rank's node is known, strongest first."""

    PROCESS = "process"
    """A node agent saw the rank's process there (``/proc/<pid>/environ``: RANK or SLURM_PROCID, SLURMD_NODENAME)."""
    LAUNCHER_GROUP = "launcher-group"
    """A sibling's environment on that node names the rank's group: torchrun gives each node's agent the ranks
    ``RANK - LOCAL_RANK`` up to ``+ LOCAL_WORLD_SIZE``, so a rank that died before it was seen is still placed."""
    STEP_LAYOUT = "step-layout"
    """Slurm's layout of the step's tasks (srun one task per rank, block or cyclic distribution)."""
    EVIDENCE = "evidence"
    """A log line names both (``n3: task 6: ...``, ``%N`` in the file's name, a host prefix)."""


class Launcher(StrEnum):
    """Who started the ranks, as the facts tell."""

    SRUN = "srun"
    """One Slurm task per rank (srun per rank, PyTorch Lightning's Slurm environment): task id == rank."""
    PER_NODE = "per-node"
    """A launcher per node starts the ranks (torchrun/torch elastic, accelerate, the DeepSpeed launcher): the
    ranks come from ``RANK``, and a Slurm task is a node's launcher, not a rank."""
    UNKNOWN = "unknown"


class StepLayout(Frozen):
    """How Slurm laid out a step's tasks: ``SLURM_STEP_NODELIST``, ``SLURM_STEP_TASKS_PER_NODE`` and
    ``SLURM_DISTRIBUTION`` as srun gives them to every task."""

    nodes: tuple[str, ...]
    """The step's nodes in Slurm's order (the expanded hostlist)."""
    tasks_per_node: tuple[int, ...]
    """Tasks on each of ``nodes``, in the same order."""
    distribution: str = ""
    """The task distribution over nodes (``block``, ``cyclic``, ``arbitrary``, ``plane=4``...); empty when srun
    did not say (its default is block)."""


class RankSpan(Frozen):
    """Ranks (or tasks) ``first``..``last`` ran on ``node``, as ``source`` says."""

    first: int = Field(ge=0)
    last: int = Field(ge=0)
    node: str = Field(min_length=1)
    source: RankSource


class RankMap(Frozen):
    """Rank -> node and Slurm task -> node, each entry with its source; ``unknown`` says why the rest is unknown."""

    launcher: Launcher = Launcher.UNKNOWN
    ranks: tuple[RankSpan, ...] = Field((), max_length=MAX_RANK_SPANS)
    tasks: tuple[RankSpan, ...] = Field((), max_length=MAX_RANK_SPANS)
    world_size: int | None = None
    """The number of ranks, when a process's ``WORLD_SIZE`` (or Slurm's task count under srun per rank) says."""
    unknown: str = "no process view, no step layout"
    """Why a rank the map does not place is unknown (shown as ``rank R: node unknown (<why>)``)."""
    notes: tuple[str, ...] = Field((), max_length=20)
    """What the builder passed over: conflicting reports, a cut map, an unreadable agent."""
    observed_at: datetime | None = None
    """When the process view was taken; None when none was."""

    def node_of_rank(self, rank: int) -> str | None:
        """The node rank ``rank`` ran on, or None when the facts do not say."""
        return _find(self.ranks, rank)

    def node_of_task(self, task: int) -> str | None:
        """The node Slurm task ``task`` ran on (an srun label names a task), or None when the facts do not say."""
        return _find(self.tasks, task)

    def source_of_rank(self, rank: int) -> RankSource | None:
        """How the node of ``rank`` is known, or None when it is not."""
        return next((s.source for s in self.ranks if s.first <= rank <= s.last), None)

    @property
    def tasks_are_ranks(self) -> bool:
        """True only when the facts say the job runs one Slurm task per rank."""
        return self.launcher is Launcher.SRUN

    @property
    def is_empty(self) -> bool:
        return not self.ranks and not self.tasks

    def rank_nodes(self) -> dict[int, str]:
        """Every placed rank -> its node (bounded by the spans, each at most ``world_size`` or 100 000 ranks)."""
        out: dict[int, str] = {}
        for span in self.ranks:
            for rank in range(span.first, min(span.last, span.first + 100_000) + 1):
                out.setdefault(rank, span.node)
        return out


def _find(spans: tuple[RankSpan, ...], number: int) -> str | None:
    return next((s.node for s in spans if s.first <= number <= s.last), None)
