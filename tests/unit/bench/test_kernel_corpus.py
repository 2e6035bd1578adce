"""The kernel-log part of ``rebound bench detection``: reading an excerpt, the scoring, the corpus file (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from activities.kernel.sxid_catalog import default_sxid_catalog
from workers.bench.detection import CorpusError, _table, load_corpus
from workers.bench.kernel_corpus import KernelCase, format_kernel_report, read_kernel, score_kernel

KERNEL = Path(__file__).resolve().parents[3] / "tests" / "data" / "detection" / "kernel.jsonl"
SXIDS = default_sxid_catalog()


def _case(id: str, event: str, severity: str | None = None, log: str = "x") -> KernelCase:
    labels = {"node_event": event} | ({"severity": severity} if severity else {})
    return KernelCase.model_validate({"id": id, "source_url": "hand-written", "log": log, "labels": labels})


def test_an_excerpt_reads_as_its_strongest_event() -> None:
    log = "\n".join(
        [
            "pcieport 0000:00:1c.5: AER: Corrected error received: id=00e5",
            "some unrelated line",
            "pcieport 0000:00:03.0: AER: Multiple Uncorrected (Fatal) error received: 0000:00:03.0",
            "INFO: task python3:48213 blocked for more than 122 seconds.",
        ]
    )
    r = read_kernel(log, sxids=SXIDS)
    assert (r.node_event, r.severity and r.severity.value) == ("pcie_aer", "drain")
    plugged = "mlx5_core 0000:01:00.0: Port module event: module 0, Cable plugged"
    assert read_kernel(plugged, sxids=SXIDS).node_event == "none"


def test_scores_per_event_and_severity_where_labelled() -> None:
    cases = [
        _case("a", "hung_task", "watch", "INFO: task python:1 blocked for more than 120 seconds."),
        _case("b", "fs_readonly", "drain", "EXT4-fs (sda1): Remounting filesystem read-only"),
        _case("c", "none", log="nfs: server home01 OK"),
        _case("d", "mce", "drain", "mce: [Hardware Error]: Machine check events logged"),
    ]
    report = score_kernel(cases, [read_kernel(c.log, sxids=SXIDS) for c in cases])
    assert (report["correct"], report["cases"]) == (4, 4)
    assert report["severity_accuracy"] == {"labelled": 3, "correct": 2, "accuracy": 0.6667}
    assert report["misread"] == [
        {"id": "d", "true": "mce", "predicted": "mce", "severity": {"label": "drain", "predicted": "info"}}
    ]
    assert report["per_event"]["none"] == {"support": 1, "predicted": 1, "precision": 1.0, "recall": 1.0, "f1": 1.0}
    text = "\n".join(format_kernel_report(report, _table))
    assert "node event accuracy: 4/4 = 1.00" in text and "d: mce -> mce (severity drain -> info)" in text


def test_a_wrong_reading_counts_against_both_events() -> None:
    cases = [_case("a", "soft_lockup", log="nothing here")]
    report = score_kernel(cases, [read_kernel(cases[0].log, sxids=SXIDS)])
    assert report["per_event"]["soft_lockup"]["recall"] == 0.0
    assert report["per_event"]["none"]["precision"] == 0.0


def test_the_kernel_corpus_loads_and_names_real_sources(tmp_path: Path) -> None:
    cases = load_corpus(KERNEL, KernelCase)
    assert len(cases) >= 15
    assert all(c.source_url.startswith("https://") and c.notes for c in cases)
    assert {str(c.labels.node_event) for c in cases} >= {"sxid", "pcie_aer", "mce", "hung_task", "fs_readonly", "none"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "source_url": "u", "log": "l", "labels": {"node_event": "dmesg"}}) + "\n")
    with pytest.raises(CorpusError, match="bad.jsonl:1: malformed case"):
        load_corpus(bad, KernelCase)
