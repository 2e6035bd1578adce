"""The central ``dcgm_scrape_node`` activity over a real HTTP exporter, its settings and its wiring."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.gpu.dcgm_activities import DcgmActivities, DcgmScrapeNodeInput, exporter_url
from tests.gpu.exporter import Exporter, page
from workers.settings import GpuSettings, Settings
from workers.wiring import build_gpu_activities
from workflows.domain.gpu import DcgmScrapeNodeResult, GpuAction, GpuEventKind, GpuHealthStatus

NODE = "dgx-h100-017"


def _template(exporter: Exporter) -> str:
    return exporter.url.replace("/metrics", "/{node}/metrics")


async def _scrape(acts: DcgmActivities, params: DcgmScrapeNodeInput) -> DcgmScrapeNodeResult:
    return await ActivityEnvironment().run(acts.scrape_node, params)


def test_registered_under_the_convention_name() -> None:
    assert activity._Definition.must_from_callable(DcgmActivities.scrape_node).name == "dcgm_scrape_node"


async def test_scrape_loop_healthy_then_faults_then_exporter_down(exporter: Exporter) -> None:
    acts = DcgmActivities(_template(exporter), timeout_s=2)
    exporter.serve(page("h100-8gpu-healthy.prom"))
    first = await _scrape(acts, DcgmScrapeNodeInput(node=NODE))
    assert exporter.state.paths == [f"/{NODE}/metrics"]  # the template, filled in
    assert (first.report.host, first.report.driver_version, first.report.error) == (NODE, "550.54.15", "")
    assert (len(first.report.samples), first.report.events) == (8, ())
    assert (first.verdict.status, first.verdict.action, first.verdict.source) == (
        GpuHealthStatus.HEALTHY,
        GpuAction.NONE,
        "dcgm",
    )
    assert first.next_previous == first.report.samples

    exporter.serve(page("h100-8gpu-faults.prom"))
    second = await _scrape(acts, DcgmScrapeNodeInput(node=NODE, previous=first.next_previous))
    assert [(e.kind, e.index, e.xid) for e in second.report.events] == [
        (GpuEventKind.XID, 1, 13),
        (GpuEventKind.XID, 3, 79),
        (GpuEventKind.XID, 5, 48),
        (GpuEventKind.GPU_MISSING, 7, None),
    ]
    v = second.verdict
    assert (v.status, v.action) == (GpuHealthStatus.FAILED, GpuAction.DRAIN_NODE)
    by_index = {g.index: g for g in v.gpus}
    assert {i: (g.status.value, g.action.value) for i, g in by_index.items()} == {
        0: ("healthy", "none"),
        1: ("degraded", "restart_job"),  # XID 13: restart the job
        2: ("healthy", "none"),
        3: ("failed", "drain_node"),  # XID 79: fell off the bus
        4: ("degraded", "watch"),  # corrected ECC errors and PCIe replays grew
        5: ("failed", "reset_gpu"),  # DBE: XID 48 and the volatile counter
        6: ("degraded", "watch"),  # thermal slowdown at 91 C
        7: ("failed", "drain_node"),  # gone from the page
    }
    assert any("XID 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: GPU has fallen off the bus)" in r for r in v.reasons)
    assert {f.rule for f in by_index[4].findings} == {"ecc_sbe_growth", "pcie_replay_growth"}
    assert {f.rule for f in by_index[6].findings} == {"thermal_throttle", "temperature_high"}
    assert by_index[6].findings[0].reason == (
        "clocks_event_reasons=0x60 (sw_thermal_slowdown+hw_thermal_slowdown): thermal slowdown, 91 C, "
        "SM clock 1275/1980 MHz"
    )
    # What crosses the Temporal boundary survives pydantic's JSON round trip unchanged.
    assert DcgmScrapeNodeResult.model_validate_json(second.model_dump_json()) == second

    exporter.serve("upstream gone", status=503)
    third = await _scrape(acts, DcgmScrapeNodeInput(node=NODE, previous=second.next_previous))
    assert third.report.error.startswith("GPU_SOURCE_UNAVAILABLE: DCGM exporter http://127.0.0.1:")
    assert "HTTP 503: 'upstream gone'" in third.report.error
    assert [e.kind for e in third.report.events] == [GpuEventKind.SOURCE_DOWN]
    assert third.report.samples == () and third.next_previous == second.next_previous
    # The exporter dying does not make the node look healthier: the last good scrape is judged again.
    assert (third.verdict.status, third.verdict.action) == (GpuHealthStatus.FAILED, GpuAction.DRAIN_NODE)
    assert third.verdict.findings[0].rule == "source_down"
    assert third.verdict.reasons[0].endswith("(GPU findings are from the last good scrape)")


async def test_explicit_url_wins_over_the_template(exporter: Exporter) -> None:
    exporter.serve(page("a100-new-spellings.prom"))
    acts = DcgmActivities("http://unused.invalid:1/{node}/metrics")
    result = await _scrape(acts, DcgmScrapeNodeInput(node="node-b", url=exporter.url))
    assert exporter.state.paths == ["/metrics"]
    assert [(e.kind, e.index, e.xid) for e in result.report.events] == [(GpuEventKind.XID, 1, 94)]
    assert (result.verdict.status, result.verdict.action) == (GpuHealthStatus.FAILED, GpuAction.DRAIN_NODE)


async def test_first_scrape_with_an_unreachable_exporter() -> None:
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    acts = DcgmActivities(f"http://127.0.0.1:{port}/{{node}}/metrics", timeout_s=1)
    result = await _scrape(acts, DcgmScrapeNodeInput(node="n1"))
    assert "cannot connect" in result.report.error
    assert (result.verdict.status, result.verdict.action, result.verdict.gpus) == (
        GpuHealthStatus.DEGRADED,
        GpuAction.WATCH,
        (),
    )
    assert result.verdict.reasons[0].startswith("no GPU data: GPU_SOURCE_UNAVAILABLE")


@pytest.mark.parametrize(
    ("template", "params", "words"),
    [
        (None, DcgmScrapeNodeInput(node="n1"), "no DCGM exporter URL for node n1: set gpu.dcgm_url_template"),
        ("http://{node}:9400/metrics", DcgmScrapeNodeInput(node="n1/../x"), "node name 'n1/../x' cannot be put"),
        ("http://{node}:9400/metrics", DcgmScrapeNodeInput(node="n1@evil"), "cannot be put into a URL"),
        (None, DcgmScrapeNodeInput(node="n1", url="gopher://n1/metrics"), "is not an http(s) URL"),
    ],
)
async def test_calls_that_can_never_work_fail_non_retryably(
    template: str | None, params: DcgmScrapeNodeInput, words: str
) -> None:
    with pytest.raises(ApplicationError) as caught:
        await _scrape(DcgmActivities(template), params)
    assert (caught.value.type, caught.value.non_retryable) == ("CONFIGURATION", True)
    assert words in caught.value.message


def test_exporter_url() -> None:
    assert exporter_url("gpu-a01.cluster", "", "http://{node}:9400/metrics") == "http://gpu-a01.cluster:9400/metrics"
    assert exporter_url("x", "http://y/metrics", None) == "http://y/metrics"


# ------------------------------------------------------------------------------------------- settings, wiring


def test_gpu_settings_defaults_env_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().gpu == GpuSettings(dcgm_url_template=None, dcgm_timeout_s=5.0, dcgm_max_page_bytes=8388608)
    monkeypatch.setenv("REBOUND_GPU__DCGM_URL_TEMPLATE", "http://{node}:9400/metrics")
    monkeypatch.setenv("REBOUND_GPU__DCGM_TIMEOUT_S", "2.5")
    gpu = Settings().gpu
    assert (gpu.dcgm_url_template, gpu.dcgm_timeout_s) == ("http://{node}:9400/metrics", 2.5)
    for bad in ("http://n1:9400/metrics", "{node}:9400/metrics"):
        with pytest.raises(ValidationError, match="must be an http\\(s\\) URL containing \\{node\\}"):
            GpuSettings(dcgm_url_template=bad)
    with pytest.raises(ValidationError):
        GpuSettings(dcgm_timeout_s=0)


async def test_wiring_registers_the_activity_with_or_without_a_template(exporter: Exporter) -> None:
    unset, _ = build_gpu_activities(GpuSettings())
    assert activity._Definition.must_from_callable(unset).name == "dcgm_scrape_node"
    with pytest.raises(ApplicationError, match="set gpu.dcgm_url_template"):
        await ActivityEnvironment().run(unset, DcgmScrapeNodeInput(node="n1"))
    exporter.serve(page("h100-8gpu-healthy.prom"))
    configured, _ = build_gpu_activities(GpuSettings(dcgm_url_template=_template(exporter), dcgm_timeout_s=2))
    result = await ActivityEnvironment().run(configured, DcgmScrapeNodeInput(node=NODE))
    assert len(result.report.samples) == 8 and exporter.state.paths == [f"/{NODE}/metrics"]
