"""Telemetry on a real (in-memory) Temporal dev server: Rebound's workflow metrics and the Temporal SDK's scraped
from the worker's Prometheus endpoint, and one trace across client -> workflow -> activity."""

from __future__ import annotations

import re
import socket
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest_asyncio
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

# workflows.metrics is imported the way a workflow module would: inside the sandbox, to prove it sandbox-safe.
from workflows import metrics

# The sandbox re-imports this module for the probe workflows: everything else passes through.
with workflow.unsafe.imports_passed_through():
    import httpx
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from workers.settings import Settings, TelemetrySettings
    from workers.telemetry import TEMPORAL_SDK_METRICS, Telemetry, install_telemetry
    from workflows.domain.incident import (
        Anomaly,
        AnomalyKind,
        Attribution,
        Evidence,
        EvidenceSource,
        FailureClass,
        Incident,
    )

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@workflow.defn(name="MetricsProbe", sandboxed=True)
class MetricsProbe:
    """One incident's worth of metric calls, split by a timer so the second task replays the first's calls."""

    @workflow.run
    async def run(self) -> float:
        anomaly = Anomaly(
            kind=AnomalyKind.GPU_FAULT,
            observed_at=T0,
            summary="XID 79 on n2",
            evidence=(Evidence(source=EvidenceSource.LOGS, text="Xid 79", at=T0 - timedelta(seconds=5)),),
        )
        detection = metrics.record_detection(anomaly, detected_at=T0 + timedelta(seconds=2))
        attribution = Attribution(
            failure_class=FailureClass.HARDWARE,
            cause="xid-79",
            retryable=True,
            confidence=0.9,
            implicated_nodes=("n2",),
        )
        incident = Incident(number=1, id="7-1", detected_at=T0, anomaly=anomaly, attribution=attribution)
        metrics.record_incident(incident)
        metrics.record_drain("n2", "xid-79")
        metrics.set_breaker_open(True)
        metrics.set_approvals_pending(3)
        await workflow.sleep(timedelta(milliseconds=50))
        await workflow.execute_activity(
            flaky_activity,
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=10), maximum_attempts=2),
        )
        metrics.record_restart("xid-79")
        metrics.record_recovery_action(incident.model_copy(update={"restarted_at": T0 + timedelta(seconds=42)}))
        metrics.set_approvals_pending(-1)  # a caller's bookkeeping bug: clamped to 0, never a failed task
        return detection


@activity.defn(name="flaky_activity")
async def flaky_activity() -> None:
    """Fails its first attempt, so the SDK's activity failure counter has something to count."""
    if activity.info().attempt == 1:
        raise RuntimeError("first attempt fails on purpose")


@activity.defn(name="trace_probe_activity")
async def trace_probe_activity(name: str) -> str:
    return f"hello {name}"


@workflow.defn(name="TraceProbe", sandboxed=True)
class TraceProbe:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(trace_probe_activity, name, start_to_close_timeout=timedelta(seconds=10))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _target(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


async def _client(env: WorkflowEnvironment, telemetry: Telemetry) -> Client:
    return await Client.connect(
        _target(env),
        data_converter=pydantic_data_converter,
        runtime=telemetry.runtime,
        interceptors=telemetry.interceptors,
    )


@pytest_asyncio.fixture
async def prometheus(temporal_env: WorkflowEnvironment) -> AsyncIterator[tuple[Client, str]]:
    port = _free_port()
    telemetry = install_telemetry(
        Settings(cluster_name="tlm", telemetry=TelemetrySettings(prometheus_bind=f"127.0.0.1:{port}")), role="worker"
    )
    assert telemetry.metrics == f"http://127.0.0.1:{port}/metrics" and not telemetry.interceptors
    yield await _client(temporal_env, telemetry), telemetry.metrics
    telemetry.shutdown()


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The exposition as Prometheus stores it: names verbatim (client parsers rename counters to ``*_total``)."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, line
        name, labels, value = match.groups()
        found.setdefault(name, []).append((dict(_LABEL.findall(labels or "")), float(value)))
    return found


def _one(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    matching = [v for lab, v in samples.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert len(matching) == 1, (name, labels, [lab.get("le") for lab, _ in samples.get(name, [])])
    return matching[0]


async def test_workflow_metrics_reach_the_prometheus_endpoint_once(prometheus: tuple[Client, str]) -> None:
    client, url = prometheus
    queue = f"tq-{uuid.uuid4().hex}"
    # No workflow cache: every workflow task replays the history so far, so the second task re-runs the first
    # task's metric calls in replay. They must not count again.
    async with Worker(
        client, task_queue=queue, workflows=[MetricsProbe], activities=[flaky_activity], max_cached_workflows=0
    ):
        started = time.monotonic()
        detection = await client.execute_workflow(MetricsProbe.run, id=f"metrics-{queue}", task_queue=queue)
        elapsed_s = time.monotonic() - started
    assert detection == 7.0
    async with httpx.AsyncClient() as http:
        page = (await http.get(url, timeout=5)).text
    s = _samples(page)
    ours = {"task_queue": queue, "workflow_type": "MetricsProbe", "cluster": "tlm", "service_name": "rebound"}
    assert _one(s, "rebound_incidents_total", kind="gpu_fault", cause="xid-79", failure_class="hardware", **ours) == 1
    assert _one(s, "rebound_drains_total", node="n2", cause="xid-79", **ours) == 1
    assert _one(s, "rebound_restarts_total", cause="xid-79", **ours) == 1
    assert _one(s, "rebound_breaker_open", scope="cluster", **ours) == 1
    assert _one(s, "rebound_approvals_pending", **ours) == 0
    assert _one(s, "rebound_detection_latency_seconds_count", kind="gpu_fault", **ours) == 1
    assert _one(s, "rebound_detection_latency_seconds_sum", kind="gpu_fault", **ours) == 7.0
    # Our buckets (seconds), not Temporal's millisecond defaults: 7 s lies in (5, 10].
    assert _one(s, "rebound_detection_latency_seconds_bucket", le="5", **ours) == 0
    assert _one(s, "rebound_detection_latency_seconds_bucket", le="10", **ours) == 1
    assert _one(s, "rebound_recovery_action_latency_seconds_sum", kind="gpu_fault", **ours) == 42.0
    assert _one(s, "rebound_recovery_action_latency_seconds_bucket", le="60", **ours) == 1
    assert _one(s, "rebound_recovery_action_latency_seconds_bucket", le="30", **ours) == 0
    # Temporal SDK metrics come out of the same endpoint (the dashboard uses these).
    # Temporal SDK metrics come out of the same endpoint, under the names the dashboard uses.
    for name in TEMPORAL_SDK_METRICS:
        exposed = [
            n for n in (name, f"{name}_bucket") if any(lab.get("task_queue") == queue for lab, _ in s.get(n, []))
        ]
        assert exposed, (name, sorted(n for n in s if n.startswith("temporal_")))
    assert _one(s, "temporal_activity_execution_failed", activity_type="flaky_activity", task_queue=queue) == 1
    # Durations in seconds, not milliseconds: the workflow tasks' total time cannot exceed the wall-clock time the
    # workflow took (in milliseconds it would be ~1000x more). Bounded by a measurement, not by "a task takes under a
    # second", which a loaded 2-core machine breaks (no workflow cache: every task rebuilds the sandbox, 1-2 s).
    assert _one(s, "temporal_workflow_task_execution_latency_count", task_queue=queue) >= 2
    assert 0 < _one(s, "temporal_workflow_task_execution_latency_sum", task_queue=queue) <= elapsed_s


async def test_client_workflow_and_activity_spans_share_one_trace(temporal_env: WorkflowEnvironment) -> None:
    exporter = InMemorySpanExporter()
    telemetry = install_telemetry(
        Settings(telemetry=TelemetrySettings(prometheus_bind="")), role="worker", span_exporter=exporter
    )
    assert telemetry.metrics == "off" and telemetry.interceptors
    client = await _client(temporal_env, telemetry)
    queue = f"tq-{uuid.uuid4().hex}"
    async with Worker(client, task_queue=queue, workflows=[TraceProbe], activities=[trace_probe_activity]):
        assert await client.execute_workflow(TraceProbe.run, "n2", id=f"trace-{queue}", task_queue=queue) == "hello n2"
    telemetry.shutdown()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    # TracingInterceptor's tree: the client's start is the root; the workflow's spans hang off it (workflow spans
    # are instantaneous, so the activity's start is the workflow's child through the propagated client context).
    parent_of = {
        "RunWorkflow:TraceProbe": "StartWorkflow:TraceProbe",
        "StartActivity:trace_probe_activity": "StartWorkflow:TraceProbe",
        "RunActivity:trace_probe_activity": "StartActivity:trace_probe_activity",
        "CompleteWorkflow:TraceProbe": "StartWorkflow:TraceProbe",
    }
    assert set(spans) == {*parent_of, "StartWorkflow:TraceProbe"}, sorted(spans)
    root = spans["StartWorkflow:TraceProbe"]
    assert root.parent is None and root.resource.attributes["service.name"] == "rebound"
    assert root.context is not None
    for child, parent in parent_of.items():
        child_ctx, parent_ctx, link = spans[child].context, spans[parent].context, spans[child].parent
        assert child_ctx is not None and parent_ctx is not None and link is not None
        assert child_ctx.trace_id == root.context.trace_id, child
        assert link.span_id == parent_ctx.span_id, (child, parent)
