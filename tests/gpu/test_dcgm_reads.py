"""``dcgm_read_gpus``: the central DCGM read that attribution and health checks make beside NVML, over a real HTTP
exporter; which nodes have one (``gpu.dcgm_nodes``, re-read from the settings file); the DCGM-only fields."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.testing import ActivityEnvironment

from activities.gpu.dcgm_activities import DcgmActivities, DcgmTargets
from activities.gpu.dcgm_page import parse_exporter_page
from tests.gpu.exporter import Exporter, page
from workers.settings import GpuSettings
from workers.wiring import build_gpu_activities
from workflows.domain.gpu import GpuAction, GpuHealthReport, GpuHealthStatus, GpuSample
from workflows.domain.gpu_sources import DcgmReadInput, DcgmReadResult

NODE = "dgx-h100-017"


def _template(exporter: Exporter) -> str:
    return exporter.url.replace("/metrics", "/{node}/metrics")


async def _read(acts: DcgmActivities, params: DcgmReadInput) -> DcgmReadResult:
    return await ActivityEnvironment().run(acts.read_gpus, params)


def test_registered_under_the_convention_name() -> None:
    assert activity._Definition.must_from_callable(DcgmActivities.read_gpus).name == "dcgm_read_gpus"


def test_the_page_gives_nvlink_replays_recoveries_and_violation_times() -> None:
    p = parse_exporter_page(page("h100-2gpu-links-violations.prom"), "gpu-a01")
    g0, g1 = p.samples
    assert (g0.nvlink_replay_errors, g0.nvlink_recovery_errors) == (12, 1)
    assert (g0.power_violation_us, g0.thermal_violation_us) == (4_000_000, 250_000)
    assert (g1.nvlink_replay_errors, g1.remap_failure, g1.last_xid) == (0, True, 0)


def test_targets_name_the_nodes_with_an_exporter() -> None:
    assert DcgmTargets(None).url_for("n1") == ""
    every = DcgmTargets("http://{node}:9400/metrics")
    assert every.url_for("n1") == "http://n1:9400/metrics"
    some = DcgmTargets("http://{node}:9400/metrics", ("gpu-*", "n2"))
    assert [some.url_for(n) for n in ("gpu-a01", "n2", "n1")] == [
        "http://gpu-a01:9400/metrics",
        "http://n2:9400/metrics",
        "",
    ]


async def test_state_faults_fail_the_gpu_and_the_xid_gauge_is_undated_evidence(exporter: Exporter) -> None:
    exporter.serve(page("h100-8gpu-faults.prom"))
    acts = DcgmActivities(_template(exporter), timeout_s=2)
    (read,) = (await _read(acts, DcgmReadInput(nodes=(NODE,)))).nodes
    assert read.configured and read.url.endswith(f"/{NODE}/metrics")
    assert read.report is not None and read.report.events == ()  # no baseline: the gauge is no event
    v = read.verdict
    assert v is not None and v.source == "dcgm"
    by_index = {g.index: g for g in v.gpus}
    # GPU 5: two double-bit errors since the reset -> reset; GPU 3's last XID (79) is named, not judged.
    assert (by_index[5].status, by_index[5].action) == (GpuHealthStatus.FAILED, GpuAction.RESET_GPU)
    assert {f.rule for f in by_index[5].findings} >= {"ecc_dbe_volatile"}
    assert by_index[3].status is GpuHealthStatus.HEALTHY
    assert [f.rule for f in by_index[3].findings] == ["dcgm_last_xid"]
    assert "reads 79" in by_index[3].reasons[0]


async def test_a_node_without_an_exporter_is_not_read(exporter: Exporter) -> None:
    exporter.serve(page("h100-8gpu-healthy.prom"))
    acts = DcgmActivities(targets=lambda: DcgmTargets(_template(exporter), (NODE,)))
    result = await _read(acts, DcgmReadInput(nodes=("n1", NODE)))
    assert [(r.node, r.configured) for r in result.nodes] == [("n1", False), (NODE, True)]
    assert result.get("n1") is not None and result.get("n1").report is None  # type: ignore[union-attr]
    assert exporter.state.paths == [f"/{NODE}/metrics"]
    assert result.get(NODE).verdict.status is GpuHealthStatus.HEALTHY  # type: ignore[union-attr]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("what", ["refused", "garbage", "http-500", "empty"])
async def test_an_exporter_down_or_serving_garbage_is_a_failed_lookup(exporter: Exporter, what: str) -> None:
    template = _template(exporter)
    if what == "refused":
        template = f"http://127.0.0.1:{_closed_port()}/{{node}}/metrics"
    elif what == "garbage":
        exporter.serve(page("not-metrics.html"))
    elif what == "http-500":
        exporter.serve("boom", status=500)
    else:
        exporter.serve("# no samples\n")
    acts = DcgmActivities(template, timeout_s=2)
    (read,) = (await _read(acts, DcgmReadInput(nodes=(NODE,)))).nodes
    assert read.configured and read.report is not None
    assert read.report.error.startswith("GPU_SOURCE_UNAVAILABLE: DCGM exporter"), read.report.error
    assert read.verdict is not None and read.verdict.status is not GpuHealthStatus.HEALTHY
    assert [f.rule for f in read.verdict.findings] == ["source_down"]


async def test_the_reading_comes_merged_with_the_nodes_nvml_read(exporter: Exporter) -> None:
    exporter.serve(page("h100-2gpu-links-violations.prom"))
    acts = DcgmActivities(_template(exporter), timeout_s=2)
    uuid = "GPU-0c4f6c1e-8a2d-4a55-9d1e-3f1b7e0a000"
    nvml = GpuHealthReport(
        host="gpu-a01",
        samples=tuple(GpuSample(host="gpu-a01", index=i, uuid=f"{uuid}{i}", remap_failure=False) for i in (0, 1)),
    )
    (read,) = (await _read(acts, DcgmReadInput(nodes=("gpu-a01",), nvml=(nvml,)))).nodes
    merged = read.merged
    assert merged is not None and merged.source == "nvml+dcgm"
    g1 = merged.gpus[1]
    assert (g1.status, g1.action) == (GpuHealthStatus.FAILED, GpuAction.DRAIN_NODE)
    remap = next(f for f in g1.findings if f.rule == "row_remap_failure")
    assert remap.source == "dcgm" and remap.reason.startswith("dcgm: remap_failure=True")
    assert any(r.startswith("sources disagree: nvml reads it healthy, dcgm reads it failed") for r in g1.reasons)
    assert merged.gpus[0].status is GpuHealthStatus.HEALTHY


async def test_the_wiring_rereads_which_nodes_have_an_exporter(
    exporter: Exporter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter.serve(page("h100-8gpu-healthy.prom"))
    config = tmp_path / "rebound.toml"
    config.write_text("")
    monkeypatch.setenv("REBOUND_CONFIG", str(config))
    for var in ("REBOUND_GPU__DCGM_URL_TEMPLATE", "REBOUND_GPU__DCGM_NODES"):
        monkeypatch.delenv(var, raising=False)
    _, read_gpus = build_gpu_activities(GpuSettings(dcgm_timeout_s=2))
    env = ActivityEnvironment()
    before = await env.run(read_gpus, DcgmReadInput(nodes=(NODE,)))
    assert [r.configured for r in before.nodes] == [False]
    config.write_text(f'[gpu]\ndcgm_url_template = "{_template(exporter)}"\ndcgm_nodes = ["dgx-*"]\n')
    after = await env.run(read_gpus, DcgmReadInput(nodes=(NODE, "n1")))
    assert [r.configured for r in after.nodes] == [True, False]
    config.write_text("[gpu]\ndcgm_url_template = 'not a url'\n")  # broken: the start-up settings stay
    broken = await env.run(read_gpus, DcgmReadInput(nodes=(NODE,)))
    assert [r.configured for r in broken.nodes] == [False]
