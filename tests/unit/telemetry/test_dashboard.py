"""deploy/grafana/rebound-dashboard.json: valid, importable, and every metric it queries is one Rebound emits."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.telemetry import TEMPORAL_SDK_METRICS
from workflows.metrics import HISTOGRAM_BUCKETS, REBOUND_METRICS

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "rebound-dashboard.json"
_METRIC = re.compile(r"\b((?:rebound|temporal)_[a-zA-Z0-9_]+)")
_BY = re.compile(r"\bby\s*\(([^)]*)\)")
# The labels each metric carries: its own, the workflow meter's, the runtime's global tags, histogram buckets.
_LABELS = {"le", "kind", "cause", "failure_class", "node", "scope", "activity_type", "workflow_type", "task_queue"}
_LABELS |= {"namespace", "cluster", "role", "service_name"}


def _histograms() -> set[str]:
    return set(HISTOGRAM_BUCKETS) | {m for m in TEMPORAL_SDK_METRICS if m.endswith("_latency")}


def _emitted() -> set[str]:
    names = set(REBOUND_METRICS) | set(TEMPORAL_SDK_METRICS)
    return names | {f"{h}_{suffix}" for h in _histograms() for suffix in ("bucket", "sum", "count")}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def _panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in d["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _queries(d: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in _panels(d) for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in d["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def test_is_an_importable_dashboard_with_a_prometheus_datasource_variable(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "rebound-overview" and dashboard["title"] == "Rebound"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in _panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}" and target["expr"].strip(), panel["title"]
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
        assert 'cluster=~"$cluster"' in "".join(t["expr"] for t in panel["targets"]), panel["title"]


def test_every_metric_queried_is_emitted(dashboard: dict[str, Any]) -> None:
    used = {name for expr in _queries(dashboard) for name in _METRIC.findall(expr)}
    assert used, "no metric found: the name pattern is wrong"
    assert used <= _emitted(), sorted(used - _emitted())


def test_every_rebound_metric_has_a_panel_and_the_named_temporal_ones_too(dashboard: dict[str, Any]) -> None:
    used = {name for expr in _queries(dashboard) for name in _METRIC.findall(expr)}
    base = {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith(("_bucket", "_sum", "_count")) else n for n in used}
    assert set(REBOUND_METRICS) <= base, sorted(set(REBOUND_METRICS) - base)
    assert set(TEMPORAL_SDK_METRICS) <= base, sorted(set(TEMPORAL_SDK_METRICS) - base)
    # Latencies are shown as a heatmap and as percentiles.
    kinds = {
        (p["type"], m) for p in _panels(dashboard) for t in p.get("targets", []) for m in _METRIC.findall(t["expr"])
    }
    for histogram in HISTOGRAM_BUCKETS:
        assert ("heatmap", f"{histogram}_bucket") in kinds
        assert any(
            "histogram_quantile" in t["expr"] and histogram in t["expr"]
            for p in _panels(dashboard)
            if p["type"] == "timeseries"
            for t in p["targets"]
        )


def test_grouping_labels_exist_on_the_metrics(dashboard: dict[str, Any]) -> None:
    for expr in _queries(dashboard):
        for group in _BY.findall(expr):
            labels = {label.strip() for label in group.split(",")}
            assert labels <= _LABELS, (expr, labels - _LABELS)
