"""``rebound bench attribution``: does attribution name the right node, and never a healthy one?

The suite (``tests/data/attribution/``, README there) is one directory per scenario: the recorded logs of one
failed job (one file per rank plus the batch log, or whatever the job wrote) and a ``scenario.json``::

    {"id": "<the directory's name>", "title": "...", "source": "constructed" | "lab",
     "job_id": 4242, "job_nodes": ["n1", "n2", "n3", "n4"], "task_count": 16, "layout": "block" | "cyclic",
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
``nodes`` are the scheduler's node states as the activity's last read saw them (a job node not listed is
``allocated`` and responding); ``gpu_events`` are what the job nodes' agents reported in the window. Every job
node not in ``culprit_nodes`` is healthy; an empty ``culprit_nodes`` says no node is at fault.

The facts are built as ``activities.attribution`` builds them, with its own parts: ``LogTail`` over the patterns,
``scan`` and ``to_findings`` for the findings, the srun block layout for rank -> node (whatever the job's real
layout; ``layout`` only lets the report say how many ranks that assumption puts on the wrong node),
``unresponsive`` over a snapshot of ``nodes``, node failures from the findings. Then ``attribute`` decides.

Scores: top-1 node accuracy (the first implicated node is a culprit; with no culprit, correct when no node is
implicated), healthy-node drains (implicated nodes that are not culprits, of an attribution confident enough for the
Fleet to drain without an operator: each would be drained for nothing; less confident ones are reported as held),
failure-class and retryable accuracy. The command exits 1 when top-1 accuracy is below ``TARGET_ACCURACY`` or
any healthy node would be drained, 2 when the suite cannot be read. Everything here but the command is pure or
reads only the suite's files.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from activities.logs.crash import scan
from activities.logs.tail import LogLine, LogTail, expand_patterns
from activities.watch import to_findings, unresponsive
from workflows.domain.base import Frozen
from workflows.domain.findings import FindingKind
from workflows.domain.fleet import FleetPolicy
from workflows.domain.gpu import GpuEvent
from workflows.domain.incident import Attribution, FailureClass
from workflows.domain.slurm import ClusterSnapshot, NodeBaseState, SlurmNode
from workflows.policy.attribution import AttributionFacts, attribute, block_rank_layout, rank_layout

__all__ = [
    "SCENARIO_FILE",
    "TARGET_ACCURACY",
    "GroundTruth",
    "LoadedScenario",
    "NodeFacts",
    "Scenario",
    "SuiteError",
    "build_facts",
    "format_report",
    "load_scenario",
    "load_suite",
    "read_lines",
    "run_attribution_command",
    "run_suite",
    "score",
    "true_layout",
]

SCENARIO_FILE = "scenario.json"
TARGET_ACCURACY = 0.95
#: The Fleet's default approval threshold: implicated nodes of a less confident attribution are not drained.
APPROVAL_THRESHOLD = FleetPolicy().approve_below_confidence
"""The issue's target for top-1 node accuracy; any healthy-node drain fails the bench whatever the accuracy."""
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
    """The facts ``activities.attribution`` would hand to ``attribute`` for this scenario.

    Mirrors ``AttributionActivities.attribute_failure``: the detector's findings first (they are all it knows of
    the ranks before the window), then the findings and the ranks of every line read in the settle window.
    """
    scenario = loaded.scenario
    before, after = _split_at_window(read_lines(loaded) if lines is None else lines, scenario.window_start)
    findings = to_findings(scan(before))
    ranks_logging = {f.rank for f in findings if f.rank is not None}
    ranks_logging |= {line.rank for line in after if line.rank is not None}
    findings += to_findings(scan(after), start_order=len(findings))
    nodes = scenario.job_nodes
    return AttributionFacts(
        job_nodes=nodes,
        rank_nodes=rank_layout(nodes, scenario.task_count, findings),
        findings=findings,
        gpu_events=scenario.gpu_events,
        unresponsive_nodes=unresponsive(_snapshot(scenario), nodes),
        node_failure_nodes=[f.node for f in findings if f.kind is FindingKind.NODE_FAILURE and f.node],
        ranks_logging=sorted(ranks_logging),
    )


def true_layout(scenario: Scenario) -> dict[int, str]:
    """Rank -> node as the job really ran (srun's ``--distribution`` block or cyclic over the job's nodes)."""
    if scenario.layout == "block":
        return block_rank_layout(scenario.job_nodes, scenario.task_count)
    nodes = scenario.job_nodes
    return {rank: nodes[rank % len(nodes)] for rank in range(scenario.task_count)}


def run_suite(suite: Sequence[LoadedScenario]) -> list[Attribution]:
    """``attribute`` on every scenario's facts, in order."""
    return [attribute(build_facts(loaded)) for loaded in suite]


# ----- scoring (pure) ---------------------------------------------------------------------------------------------


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def score(scenarios: Sequence[Scenario], attributions: Sequence[Attribution]) -> dict[str, Any]:
    """Every measure of the module docstring, as one JSON-ready dict (``results`` has the per-scenario rows)."""
    rows: list[dict[str, Any]] = []
    for scn, a in zip(scenarios, attributions, strict=True):
        culprits = set(scn.truth.culprit_nodes)
        implicated = list(a.implicated_nodes)
        held = a.confidence < APPROVAL_THRESHOLD
        hit = bool(implicated) and implicated[0] in culprits if culprits else not implicated
        assumed = block_rank_layout(scn.job_nodes, scn.task_count)
        mismapped = sorted(r for r, n in true_layout(scn).items() if assumed.get(r) != n)
        rows.append(
            {
                "id": scn.id,
                "source": scn.source,
                "title": scn.title,
                "culprit_nodes": sorted(culprits),
                "healthy_nodes": list(scn.healthy_nodes),
                "implicated_nodes": implicated,
                "implicated_ranks": list(a.implicated_ranks),
                "implicated_gpus": list(a.implicated_gpus),
                "top1_correct": hit,
                # What the Fleet would drain: an attribution below its approval threshold only excludes the nodes
                # from the job's next placement and asks an operator (counted as held, not drained).
                "healthy_drains": [n for n in implicated if n not in culprits] if not held else [],
                "held_for_approval": [n for n in implicated if n not in culprits] if held else [],
                "failure_class": {"truth": scn.truth.failure_class.value, "got": a.failure_class.value},
                "failure_class_correct": scn.truth.failure_class is a.failure_class,
                "retryable": {"truth": scn.truth.retryable, "got": a.retryable},
                "retryable_correct": scn.truth.retryable == a.retryable,
                "cause": a.cause,
                "confidence": a.confidence,
                "explanation": a.explanation,
                "layout": scn.layout,
                "block_layout_mismapped_ranks": len(mismapped),
            }
        )
    n = len(rows)
    top1 = sum(r["top1_correct"] for r in rows)
    drains = [{"id": r["id"], "nodes": r["healthy_drains"]} for r in rows if r["healthy_drains"]]
    klass = sum(r["failure_class_correct"] for r in rows)
    retry = sum(r["retryable_correct"] for r in rows)
    accuracy = _ratio(top1, n)
    return {
        "scenarios": n,
        "with_culprit": sum(bool(r["culprit_nodes"]) for r in rows),
        "top1_correct": top1,
        "top1_accuracy": accuracy,
        "healthy_drain_count": sum(len(d["nodes"]) for d in drains),
        "healthy_drains": drains,
        "healthy_held_for_approval": [
            {"id": r["id"], "nodes": r["held_for_approval"]} for r in rows if r["held_for_approval"]
        ],
        "failure_class_accuracy": _ratio(klass, n),
        "failure_class_correct": klass,
        "retryable_accuracy": _ratio(retry, n),
        "retryable_correct": retry,
        "target_accuracy": TARGET_ACCURACY,
        "passed": accuracy is not None and accuracy >= TARGET_ACCURACY and not drains,
        "misses": [r["id"] for r in rows if not r["top1_correct"]],
        "results": rows,
    }


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _nodes(nodes: Sequence[str]) -> str:
    return ",".join(nodes) or "-"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def format_report(report: dict[str, Any]) -> str:
    """Plain aligned text: one row per scenario, then the summary and every miss with attribution's reason."""
    table = [["scenario", "truth", "implicated", "top1", "healthy drained", "class truth>got", "retry", "cause"]]
    for r in report["results"]:
        fc, rt = r["failure_class"], r["retryable"]
        table.append(
            [
                r["id"],
                _nodes(r["culprit_nodes"]),
                _nodes(r["implicated_nodes"]),
                "ok" if r["top1_correct"] else "MISS",
                _nodes(r["healthy_drains"]),
                f"{fc['truth']}>{fc['got']}" + ("" if r["failure_class_correct"] else " !"),
                f"{'y' if rt['truth'] else 'n'}>{'y' if rt['got'] else 'n'}" + ("" if r["retryable_correct"] else " !"),
                f"{r['cause']} ({r['confidence']:.2f})",
            ]
        )
    out = _table(table)
    n = report["scenarios"]
    out += [
        "",
        f"top-1 node accuracy: {report['top1_correct']}/{n} = {_num(report['top1_accuracy'])} "
        f"(target {report['target_accuracy']:.2f}; {report['with_culprit']} scenarios with a culprit node)",
        f"healthy-node drains: {report['healthy_drain_count']}"
        + "".join(f"  {d['id']}: {_nodes(d['nodes'])}" for d in report["healthy_drains"]),
        f"healthy nodes held for an operator (confidence < {APPROVAL_THRESHOLD:.2f}, not drained): "
        f"{sum(len(d['nodes']) for d in report['healthy_held_for_approval'])}"
        + "".join(f"  {d['id']}: {_nodes(d['nodes'])}" for d in report["healthy_held_for_approval"]),
        f"failure-class accuracy: {report['failure_class_correct']}/{n} = {_num(report['failure_class_accuracy'])}",
        f"retryable accuracy: {report['retryable_correct']}/{n} = {_num(report['retryable_accuracy'])}",
    ]
    mismapped = [r for r in report["results"] if r["block_layout_mismapped_ranks"]]
    if mismapped:
        out.append(
            "block-layout assumption mis-maps: "
            + ", ".join(f"{r['id']} ({r['block_layout_mismapped_ranks']} ranks, {r['layout']})" for r in mismapped)
        )
    misses = [r for r in report["results"] if not r["top1_correct"] or r["healthy_drains"]]
    if misses:
        out += ["", "misses:"]
        out += [f"  {r['id']}: {r['explanation']}" for r in misses]
    out += ["", "PASS" if report["passed"] else "FAIL"]
    return "\n".join(out)


# ----- command ----------------------------------------------------------------------------------------------------


def run_attribution_command(args: argparse.Namespace) -> int:
    """``rebound bench attribution``: 0 when the target is met, 1 when not, 2 when the suite cannot be read."""
    root = Path(args.scenarios)
    try:
        suite = load_suite(root)
        attributions = run_suite(suite)
    except SuiteError as e:
        print(f"rebound bench attribution: {e}", file=sys.stderr)
        return 2
    report = score([s.scenario for s in suite], attributions)
    report["suite"] = str(root)
    print(f"attribution benchmark: {len(suite)} scenarios from {root}\n")
    print(format_report(report))
    if args.json is not None:
        out = Path(args.json)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=2) + "\n")
        except OSError as e:
            print(f"rebound bench attribution: cannot write {out}: {e}", file=sys.stderr)
            return 2
    return 0 if report["passed"] else 1
