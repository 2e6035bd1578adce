"""The kernel-log part of ``rebound bench detection``: how the node agent's kernel-line parser reads real dmesg.

Issue 14's kernel-level categories (NVSwitch SXid, PCIe AER, machine checks, hung tasks, soft lockups, read-only
remounts, NFS servers not answering, mlx5 port errors...) are node events, read from a node's kernel log by
``activities.kernel.lines.parse_line`` (the agent's parser), not job-failure categories of the signature table. This
scores that parser on ``tests/data/detection/kernel.jsonl``: real dmesg/journal excerpts from public threads, each
labelled with the strongest node event it reports (``node_event``, ``none`` for a benign look-alike) and, where the
text decides it, that event's ``severity``. A case's reading is the strongest event its lines parse to (severity
order of ``KernelSeverity``; an event the line gives no severity ranks lowest). The format is the detection corpus's
(``workers.bench.detection``), with these labels. Everything here is pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from workflows.domain.base import Frozen
from workflows.domain.gpu import GpuEvent
from workflows.domain.node_events import KernelSeverity, NodeEventKind, SxidCatalog

__all__ = ["KernelCase", "KernelLabels", "format_kernel_report", "read_kernel", "score_kernel"]

NONE = "none"


class KernelLabels(Frozen):
    node_event: NodeEventKind | Literal["none"]
    severity: KernelSeverity | None = None
    """Where the excerpt decides it; None: not labelled (not scored)."""


class KernelCase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(min_length=1)
    source_url: str
    log: str
    labels: KernelLabels
    notes: str = ""


class KernelReading(Frozen):
    node_event: str
    severity: KernelSeverity | None = None
    line: str = ""


def _rank(event: GpuEvent) -> int:
    order = list(KernelSeverity)
    return order.index(event.severity) + 1 if event.severity is not None else 0


def read_kernel(log: str, *, sxids: SxidCatalog) -> KernelReading:
    """The strongest node event the excerpt's lines parse to (the first of equals), or ``none``."""
    from activities.kernel.lines import parse_line

    best: GpuEvent | None = None
    for line in log.splitlines():
        event = parse_line(line, host="-", sxids=sxids)
        if event is not None and event.node_event is not None and (best is None or _rank(event) > _rank(best)):
            best = event
    if best is None or best.node_event is None:
        return KernelReading(node_event=NONE)
    return KernelReading(node_event=best.node_event.value, severity=best.severity, line=best.detail[:160])


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def score_kernel(cases: Sequence[KernelCase], readings: Sequence[KernelReading]) -> dict[str, Any]:
    """Per node event precision, recall, F1 and support; accuracy of the event and, where labelled, the severity."""
    rows: list[dict[str, Any]] = []
    for case, r in zip(cases, readings, strict=True):
        truth = case.labels.node_event if isinstance(case.labels.node_event, str) else case.labels.node_event.value
        rows.append(
            {
                "id": case.id,
                "true": str(truth),
                "predicted": r.node_event,
                "correct": str(truth) == r.node_event,
                "severity": {
                    "label": case.labels.severity.value if case.labels.severity is not None else None,
                    "predicted": r.severity.value if r.severity is not None else None,
                },
                "line": r.line,
            }
        )
    pairs = Counter((r["true"], r["predicted"]) for r in rows)
    truth_n = Counter(r["true"] for r in rows)
    guessed = Counter(r["predicted"] for r in rows)
    order = [k for k in [*(e.value for e in NodeEventKind), NONE] if k in truth_n or k in guessed]
    per_event: dict[str, dict[str, Any]] = {}
    for kind in order:
        tp = pairs[(kind, kind)]
        per_event[kind] = {
            "support": truth_n[kind],
            "predicted": guessed[kind],
            "precision": _ratio(tp, guessed[kind]),
            "recall": _ratio(tp, truth_n[kind]),
            "f1": round(2 * tp / (truth_n[kind] + guessed[kind]), 4),
        }
    labelled = [r for r in rows if r["severity"]["label"] is not None]
    severe_ok = sum(r["severity"]["label"] == r["severity"]["predicted"] for r in labelled)
    correct = sum(r["correct"] for r in rows)
    return {
        "cases": len(rows),
        "correct": correct,
        "accuracy": _ratio(correct, len(rows)),
        "per_event": per_event,
        "severity_accuracy": {
            "labelled": len(labelled),
            "correct": severe_ok,
            "accuracy": _ratio(severe_ok, len(labelled)),
        },
        "misread": [
            {"id": r["id"], "true": r["true"], "predicted": r["predicted"], "severity": r["severity"]}
            for r in rows
            if not r["correct"] or r["severity"]["label"] not in (None, r["severity"]["predicted"])
        ],
        "results": rows,
    }


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_kernel_report(report: dict[str, Any], table: Any) -> list[str]:
    """The per-event table, the accuracies and the misreadings; ``table`` aligns rows (``detection._table``)."""
    rows = [["node event", "support", "predicted", "precision", "recall", "f1"]]
    for kind, v in report["per_event"].items():
        rows.append(
            [kind, str(v["support"]), str(v["predicted"]), _num(v["precision"]), _num(v["recall"]), _num(v["f1"])]
        )
    out = list(table(rows))
    sev = report["severity_accuracy"]
    out.append("")
    out.append(f"node event accuracy: {report['correct']}/{report['cases']} = {_num(report['accuracy'])}")
    out.append(f"severity accuracy: {sev['correct']}/{sev['labelled']} = {_num(sev['accuracy'])} (where labelled)")
    out.append(f"misread ({len(report['misread'])}):")
    for m in report["misread"]:
        sev_note = ""
        if m["severity"]["label"] is not None:
            sev_note = f" (severity {m['severity']['label']} -> {m['severity']['predicted'] or '-'})"
        out.append(f"  {m['id']}: {m['true']} -> {m['predicted']}{sev_note}")
    return out
