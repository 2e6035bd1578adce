"""Metrics and traces for a Rebound process (the worker, a node agent), from the ``telemetry`` settings section.

Metrics: one Temporal ``Runtime`` per process carries the Temporal SDK's metrics and Rebound's own (recorded from
workflows through ``workflow.metric_meter()``, see ``workflows/metrics.py``) to one exporter: OTLP/HTTP when
``telemetry.otlp_endpoint`` is set, else a Prometheus ``/metrics`` endpoint on ``telemetry.prometheus_bind``.
Durations are in seconds, and Rebound's histograms get buckets sized for seconds to an hour.

Traces: ``temporalio.contrib.opentelemetry.TracingInterceptor`` on the client (workers built from it inherit it),
so a client's start, the workflow and each activity share one trace. Spans are exported over OTLP only; with no
endpoint no interceptor is installed and tracing costs nothing. The tracer is passed to the interceptor explicitly,
so this module never sets OpenTelemetry's process-global providers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from temporalio.client import Interceptor
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.runtime import OpenTelemetryConfig, PrometheusConfig, Runtime, TelemetryConfig

from workers.settings import Settings, TelemetrySettings
from workflows.domain.errors import FailureKind, ReboundError
from workflows.metrics import HISTOGRAM_BUCKETS

log = logging.getLogger("rebound.telemetry")

_BUCKETS = {name: list(bounds) for name, bounds in HISTOGRAM_BUCKETS.items()}

#: Temporal SDK metrics the Grafana dashboard reads (names as exposed to Prometheus, durations in seconds).
#: A test runs a worker and checks that each of them is really emitted under this name.
TEMPORAL_SDK_METRICS = (
    "temporal_workflow_task_execution_latency",
    "temporal_workflow_task_schedule_to_start_latency",
    "temporal_workflow_completed",
    "temporal_activity_execution_latency",
    "temporal_activity_execution_failed",
)


@dataclass
class Telemetry:
    """What a process passes to ``workers.client.connect``, and closes on the way out."""

    runtime: Runtime
    interceptors: Sequence[Interceptor] = ()
    metrics: str = "off"
    """Where metrics go, for the start-up log line: ``http://host:port/metrics``, ``otlp <url>`` or ``off``."""
    tracer_provider: TracerProvider | None = field(default=None, repr=False)

    def shutdown(self) -> None:
        """Flush pending spans (bounded by the exporter's own timeout). Metrics need no flush: Prometheus is
        scraped, and the runtime's OTLP exporter pushes every second."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()


def metrics_config(settings: TelemetrySettings) -> OpenTelemetryConfig | PrometheusConfig | None:
    """The runtime's metrics exporter: OTLP when an endpoint is configured, else Prometheus, else none."""
    if settings.otlp_endpoint:
        return OpenTelemetryConfig(
            url=f"{settings.otlp_endpoint.rstrip('/')}/v1/metrics",
            http=True,
            durations_as_seconds=True,
            histogram_bucket_overrides=_BUCKETS,
        )
    if settings.prometheus_bind:
        return PrometheusConfig(
            bind_address=settings.prometheus_bind, durations_as_seconds=True, histogram_bucket_overrides=_BUCKETS
        )
    return None


def build_runtime(settings: TelemetrySettings, tags: dict[str, str]) -> tuple[Runtime, str]:
    """The process's Temporal runtime and a description of where its metrics go.

    A Prometheus port already taken (several agents on one host, a second worker) is not fatal: the process runs
    without the endpoint and says so. Telemetry must never stop recovery.

    Raises:
        ReboundError: CONFIGURATION when the bind address cannot be used at all (unresolvable host).
    """
    metrics = metrics_config(settings)

    def runtime(metrics: OpenTelemetryConfig | PrometheusConfig | None) -> Runtime:
        return Runtime(telemetry=TelemetryConfig(metrics=metrics, global_tags=tags, attach_service_name=False))

    if isinstance(metrics, OpenTelemetryConfig):
        return runtime(metrics), f"otlp {metrics.url}"
    if metrics is None:
        return runtime(None), "off"
    try:
        return runtime(metrics), f"http://{metrics.bind_address}/metrics"
    except ValueError as e:
        if "Invalid Prometheus address" in str(e):
            raise ReboundError(
                FailureKind.CONFIGURATION, f"telemetry.prometheus_bind={settings.prometheus_bind!r}: {e}"
            ) from e
        log.warning("no Prometheus endpoint on %s (%s); running without metrics", settings.prometheus_bind, e)
        return runtime(None), "off"


def build_tracing(
    settings: TelemetrySettings, *, span_exporter: SpanExporter | None = None
) -> tuple[TracerProvider | None, Sequence[Interceptor]]:
    """A tracer provider and the tracing interceptor, when traces are on and have somewhere to go.

    ``span_exporter`` (tests, debugging) replaces the OTLP exporter and is flushed span by span.
    """
    endpoint = settings.otlp_endpoint
    if not settings.traces or (span_exporter is None and not endpoint):
        return None, ()
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    elif endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")))
    return provider, (TracingInterceptor(provider.get_tracer("rebound")),)


def install_telemetry(settings: Settings, *, role: str, span_exporter: SpanExporter | None = None) -> Telemetry:
    """Telemetry for one process; ``role`` (``worker``, ``node_agent``) tags its metrics."""
    tags = {"service_name": settings.telemetry.service_name, "cluster": settings.cluster_name, "role": role}
    runtime, where = build_runtime(settings.telemetry, tags)
    provider, interceptors = build_tracing(settings.telemetry, span_exporter=span_exporter)
    log.info("%s telemetry: metrics %s, traces %s", role, where, "on" if interceptors else "off")
    return Telemetry(runtime=runtime, interceptors=interceptors, metrics=where, tracer_provider=provider)
