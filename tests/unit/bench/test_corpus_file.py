"""Shape of the labeled failure-log corpora in ``tests/data/detection/`` (pure, no classifier).

``corpus.jsonl`` is the ground truth the classifier was tuned on; ``heldout.jsonl`` is a second corpus from other
threads, kept apart to measure how the classifier generalises. A malformed line would silently turn into a wrong
score, so these checks keep every case of both loadable and inside the label set; they say nothing about how well
anything scores.
"""

from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data" / "detection"

# The canonical label set (docs/detection.md is the prose version of this table).
CATEGORIES = frozenset(
    {
        "nccl_timeout",
        "nccl_error",
        "gloo_error",
        "cuda_illegal_address",
        "cuda_launch_failure",
        "cuda_ecc",
        "cuda_device_assert",
        "cuda_unknown_error",
        "cuda_init_failure",
        "xid",
        "gpu_fell_off_bus",
        "cuda_oom",
        "host_oom",
        "segfault",
        "bus_error",
        "dataloader_killed",
        "elastic_child_failed",
        "user_exception",
        "checkpoint_io_error",
        "network_ib_error",
        "slurm_node_failure",
        "slurm_time_limit",
        "slurm_preemption",
        "slurm_task_exit",
        "nan_loss",
        "none",
    }
)
FAILURE_CLASSES = frozenset({"hardware", "infrastructure", "user", "unknown"})
REQUIRED_KEYS = frozenset({"id", "source_url", "log", "labels", "notes"})
INT_FIELDS = ("rank", "peer_rank", "xid", "exit_code", "signal")
KNOWN_LABELS = frozenset({"category", "failure_class", "restartable", "host", "gpu", *INT_FIELDS})
LAB_PREFIX = "lab:"
MAX_LINES = 120


@dataclass(frozen=True)
class CorpusFile:
    """One labeled corpus and the size it must keep (the held-out one is smaller, and stricter per thread)."""

    name: str
    min_cases: int
    min_categories: int  # failure categories covered, ``none`` not counted
    max_cases_per_source: int  # keeps one chatty thread from dominating the score

    @property
    def path(self) -> Path:
        return DATA / f"{self.name}.jsonl"


CORPORA = (CorpusFile("corpus", 60, 20, 4), CorpusFile("heldout", 45, 18, 3))


def _load(corpus: CorpusFile) -> list[dict[str, Any]]:
    cases = []
    for number, line in enumerate(corpus.path.read_text(encoding="utf-8").splitlines(), start=1):
        assert line.strip(), f"{corpus.name} line {number} is blank"
        try:
            case = json.loads(line)
        except json.JSONDecodeError as exc:  # a clear message instead of a bare traceback
            pytest.fail(f"{corpus.name} line {number} is not JSON: {exc}")
        assert isinstance(case, dict), f"{corpus.name} line {number} is not an object"
        cases.append(case)
    return cases


CASES = {corpus.name: _load(corpus) for corpus in CORPORA}
ALL_CASES = [(corpus.name, case) for corpus in CORPORA for case in CASES[corpus.name]]


def _ids(name: str) -> list[str]:
    return [str(case.get("id", f"line-{n}")) for n, case in enumerate(CASES[name], start=1)]


def _case_id(param: tuple[str, dict[str, Any]]) -> str:
    name, case = param
    return f"{name}:{case.get('id', '?')}"


@pytest.mark.parametrize("corpus", CORPORA, ids=lambda c: c.name)
def test_corpus_is_big_and_broad_enough(corpus: CorpusFile) -> None:
    cases = CASES[corpus.name]
    assert len(cases) >= corpus.min_cases
    covered = {case["labels"]["category"] for case in cases}
    assert len(covered - {"none"}) >= corpus.min_categories, sorted(CATEGORIES - covered)
    assert "none" in covered  # the classifier must also be scored on logs that are not failures


@pytest.mark.parametrize("corpus", CORPORA, ids=lambda c: c.name)
def test_ids_are_unique(corpus: CorpusFile) -> None:
    duplicates = [i for i, n in collections.Counter(_ids(corpus.name)).items() if n > 1]
    assert duplicates == []


@pytest.mark.parametrize("corpus", CORPORA, ids=lambda c: c.name)
def test_no_source_dominates(corpus: CorpusFile) -> None:
    per_source = collections.Counter(case["source_url"] for case in CASES[corpus.name])
    assert [url for url, n in per_source.items() if n > corpus.max_cases_per_source] == []


def test_heldout_shares_no_source_with_the_tuning_corpus() -> None:
    # A thread the classifier was tuned on would leak into the generalisation score.
    tuned = {case["source_url"] for case in CASES["corpus"]}
    assert sorted({case["source_url"] for case in CASES["heldout"]} & tuned) == []


@pytest.mark.parametrize(("name", "case"), ALL_CASES, ids=[_case_id(p) for p in ALL_CASES])
def test_case_shape(name: str, case: dict[str, Any]) -> None:
    assert set(case) >= REQUIRED_KEYS, sorted(REQUIRED_KEYS - set(case))
    labels = case["labels"]
    category = labels["category"]
    assert category in CATEGORIES
    assert re.fullmatch(rf"{category}-\d{{2,}}", case["id"]), "id must be <category>-<nn>"
    assert case["source_url"].startswith(("https://", LAB_PREFIX))
    assert isinstance(case["notes"], str) and case["notes"].strip()
    log = case["log"]
    assert isinstance(log, str) and log.strip()
    assert len(log.split("\n")) <= MAX_LINES


@pytest.mark.parametrize(("name", "case"), ALL_CASES, ids=[_case_id(p) for p in ALL_CASES])
def test_case_labels(name: str, case: dict[str, Any]) -> None:
    labels = case["labels"]
    assert set(labels) <= KNOWN_LABELS, sorted(set(labels) - KNOWN_LABELS)
    assert labels["failure_class"] in FAILURE_CLASSES
    assert labels["restartable"] in (True, False, None)
    for name in INT_FIELDS:
        if name in labels:
            # bool is an int in Python; a True rank would be a labelling slip, not a rank.
            assert isinstance(labels[name], int) and not isinstance(labels[name], bool), name
    if "host" in labels:
        assert isinstance(labels["host"], str) and labels["host"]
    if "gpu" in labels:
        gpu = labels["gpu"]
        assert (isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0) or (isinstance(gpu, str) and gpu)
    if labels["category"] == "none":
        assert labels["restartable"] is None  # nothing failed, so there is nothing to restart


@pytest.mark.parametrize(
    "case", [c for _, c in ALL_CASES if c["source_url"].startswith(LAB_PREFIX)], ids=lambda c: str(c["id"])
)
def test_lab_cases_are_verbatim_excerpts_of_the_lab_logs(case: dict[str, Any]) -> None:
    path = REPO / case["source_url"].removeprefix(LAB_PREFIX)
    assert path.is_file(), path
    source = [line.rstrip() for line in path.read_text(encoding="utf-8").splitlines()]
    # Every excerpt line, in order, is a line of the file; a line of "..." marks a cut.
    position = 0
    for line in case["log"].split("\n"):
        if line == "...":
            continue
        while position < len(source) and source[position] != line:
            position += 1
        assert position < len(source), f"not in {path.name} (or out of order): {line!r}"
        position += 1
