"""workers/telemetry.py without a Temporal server: which exporter, port conflicts, and real OTLP/HTTP pushes."""

from __future__ import annotations

import gc
import logging
import socket
import time

import pytest
from pydantic import ValidationError
from temporalio.runtime import OpenTelemetryConfig, PrometheusConfig

from tests.unit.notify.webhook_server import Answer, webhook_server
from workers.settings import Settings, TelemetrySettings
from workers.telemetry import build_runtime, build_tracing, install_telemetry, metrics_config
from workflows.domain.errors import ReboundError
from workflows.metrics import DETECTION_LATENCY, HISTOGRAM_BUCKETS, INCIDENTS


def test_prometheus_by_default_otlp_when_configured_none_when_both_off() -> None:
    prom = metrics_config(TelemetrySettings())
    assert isinstance(prom, PrometheusConfig)
    assert prom.bind_address == "127.0.0.1:9464" and prom.durations_as_seconds
    assert prom.histogram_bucket_overrides == {k: list(v) for k, v in HISTOGRAM_BUCKETS.items()}
    otlp = metrics_config(TelemetrySettings(otlp_endpoint="http://collector:4318/"))
    assert isinstance(otlp, OpenTelemetryConfig)
    assert otlp.url == "http://collector:4318/v1/metrics" and otlp.http and otlp.durations_as_seconds
    assert metrics_config(TelemetrySettings(prometheus_bind="")) is None


def test_no_tracing_without_somewhere_to_send_it() -> None:
    assert build_tracing(TelemetrySettings()) == (None, ())
    assert build_tracing(TelemetrySettings(otlp_endpoint="http://c:4318", traces=False)) == (None, ())


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prometheus_bind", "localhost:9464", "IP address and port"),
        ("prometheus_bind", "127.0.0.1", "IP address and port"),
        ("prometheus_bind", "127.0.0.1:70000", "IP address and port"),
        ("otlp_endpoint", "collector:4318", "http(s) URL"),
        ("service_name", "", "at least 1 character"),
    ],
)
def test_bad_settings_are_clear_errors(field: str, value: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TelemetrySettings.model_validate({field: value})


def test_taken_port_runs_without_prometheus_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        caplog.set_level(logging.WARNING, logger="rebound.telemetry")
        runtime, where = build_runtime(TelemetrySettings(prometheus_bind=f"127.0.0.1:{port}"), {})
    assert runtime is not None and where == "off"
    assert f"no Prometheus endpoint on 127.0.0.1:{port}" in caplog.text and "in use" in caplog.text


def test_unusable_address_reaching_the_runtime_is_a_configuration_error() -> None:
    # Settings validation rejects host names; a settings object built without validation must still fail clearly.
    bad = TelemetrySettings.model_construct(otlp_endpoint=None, prometheus_bind="localhost:9464")
    with pytest.raises(ReboundError, match="CONFIGURATION: telemetry.prometheus_bind='localhost:9464'"):
        build_runtime(bad, {})


def test_otlp_pushes_metrics_and_traces_to_the_collector() -> None:
    with webhook_server(Answer(200, "")) as collector:
        settings = Settings(
            cluster_name="c1", telemetry=TelemetrySettings(otlp_endpoint=f"http://127.0.0.1:{collector.port}")
        )
        telemetry = install_telemetry(settings, role="worker")
        assert telemetry.metrics == f"otlp http://127.0.0.1:{collector.port}/v1/metrics"
        assert telemetry.interceptors and telemetry.tracer_provider is not None
        telemetry.runtime.metric_meter.create_counter(INCIDENTS).add(1, {"kind": "hang"})
        telemetry.runtime.metric_meter.create_histogram_float(DETECTION_LATENCY).record(3.0)
        with telemetry.tracer_provider.get_tracer("t").start_as_current_span("probe"):
            pass
        telemetry.shutdown()  # flushes the batch span processor
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "/v1/metrics" not in {r.path for r in collector.received}:
            time.sleep(0.1)  # the runtime pushes metrics every second
        del telemetry  # the runtime's exporter stops with it, before the collector goes away
        gc.collect()
    by_path = {r.path: r for r in collector.received}
    assert {"/v1/traces", "/v1/metrics"} <= set(by_path), [r.path for r in collector.received]
    for path in ("/v1/traces", "/v1/metrics"):
        assert by_path[path].headers["content-type"] == "application/x-protobuf"
    assert b"probe" in by_path["/v1/traces"].body and b"rebound" in by_path["/v1/traces"].body
    metrics_bodies = b"".join(r.body for r in collector.received if r.path == "/v1/metrics")
    assert INCIDENTS.encode() in metrics_bodies and b"c1" in metrics_bodies
