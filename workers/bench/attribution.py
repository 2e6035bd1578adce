"""``rebound bench attribution``: does attribution name the right node, and never a healthy one?

The suite and how each scenario becomes the facts the live activity would gather: ``workers.bench.attribution_suite``.
``run_suite`` hands those facts to ``workflows.policy.attribution.attribute``, the function the live recovery's
``attribute_failure`` activity calls.

Scores: top-1 node accuracy (the first implicated node is a culprit; with no culprit, correct when no node is
implicated), healthy-node drains (implicated nodes that are not culprits, of an attribution on the action ladder's
``drain`` rung and confident enough for the Fleet to drain without an operator: each would be drained for nothing;
less confident ones are reported as held; ones on the ``exclude`` rung are only kept out of that job's next
placement and reported as such), the rung against the scenario's ``truth.action`` (a drain its evidence does not
allow, even of the culprit, fails the bench), failure-class and retryable accuracy. The report also says how many
ranks the srun block layout (what the live activity assumes where the logs do not name a rank's node) puts on the
wrong node of a ``cyclic`` scenario. The command exits 1 when top-1 accuracy is below ``TARGET_ACCURACY``, any
healthy node would be drained or any drain lacks node-level evidence, 2 when the suite cannot be read. Everything
here but the command is pure or reads only the suite's files.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.bench.attribution_suite import LoadedScenario, Scenario, SuiteError, build_facts, load_suite, true_layout
from workflows.domain.fleet import FleetPolicy
from workflows.domain.incident import ActionRung, Attribution
from workflows.policy.attribution import attribute, block_rank_layout

__all__ = [
    "APPROVAL_THRESHOLD",
    "TARGET_ACCURACY",
    "format_report",
    "run_attribution_command",
    "run_suite",
    "score",
]

TARGET_ACCURACY = 0.95
"""The issue's target for top-1 node accuracy; any healthy-node drain fails the bench whatever the accuracy."""
APPROVAL_THRESHOLD = FleetPolicy().approve_below_confidence
"""The Fleet's default approval threshold: implicated nodes of a less confident attribution are not drained."""


def run_suite(suite: Sequence[LoadedScenario]) -> list[Attribution]:
    """``attribute`` on every scenario's facts, in order."""
    return [attribute(build_facts(loaded)) for loaded in suite]


# ----- scoring (pure) ---------------------------------------------------------------------------------------------


def _rung(a: Attribution) -> ActionRung:
    """The rung the live recovery would act on: an attribution made without the ladder asks for a drain."""
    if a.action is not None:
        return a.action
    return ActionRung.DRAIN if a.implicated_nodes else ActionRung.NOTHING


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def score(scenarios: Sequence[Scenario], attributions: Sequence[Attribution]) -> dict[str, Any]:
    """Every measure of the module docstring, as one JSON-ready dict (``results`` has the per-scenario rows)."""
    rows: list[dict[str, Any]] = []
    for scn, a in zip(scenarios, attributions, strict=True):
        culprits = set(scn.truth.culprit_nodes)
        implicated = list(a.implicated_nodes)
        rung = _rung(a)
        held = a.confidence < APPROVAL_THRESHOLD
        drained = rung is ActionRung.DRAIN and not held
        wrong = [n for n in implicated if n not in culprits]
        want = scn.truth.action
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
                # What the Fleet would drain: only the drain rung drains; below the approval threshold it waits for
                # an operator (counted as held); the exclude rung keeps the nodes out of this job's placement only.
                "action": {"truth": want.value if want else None, "got": rung.value},
                "action_correct": None if want is None else want is rung,
                # Excluding a node from one job's placement is cheap; draining it for everyone needs the evidence.
                "unjustified_drain": want is not None and rung is ActionRung.DRAIN and want is not ActionRung.DRAIN,
                "action_reason": a.action_reason,
                "healthy_drains": wrong if drained else [],
                "held_for_approval": wrong if rung is ActionRung.DRAIN and held else [],
                "healthy_excluded": wrong if rung is ActionRung.EXCLUDE else [],
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
    scored = [r for r in rows if r["action_correct"] is not None]
    actions = sum(bool(r["action_correct"]) for r in scored)
    unjustified = [r["id"] for r in rows if r["unjustified_drain"]]
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
        "healthy_excluded": [{"id": r["id"], "nodes": r["healthy_excluded"]} for r in rows if r["healthy_excluded"]],
        "actions": {rung.value: sum(r["action"]["got"] == rung.value for r in rows) for rung in ActionRung},
        "action_scored": len(scored),
        "action_correct": actions,
        "action_accuracy": _ratio(actions, len(scored)),
        "unjustified_drains": unjustified,
        "failure_class_accuracy": _ratio(klass, n),
        "failure_class_correct": klass,
        "retryable_accuracy": _ratio(retry, n),
        "retryable_correct": retry,
        "target_accuracy": TARGET_ACCURACY,
        "passed": accuracy is not None and accuracy >= TARGET_ACCURACY and not drains and not unjustified,
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
    table = [["scenario", "truth", "implicated", "top1", "action truth>got", "healthy drained", "class truth>got",
              "retry", "cause"]]  # fmt: skip
    for r in report["results"]:
        fc, rt = r["failure_class"], r["retryable"]
        table.append(
            [
                r["id"],
                _nodes(r["culprit_nodes"]),
                _nodes(r["implicated_nodes"]),
                "ok" if r["top1_correct"] else "MISS",
                f"{r['action']['truth'] or '?'}>{r['action']['got']}" + (" !" if r["action_correct"] is False else ""),
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
        f"healthy nodes excluded from the job's next placement only (suspicions, not drained): "
        f"{sum(len(d['nodes']) for d in report['healthy_excluded'])}"
        + "".join(f"  {d['id']}: {_nodes(d['nodes'])}" for d in report["healthy_excluded"]),
        "actions: "
        + ", ".join(f"{k} {v}" for k, v in report["actions"].items())
        + f"; as the evidence allows: {report['action_correct']}/{report['action_scored']} = "
        f"{_num(report['action_accuracy'])}; drains without node-level evidence: {len(report['unjustified_drains'])}"
        + "".join(f"  {i}" for i in report["unjustified_drains"]),
        f"failure-class accuracy: {report['failure_class_correct']}/{n} = {_num(report['failure_class_accuracy'])}",
        f"retryable accuracy: {report['retryable_correct']}/{n} = {_num(report['retryable_accuracy'])}",
    ]
    mismapped = [r for r in report["results"] if r["block_layout_mismapped_ranks"]]
    if mismapped:
        out.append(
            "block-layout assumption mis-maps: "
            + ", ".join(f"{r['id']} ({r['block_layout_mismapped_ranks']} ranks, {r['layout']})" for r in mismapped)
        )
    misses = [r for r in report["results"] if not r["top1_correct"] or r["healthy_drains"] or r["unjustified_drain"]]
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
