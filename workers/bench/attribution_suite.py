"""The attribution suite (``tests/data/attribution/``, README there): one directory per scenario, read and turned
into the facts the live attribution activity would gather.

Each directory holds the recorded logs of one failed job (one file per rank plus the batch log, or whatever the job
wrote) and a ``scenario.json``::

    {"id": "<the directory's name>", "title": "...", "source": "constructed" | "lab",
     "job_id": 4242, "job_nodes": ["n1", "n2", "n3", "n4"], "task_count": 16, "layout": "block" | "cyclic",
     "launcher": "srun" | "torchrun", "world_size": 16, "rank_facts": "step-layout" | "processes" | "none",
     "logs": ["job-%j-rank-%t.log", "job-%j-batch.log"],
     "window_start": "2026-12-03T09:14:07Z",
     "gpu_events": [{"kind": "xid", "host": "n2", "index": 3, "xid": 79}],
     "nodes": {"n3": {"state": "down", "flags": ["NOT_RESPONDING"]}},
     "truth": {"culprit_nodes": ["n3"], "failure_class": "infrastructure", "retryable": true, "why": "..."},
     "notes": "..."}

``logs`` are srun-style patterns relative to the scenario's directory (``%j`` is ``job_id``; ``%t`` and ``%N``
name the rank and node, as in the live spec). ``window_start`` (optional) is where the live detector's offsets
stood when it raised the anomaly: lines from the first one stamped at or after it are what the attribution
activity read in its settle window (they decide which ranks went silent); without it every line is such a line.
``launcher``, ``world_size`` and ``rank_facts`` say how the ranks were started and what the live attribution
would have known of their nodes (``rank_facts``: the RankMap built by ``workflows.policy.rank_map``).
``nodes`` are the scheduler's node states as the activity's last read saw them (a job node not listed is
``allocated`` and responding); ``gpu_events`` are what the job nodes' agents reported in the window. Every job
node not in ``culprit_nodes`` is healthy; an empty ``culprit_nodes`` says no node is at fault.

The facts are built by the activity's own functions (``build_facts``), never a copy of them. Everything here reads
only the suite's files.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from activities.logs.attribution import LogEvidence
from activities.logs.crash import scan, to_findings
from activities.logs.job_watcher import unresponsive
from activities.logs.line import LogLine
from activities.logs.patterns import expand_patterns
from activities.logs.tail import LogTail
from workflows.domain.base import Frozen
from workflows.domain.gpu import GpuEvent
from workflows.domain.incident import ActionRung, FailureClass
from workflows.domain.procs import NodeProcessesResult, RankProcess
from workflows.domain.ranks import RankMap, StepLayout
from workflows.domain.slurm import ClusterSnapshot, NodeBaseState, SlurmNode
from workflows.policy.attribution import AttributionFacts, block_rank_layout
from workflows.policy.rank_map import build_rank_map, step_layout_map

__all__ = [
    "SCENARIO_FILE",
    "GroundTruth",
    "LoadedScenario",
    "NodeFacts",
    "Scenario",
    "SuiteError",
    "build_facts",
    "load_scenario",
    "load_suite",
    "read_lines",
    "true_layout",
]

SCENARIO_FILE = "scenario.json"
# A generous bound on one scenario's log lines: a suite file that grew by mistake is an error, not a slow bench.
_MAX_LINES = 200_000


class SuiteError(ValueError):
    """A suite or scenario that cannot be scored: names the file and what is wrong."""


class GroundTruth(Frozen):
    """What really went wrong: the nodes at fault (empty when none is), the class, whether a restart can help."""

    culprit_nodes: tuple[str, ...] = ()
    failure_class: FailureClass
    retryable: bool
    why: str = ""
    """One or two sentences: the story of the failure, and why the label is what it is."""
    action: ActionRung | None = None
    """The strongest action the scenario's evidence allows (``workflows.policy.action_ladder``): ``drain`` only
    with node-level evidence about a culprit; None: not scored."""


class NodeFacts(Frozen):
    """One node as the scheduler showed it to the attribution activity (after its corroboration wait)."""

    state: NodeBaseState = NodeBaseState.ALLOCATED
    flags: tuple[str, ...] = ()
    """Upper-case flags, e.g. ``NOT_RESPONDING``."""


class Scenario(Frozen):
    """One recorded failure with its ground truth (the module docstring describes each field)."""

    id: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str = Field(min_length=1)
    source: Literal["constructed", "lab"]
    job_id: int = Field(ge=1)
    job_nodes: tuple[str, ...] = Field(min_length=1)
    task_count: int = Field(ge=1, le=100_000)
    layout: Literal["block", "cyclic"] = "block"
    launcher: Literal["srun", "torchrun"] = "srun"
    """``srun``: one Slurm task per rank; ``torchrun``: one task per node (``task_count`` of them), whose
    ``world_size`` ranks torchrun spawns, ``world_size / nodes`` per node, block-wise."""
    world_size: int | None = Field(None, ge=1, le=100_000)
    """torchrun's rank count; None: ``task_count``."""
    rank_facts: Literal["step-layout", "processes", "none"] = "step-layout"
    """What the live activity would know of rank -> node: srun's step layout (``layout`` over ``task_count``
    tasks), the node agents' view of every rank's process, or nothing."""
    logs: tuple[str, ...] = Field(min_length=1)
    window_start: datetime | None = None
    gpu_events: tuple[GpuEvent, ...] = ()
    nodes: dict[str, NodeFacts] = Field(default_factory=dict)
    truth: GroundTruth
    notes: str = ""

    @field_validator("logs")
    @classmethod
    def _relative(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for p in patterns:
            path = PurePosixPath(p)
            if not p or path.is_absolute() or ".." in path.parts:
                raise ValueError(f"log pattern {p!r} must be relative to the scenario directory, without '..'")
        return patterns

    @field_validator("window_start")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        # Log times are aware (UTC when a line names no zone); so is the window, or comparing them would raise.
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        nodes = set(self.job_nodes)
        if len(nodes) != len(self.job_nodes):
            raise ValueError(f"job_nodes repeat a node: {list(self.job_nodes)}")
        if self.task_count < len(self.job_nodes):
            raise ValueError(f"task_count {self.task_count} is below the {len(self.job_nodes)} job nodes")
        if stray := sorted(set(self.truth.culprit_nodes) - nodes):
            raise ValueError(f"truth.culprit_nodes {stray} are not job nodes")
        if stray := sorted(set(self.nodes) - nodes):
            raise ValueError(f"nodes {stray} are not job nodes (only the job's nodes are read)")
        return self

    @property
    def healthy_nodes(self) -> tuple[str, ...]:
        """Every job node that is not a culprit."""
        return tuple(n for n in self.job_nodes if n not in self.truth.culprit_nodes)


@dataclass(frozen=True)
class LoadedScenario:
    """A validated scenario and the directory its logs are in."""

    scenario: Scenario
    directory: Path

    @property
    def patterns(self) -> list[str]:
        """The log patterns, ``%j`` filled in and made absolute, as the live spec names them."""
        return [str(self.directory / p) for p in expand_patterns(self.scenario.logs, self.scenario.job_id)]


# ----- loading ----------------------------------------------------------------------------------------------------


def load_scenario(directory: Path) -> LoadedScenario:
    """Read and validate one scenario directory.

    Raises:
        SuiteError: ``scenario.json`` is missing, unreadable or invalid (the message names the field), its id is
            not the directory's name, or a log pattern matches no file.
    """
    path = directory / SCENARIO_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SuiteError(f"{path}: cannot read the scenario: {e}") from e
    try:
        scenario = Scenario.model_validate_json(text)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'file'}: {err['msg']}" for err in e.errors())
        raise SuiteError(f"{path}: invalid scenario: {problems}") from e
    if scenario.id != directory.name:
        raise SuiteError(f"{path}: id {scenario.id!r} is not the directory's name {directory.name!r}")
    loaded = LoadedScenario(scenario, directory)
    for source, pattern in zip(scenario.logs, loaded.patterns, strict=True):
        if not LogTail([pattern]).paths():
            raise SuiteError(f"{path}: log pattern {source!r} matches no file in {directory}")
    return loaded


def load_suite(root: Path) -> list[LoadedScenario]:
    """Every scenario under ``root`` (its subdirectories holding a ``scenario.json``), sorted by id.

    Raises:
        SuiteError: ``root`` is not a directory, holds no scenario, or a scenario is invalid (``load_scenario``).
    """
    if not root.is_dir():
        raise SuiteError(f"{root}: not a directory of scenarios")
    found = [load_scenario(d) for d in sorted(root.iterdir()) if d.is_dir() and (d / SCENARIO_FILE).is_file()]
    if not found:
        raise SuiteError(f"{root}: no scenario (a subdirectory holding {SCENARIO_FILE})")
    return found


# ----- the facts, as the live activity builds them ----------------------------------------------------------------


def read_lines(loaded: LoadedScenario) -> list[LogLine]:
    """Every complete line of the scenario's logs, in the order the live tail returns them (by path, then offset).

    Raises:
        SuiteError: The logs hold more than a bench scenario should (``_MAX_LINES``).
    """
    tail = LogTail(loaded.patterns)
    offsets: dict[str, int] = {}
    lines: list[LogLine] = []
    while True:
        new, offsets = tail.read_new(offsets)
        if not new:
            return lines
        lines += new
        if len(lines) > _MAX_LINES:
            raise SuiteError(f"{loaded.directory}: more than {_MAX_LINES} log lines")


def _split_at_window(lines: Sequence[LogLine], start: datetime | None) -> tuple[list[LogLine], list[LogLine]]:
    """(what the detector had read when it raised the anomaly, what attribution read after), per file.

    A file's split is its first line stamped at or after ``start``: unstamped lines (traceback lines) stay with
    the stamped line before them, as they were written together.
    """
    if start is None:
        return [], list(lines)
    cut: dict[str, int] = {}
    for line in lines:
        if line.path not in cut and line.at is not None and line.at >= start:
            cut[line.path] = line.offset
    before = [ln for ln in lines if ln.offset < cut.get(ln.path, sys.maxsize)]
    after = [ln for ln in lines if ln.offset >= cut.get(ln.path, sys.maxsize)]
    return before, after


def _snapshot(scenario: Scenario) -> ClusterSnapshot:
    at = scenario.window_start or datetime(1970, 1, 1, tzinfo=UTC)
    facts = {n: scenario.nodes.get(n, NodeFacts()) for n in scenario.job_nodes}
    return ClusterSnapshot(
        observed_at=at, nodes=tuple(SlurmNode(name=n, state=f.state, flags=f.flags) for n, f in facts.items())
    )


def build_facts(loaded: LoadedScenario, lines: Sequence[LogLine] | None = None) -> AttributionFacts:
    """The facts ``activities.logs.attribution`` would hand to ``attribute`` for this scenario, built by its own parts.

    The detector's findings first (the watch's ``scan`` of what it read before the anomaly: all it knows of the
    ranks before the window), then what the activity's ``LogEvidence`` makes of the settle window's lines; the node
    states as the activity's last read saw them (``unresponsive``), the facts by ``AttributionFacts.from_findings``.
    """
    scenario = loaded.scenario
    before, after = _split_at_window(read_lines(loaded) if lines is None else lines, scenario.window_start)
    evidence = LogEvidence(to_findings(scan(before)))
    evidence.read(after)
    nodes = scenario.job_nodes
    return AttributionFacts.from_findings(
        nodes,
        evidence.findings,
        ranks=rank_facts(scenario),
        ranks_logging=evidence.ranks_logging,
        gpu_events=scenario.gpu_events,
        unresponsive_nodes=unresponsive(_snapshot(scenario), nodes),
    )


def true_layout(scenario: Scenario) -> dict[int, str]:
    """Rank -> node as the job really ran (srun's ``--distribution`` block or cyclic over the job's nodes; a
    torchrun job's ranks block-wise over its nodes)."""
    if scenario.launcher == "torchrun":
        return block_rank_layout(scenario.job_nodes, scenario.world_size or scenario.task_count)
    if scenario.layout == "block":
        return block_rank_layout(scenario.job_nodes, scenario.task_count)
    nodes = scenario.job_nodes
    return {rank: nodes[rank % len(nodes)] for rank in range(scenario.task_count)}


def rank_facts(scenario: Scenario) -> RankMap | None:
    """The rank map the live attribution would have had (``Scenario.rank_facts``), built by the live policy."""
    if scenario.rank_facts == "none":
        return None
    nodes = scenario.job_nodes
    if scenario.rank_facts == "step-layout":
        base, extra = divmod(scenario.task_count, len(nodes))
        per_node = tuple(base + (1 if i < extra else 0) for i in range(len(nodes)))
        layout = StepLayout(nodes=nodes, tasks_per_node=per_node, distribution=scenario.layout)
        return step_layout_map(layout, tasks_are_ranks=scenario.launcher == "srun")
    per_node_launcher = scenario.launcher == "torchrun"
    answers = [
        NodeProcessesResult(
            node=node,
            observed_at=scenario.window_start or datetime(2026, 1, 1, tzinfo=UTC),
            processes=tuple(
                RankProcess(
                    pid=10_000 + rank,
                    rank=rank,
                    job_id=scenario.job_id,
                    node=node,
                    state="S",
                    rank_source="RANK" if per_node_launcher else "SLURM_PROCID",
                    task=nodes.index(node) if per_node_launcher else rank,
                )
                for rank, n in sorted(true_layout(scenario).items())
                if n == node
            ),
        )
        for node in nodes
    ]
    return build_rank_map(answers, job_nodes=nodes)
