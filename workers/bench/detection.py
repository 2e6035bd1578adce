"""``rebound bench detection``: how well ``rebound diagnose`` names the failure in labelled real logs.

The corpus is JSONL, one case per line (blank lines and lines starting with ``#`` are skipped)::

    {"id": "nccl-timeout-01", "source_url": "https://github.com/...", "log": "<the log text>",
     "labels": {"category": "nccl_timeout", "failure_class": "infrastructure", "restartable": true,
                "rank": 3, "host": "node-7", "gpu": 0, "peer_rank": 5, "xid": 79, "exit_code": 1, "signal": 9},
     "notes": "optional"}

``category`` is one of ``activities.logs.signature_types.Category``; ``failure_class`` one of hardware,
infrastructure, user, unknown (or ``-``/null, e.g. for ``none``); ``restartable`` true, false or null (unknown);
the implicated fields are optional. Unknown keys inside ``labels`` are errors (a typo must not silently drop a
label); other top-level keys are ignored.

Scores: per category precision, recall, F1 and support; macro-F1 over the failure categories (not ``none``) that
have support; accuracy of the category, the failure class and restartability where labelled; accuracy of each
implicated field where labelled (hosts match case-insensitively or by short name, GPUs as index or PCI id); the
confusion matrix (rows true, columns predicted); the misclassified ids. Everything here but the command is pure.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from activities.logs.diagnose import diagnose_text
from activities.logs.diagnosis import Diagnosis, normalize_gpu
from activities.logs.signature_types import Category
from workflows.domain.base import Frozen
from workflows.domain.incident import FailureClass

__all__ = [
    "FIELDS",
    "CorpusCase",
    "CorpusError",
    "CorpusLabels",
    "format_report",
    "load_corpus",
    "run_detection_command",
    "score",
]

FIELDS = ("rank", "host", "gpu", "peer_rank", "xid", "exit_code", "signal")
"""The implicated fields a case may label."""


class CorpusLabels(Frozen):
    category: Category
    failure_class: FailureClass | None = None
    restartable: bool | None = None
    rank: int | None = None
    host: str | None = None
    gpu: int | str | None = None
    peer_rank: int | None = None
    xid: int | None = None
    exit_code: int | None = None
    signal: int | None = None

    @field_validator("failure_class", mode="before")
    @classmethod
    def _no_class(cls, value: object) -> object:
        return None if value in ("-", "", "none") else value


class CorpusCase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(min_length=1)
    source_url: str
    log: str
    labels: CorpusLabels
    notes: str = ""


class CorpusError(ValueError):
    """A corpus that cannot be scored: names the file and line."""


_Case = TypeVar("_Case", bound=BaseModel)


@overload
def load_corpus(path: Path) -> list[CorpusCase]: ...
@overload
def load_corpus(path: Path, model: type[_Case]) -> list[_Case]: ...
def load_corpus(path: Path, model: type[BaseModel] = CorpusCase) -> list[Any]:
    """Parse and validate the corpus (cases of ``model``: the kernel-log corpus has its own labels).

    Raises:
        CorpusError: The file cannot be read, a line is not a JSON object of the corpus format (the message names
            the line number and the field), an id repeats, or there is no case at all.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CorpusError(f"{path}: cannot read the corpus: {e}") from e
    cases: list[Any] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            case = model.model_validate_json(line)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'line'}: {err['msg']}" for err in e.errors()
            )
            raise CorpusError(f"{path}:{number}: malformed case: {problems}") from e
        case_id = str(getattr(case, "id", ""))
        if case_id in seen:
            raise CorpusError(f"{path}:{number}: duplicate id {case_id!r} (first on line {seen[case_id]})")
        seen[case_id] = number
        cases.append(case)
    if not cases:
        raise CorpusError(f"{path}: no cases")
    return cases


# ----- scoring (pure) -------------------------------------------------------------------------------------------


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def _same(field: str, label: object, predicted: object) -> bool:
    if predicted is None:
        return False
    if field == "host":
        a, b = str(label).lower(), str(predicted).lower()
        return a == b or a.split(".")[0] == b.split(".")[0]
    if field == "gpu":
        return normalize_gpu(label) == normalize_gpu(predicted)  # type: ignore[arg-type]  # int | str both ways
    return label == predicted


def score(cases: Sequence[CorpusCase], diagnoses: Sequence[Diagnosis]) -> dict[str, Any]:
    """Every measure of the module docstring, as one JSON-ready dict (``cases`` has the per-case detail)."""
    rows: list[dict[str, Any]] = []
    for case, d in zip(cases, diagnoses, strict=True):
        lab, p = case.labels, d.primary
        fields = {}
        for name in FIELDS:
            label = getattr(lab, name)
            if label is not None:
                predicted = getattr(p, name) if p is not None else None
                fields[name] = {"label": label, "predicted": predicted, "correct": _same(name, label, predicted)}
        rows.append(
            {
                "id": case.id,
                "true": lab.category.value,
                "predicted": d.category.value,
                "correct": lab.category is d.category,
                "confidence": d.confidence,
                "failure_class": {
                    "label": lab.failure_class.value if lab.failure_class else None,
                    "predicted": d.failure_class.value if d.failure_class else None,
                },
                "restartable": {"label": lab.restartable, "predicted": d.restartable},
                "fields": fields,
                "evidence": [str(e) for e in (p.evidence[:2] if p else ())],
            }
        )
    pairs = Counter((r["true"], r["predicted"]) for r in rows)
    truth = Counter(r["true"] for r in rows)
    guessed = Counter(r["predicted"] for r in rows)
    order = [c.value for c in Category if c.value in truth or c.value in guessed]
    per_category: dict[str, dict[str, Any]] = {}
    for cat in order:
        tp = pairs[(cat, cat)]
        precision, recall = _ratio(tp, guessed[cat]), _ratio(tp, truth[cat])
        f1 = None
        if truth[cat] or guessed[cat]:
            f1 = round(2 * tp / (truth[cat] + guessed[cat]), 4)
        per_category[cat] = {
            "support": truth[cat],
            "predicted": guessed[cat],
            "precision": precision,
            "recall": recall,
            "f1": f1,
        }
    macro = [v["f1"] for c, v in per_category.items() if c != Category.NONE.value and v["support"]]
    klass = [r for r in rows if r["failure_class"]["label"] is not None]
    for r in klass:
        if r["predicted"] == Category.NONE.value and r["failure_class"]["predicted"] is None:
            # Nothing failed, so there is no class; a corpus may write that as "unknown".
            r["failure_class"]["predicted"] = "unknown" if r["failure_class"]["label"] == "unknown" else None
    restart = [r for r in rows if r["restartable"]["label"] is not None]
    field_scores = {}
    for name in FIELDS:
        labelled = [r["fields"][name]["correct"] for r in rows if name in r["fields"]]
        if labelled:
            field_scores[name] = {
                "labelled": len(labelled),
                "correct": sum(labelled),
                "accuracy": _ratio(sum(labelled), len(labelled)),
            }
    correct = sum(r["correct"] for r in rows)
    return {
        "cases": len(rows),
        "category_accuracy": _ratio(correct, len(rows)),
        "correct": correct,
        "macro_f1": round(sum(macro) / len(macro), 4) if macro else None,
        "macro_f1_categories": len(macro),
        "per_category": per_category,
        "failure_class_accuracy": {
            "labelled": len(klass),
            "correct": sum(r["failure_class"]["label"] == r["failure_class"]["predicted"] for r in klass),
            "accuracy": _ratio(
                sum(r["failure_class"]["label"] == r["failure_class"]["predicted"] for r in klass), len(klass)
            ),
        },
        "restartable_accuracy": {
            "labelled": len(restart),
            "correct": sum(r["restartable"]["label"] == r["restartable"]["predicted"] for r in restart),
            "accuracy": _ratio(
                sum(r["restartable"]["label"] == r["restartable"]["predicted"] for r in restart), len(restart)
            ),
        },
        "fields": field_scores,
        "confusion": {"labels": order, "matrix": [[pairs[(t, p)] for p in order] for t in order]},
        "misclassified": [
            {"id": r["id"], "true": r["true"], "predicted": r["predicted"]} for r in rows if not r["correct"]
        ],
        "results": rows,
    }


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def format_report(report: dict[str, Any]) -> str:
    """Plain aligned text: the per-category table, the summary accuracies, the confusion matrix, the misses."""
    out: list[str] = []
    rows = [["category", "support", "predicted", "precision", "recall", "f1"]]
    for cat, v in report["per_category"].items():
        rows.append(
            [cat, str(v["support"]), str(v["predicted"]), _num(v["precision"]), _num(v["recall"]), _num(v["f1"])]
        )
    out.extend(_table(rows))
    out.append("")
    out.append(
        f"macro-F1 over {report['macro_f1_categories']} failure categories with support: {_num(report['macro_f1'])}"
    )
    out.append(f"category accuracy: {report['correct']}/{report['cases']} = {_num(report['category_accuracy'])}")
    for name in ("failure_class", "restartable"):
        v = report[f"{name}_accuracy"]
        out.append(f"{name} accuracy: {v['correct']}/{v['labelled']} = {_num(v['accuracy'])} (where labelled)")
    for name, v in report["fields"].items():
        out.append(f"{name} accuracy: {v['correct']}/{v['labelled']} = {_num(v['accuracy'])} (where labelled)")
    labels = report["confusion"]["labels"]
    out.append("")
    out.append("confusion matrix (rows = true, columns = predicted):")
    matrix = [[""] + [f"[{i}]" for i in range(len(labels))]]
    for i, (cat, counts) in enumerate(zip(labels, report["confusion"]["matrix"], strict=True)):
        matrix.append([f"[{i}] {cat}"] + [str(n) if n else "." for n in counts])
    out.extend(_table(matrix))
    out.append("")
    misses = report["misclassified"]
    out.append(f"misclassified ({len(misses)}):")
    out.extend(f"  {m['id']}: {m['true']} -> {m['predicted']}" for m in misses)
    return "\n".join(out)


# ----- command ----------------------------------------------------------------------------------------------------


def run_detection_command(args: argparse.Namespace) -> int:
    """``rebound bench detection``: diagnose every case, print the report, write the JSON; 2 on a bad corpus."""
    path = Path(args.corpus)
    try:
        cases = load_corpus(path)
    except CorpusError as e:
        print(f"rebound bench detection: {e}", file=sys.stderr)
        return 2
    diagnoses = [diagnose_text(case.log, path=case.id) for case in cases]
    report = score(cases, diagnoses)
    report["corpus"] = str(path)
    print(f"detection benchmark: {len(cases)} cases from {path}\n")
    print(format_report(report))
    kernel_path = getattr(args, "kernel_corpus", None)
    if kernel_path is not None and Path(kernel_path).exists():
        report["kernel"] = _kernel_section(Path(kernel_path))
        if report["kernel"] is None:
            return 2
    if args.json is not None:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _kernel_section(path: Path) -> dict[str, Any] | None:
    """Score the node agent's kernel-line parser on the kernel corpus and print it; None on a bad corpus."""
    from activities.kernel.sxid_catalog import default_sxid_catalog
    from workers.bench.kernel_corpus import KernelCase, format_kernel_report, read_kernel, score_kernel

    try:
        cases = load_corpus(path, KernelCase)
    except CorpusError as e:
        print(f"rebound bench detection: {e}", file=sys.stderr)
        return None
    sxids = default_sxid_catalog()
    report = score_kernel(cases, [read_kernel(c.log, sxids=sxids) for c in cases])
    report["corpus"] = str(path)
    print(f"\nkernel-log lines (the node agent's parser, activities/kernel/lines.py): {len(cases)} cases from {path}\n")
    print("\n".join(format_kernel_report(report, _table)))
    return report
