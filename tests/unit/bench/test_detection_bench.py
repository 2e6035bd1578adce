"""``rebound bench detection``: corpus validation, the scoring math on a tiny synthetic corpus, and the command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from activities.logs.diagnosis import Diagnosis, EvidenceLine, Finding
from activities.logs.signature_types import CATEGORIES, Category, Role
from workers import cli
from workers.bench.detection import CorpusCase, CorpusError, format_report, load_corpus, score
from workflows.domain.incident import FailureClass

C = Category
REPO = Path(__file__).resolve().parents[3]
DEV_CASES = REPO / "tests" / "data" / "detection" / "dev_cases.jsonl"


def _case(id: str, category: str, **labels: Any) -> CorpusCase:
    return CorpusCase.model_validate(
        {"id": id, "source_url": "hand-written", "log": "x", "labels": {"category": category, **labels}}
    )


def _diagnosis(category: Category, **primary: Any) -> Diagnosis:
    info = CATEGORIES[category]
    if category is C.NONE:
        return Diagnosis(category=category, failure_class=None, restartable=None, confidence=0.8)
    finding = Finding(
        category=category,
        signature="test",
        failure_class=info.failure_class,
        restartable=info.restartable,
        role=Role.CULPRIT,
        confidence=0.9,
        evidence=(EvidenceLine(path="p", line=1, text="t"),),
        **primary,
    )
    return Diagnosis(
        category=category,
        failure_class=info.failure_class,
        restartable=info.restartable,
        confidence=0.9,
        primary=finding,
        findings=(finding,),
    )


# ----- the corpus -----------------------------------------------------------------------------------------------


def _write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps(
    {
        "id": "a",
        "source_url": "https://example.org/1",
        "log": "KeyError: 'x'",
        "labels": {"category": "user_exception", "failure_class": "user", "restartable": False, "rank": 3},
        "notes": "n",
        "license": "extra top-level keys are ignored",
    }
)


def test_load_corpus_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    cases = load_corpus(_write(tmp_path, "# hand-written", "", GOOD))
    assert [(c.id, c.labels.category, c.labels.rank) for c in cases] == [("a", C.USER_EXCEPTION, 3)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "corpus.jsonl:3: malformed case"),
        (GOOD.replace("user_exception", "cosmic_ray"), "corpus.jsonl:3: malformed case: labels.category"),
        (GOOD.replace('"rank": 3', '"rnak": 3'), "labels.rnak: Extra inputs are not permitted"),
        (GOOD.replace('"restartable": false', '"restartable": "maybe"'), "labels.restartable"),
        (GOOD.replace('"log": "KeyError: \'x\'", ', ""), "corpus.jsonl:3: malformed case: log: Field required"),
        (GOOD, "corpus.jsonl:3: duplicate id 'a' (first on line 2)"),
    ],
)
def test_a_malformed_line_is_a_clear_error_naming_its_line(tmp_path: Path, line: str, message: str) -> None:
    path = _write(tmp_path, "# header", GOOD, line)
    with pytest.raises(CorpusError) as err:
        load_corpus(path)
    assert message in str(err.value)


def test_missing_or_empty_corpus(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="cannot read"):
        load_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(CorpusError, match="no cases"):
        load_corpus(_write(tmp_path, "# only a comment"))


def test_none_labels_accept_a_dash_or_null_class() -> None:
    assert _case("n", "none", failure_class="-").labels.failure_class is None
    assert _case("n", "none", failure_class=None).labels.failure_class is None
    assert _case("n", "none", failure_class="unknown").labels.failure_class is FailureClass.UNKNOWN


# ----- the scoring math -----------------------------------------------------------------------------------------


def test_scores_on_a_tiny_synthetic_corpus() -> None:
    cases = [
        _case("t1", "nccl_timeout", failure_class="infrastructure", restartable=True),
        _case("t2", "nccl_timeout", failure_class="infrastructure", restartable=True),
        _case("o1", "cuda_oom", failure_class="user", restartable=False, gpu=1, rank=5),
        _case("x1", "xid", failure_class="hardware", xid=79, host="gpu-a7.cluster", gpu="0000:3B:00"),
        _case("n1", "none", failure_class="unknown"),
    ]
    diagnoses = [
        _diagnosis(C.NCCL_TIMEOUT),
        _diagnosis(C.CUDA_OOM, gpu=1, rank=4),  # wrong category, and a field of it to check
        _diagnosis(C.CUDA_OOM, gpu=1, rank=5),
        _diagnosis(C.XID, xid=79, host="GPU-A7", gpu="0000:3b:00.0"),
        _diagnosis(C.NONE),
    ]
    r = score(cases, diagnoses)
    assert (r["cases"], r["correct"], r["category_accuracy"]) == (5, 4, 0.8)
    assert r["per_category"]["nccl_timeout"] == {
        "support": 2,
        "predicted": 1,
        "precision": 1.0,
        "recall": 0.5,
        "f1": 0.6667,
    }
    assert r["per_category"]["cuda_oom"] == {
        "support": 1,
        "predicted": 2,
        "precision": 0.5,
        "recall": 1.0,
        "f1": 0.6667,
    }
    assert r["per_category"]["xid"]["f1"] == 1.0 and r["per_category"]["none"]["f1"] == 1.0
    # macro-F1 over the failure categories with support (none excluded): (2/3 + 2/3 + 1) / 3
    assert (r["macro_f1"], r["macro_f1_categories"]) == (0.7778, 3)
    assert r["confusion"] == {
        "labels": ["nccl_timeout", "xid", "cuda_oom", "none"],
        "matrix": [[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
    }
    assert r["misclassified"] == [{"id": "t2", "true": "nccl_timeout", "predicted": "cuda_oom"}]
    # t2 predicted the user class for an infrastructure label; "none" with no class counts as "unknown"
    assert r["failure_class_accuracy"] == {"labelled": 5, "correct": 4, "accuracy": 0.8}
    assert r["restartable_accuracy"] == {"labelled": 3, "correct": 2, "accuracy": 0.6667}
    # hosts match by short name, GPUs as index or PCI id in any spelling
    assert r["fields"]["host"] == {"labelled": 1, "correct": 1, "accuracy": 1.0}
    assert r["fields"]["gpu"] == {"labelled": 2, "correct": 2, "accuracy": 1.0}
    assert r["fields"]["rank"] == {"labelled": 1, "correct": 1, "accuracy": 1.0}
    assert set(r["fields"]) == {"rank", "host", "gpu", "xid"}
    text = format_report(r)
    assert "macro-F1 over 3 failure categories with support: 0.78" in text
    assert "  t2: nccl_timeout -> cuda_oom" in text
    assert "[0] nccl_timeout" in text and "category accuracy: 4/5 = 0.80" in text


def test_a_category_never_predicted_has_no_precision_and_zero_f1() -> None:
    r = score([_case("a", "gloo_error")], [_diagnosis(C.NONE)])
    assert r["per_category"]["gloo_error"] == {
        "support": 1,
        "predicted": 0,
        "precision": None,
        "recall": 0.0,
        "f1": 0.0,
    }
    assert r["per_category"]["none"] == {"support": 0, "predicted": 1, "precision": 0.0, "recall": None, "f1": 0.0}
    assert (r["macro_f1"], r["macro_f1_categories"]) == (0.0, 1)


# ----- the command ----------------------------------------------------------------------------------------------


def test_bench_detection_on_the_hand_written_dev_cases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "res" / "detection.json"
    assert cli.main(["bench", "detection", "--corpus", str(DEV_CASES), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        "detection benchmark: 36 cases" in printed and "confusion matrix (rows = true, columns = predicted)" in printed
    )
    report = json.loads(out.read_text())
    assert report["cases"] == 36 and len(report["results"]) == 36
    # The library was written with these cases at hand: they are a regression floor, not a measure of accuracy.
    assert report["category_accuracy"] >= 0.95, report["misclassified"]
    assert report["fields"]["rank"]["accuracy"] >= 0.9


def test_bench_detection_with_a_bad_corpus_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "detection", "--corpus", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read the corpus" in capsys.readouterr().err
    bad = _write(tmp_path, GOOD, "[1, 2]")
    assert cli.main(["bench", "detection", "--corpus", str(bad)]) == 2
    assert "corpus.jsonl:2: malformed case" in capsys.readouterr().err
