"""DcgmExporterSource: mapping real-format exporter pages, diffing scrapes, and scraping over real HTTP on loopback."""

from __future__ import annotations

import socket
import time
from datetime import UTC, datetime

import httpx
import pytest

from activities.gpu.dcgm import DcgmExporterSource, diff_scrapes
from activities.gpu.dcgm_page import parse_exporter_page
from activities.gpu.promtext import ExpositionError
from tests.gpu.exporter import Exporter, page
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import GpuEventKind, GpuSample

NODE = "dgx-h100-017"
MIB = 1024 * 1024
UUID3 = "GPU-36f675cc-81e7-4ef5-a8e2-5d940ed90475"
UUID7 = "GPU-a170b338-3926-4059-b28c-105d1fb17c23"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------- mapping a page


def test_healthy_h100_page_maps_every_field() -> None:
    at = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    parsed = parse_exporter_page(page("h100-8gpu-healthy.prom"), NODE, observed_at=at)
    assert (parsed.driver_version, parsed.exporter_hostname) == ("550.54.15", NODE)
    assert [s.index for s in parsed.samples] == list(range(8))
    s = parsed.samples[3]
    assert (s.host, s.uuid, s.pci_bus_id, s.name, s.observed_at) == (
        NODE,
        UUID3,
        "00000000:5D:00.0",
        "NVIDIA H100 80GB HBM3",
        at,
    )
    assert (s.temperature_c, s.utilization_gpu_pct, s.utilization_mem_pct) == (54, 97, 41)
    assert (s.memory_used_bytes, s.memory_free_bytes) == (79495 * MIB, 2064 * MIB)
    assert s.memory_total_bytes == 81559 * MIB == 85520809984  # what NVML reports for an H100 80GB
    assert (s.power_mw, s.sm_clock_mhz, s.sm_clock_max_mhz, s.clocks_event_reasons) == (620750, 1980, 1980, 0)
    assert (s.ecc_corrected_volatile, s.ecc_uncorrected_volatile) == (0, 0)
    assert (s.ecc_corrected_aggregate, s.ecc_uncorrected_aggregate) == (0, 0)
    assert (s.retired_pages_sbe, s.retired_pages_dbe, s.retired_pages_pending) == (0, 0, False)
    assert (s.remapped_rows_correctable, s.remapped_rows_uncorrectable, s.remap_pending, s.remap_failure) == (
        0,
        0,
        False,
        False,
    )
    assert (s.pcie_replay_count, s.nvlink_crc_errors, s.last_xid) == (0, 0, 0)
    assert (s.lost, s.missing, s.unsupported, s.errors) == (False, False, (), ())
    assert parsed.samples[2].ecc_corrected_aggregate == 3


def test_fault_page_values_and_a_blank_sentinel() -> None:
    samples = parse_exporter_page(page("h100-8gpu-faults.prom"), NODE).samples
    assert [s.index for s in samples] == list(range(7))  # GPU 7 is not on this page
    by_index = {s.index: s for s in samples}
    assert [by_index[i].last_xid for i in range(7)] == [0, 13, 0, 79, 0, 48, 0]
    assert (by_index[5].ecc_uncorrected_volatile, by_index[5].remap_pending) == (2, True)
    gpu6 = by_index[6]
    assert (gpu6.temperature_c, gpu6.clocks_event_reasons, gpu6.sm_clock_mhz) == (91, 0x60, 1275)
    # An older exporter printed DCGM's FP64 NOT_SUPPORTED sentinel (2**47 + 2) as if it were a power reading.
    assert (gpu6.power_mw, gpu6.unsupported, gpu6.errors) == (None, ("power_mw",), ())


def test_new_spellings_mig_links_and_kubernetes_labels() -> None:
    parsed = parse_exporter_page(page("a100-new-spellings.prom"), "node-b")
    assert (parsed.driver_version, parsed.exporter_hostname) == ("570.124.06", "node-b")
    gpu0, gpu1 = parsed.samples
    assert (gpu0.uuid, gpu0.name) == ("GPU-1a2b3c4d-0000-4000-8000-00000000a100", "NVIDIA A100-SXM4-40GB")
    # DCGM >= 4.6 names: *_CELSIUS, BOARD_POWER_WATTS, XID_ERROR, ROW_REMAP_FAILED, PCIE_REPLAY_TOTAL, ...
    assert (gpu0.temperature_c, gpu0.power_mw, gpu0.last_xid, gpu0.remap_failure) == (47, 87125, 0, False)
    assert (gpu1.temperature_c, gpu1.last_xid, gpu1.remap_failure) == (49, 94, True)
    # The per-link sample of the same field is not added to the GPU's total.
    assert (gpu0.nvlink_crc_errors, gpu1.nvlink_crc_errors) == (12, 0)
    # The whole-GPU utilisation wins over a MIG instance's; a GPU with MIG samples only takes that.
    assert (gpu0.utilization_gpu_pct, gpu1.utilization_gpu_pct) == (64, 99)
    assert gpu1.errors == ("power_mw: NaN (DCGM_FI_DEV_BOARD_POWER_WATTS)",)
    assert gpu1.unsupported == ("pcie_replay_count",)  # 9223372036854775794 = DCGM_INT64_NOT_SUPPORTED
    assert gpu0.pcie_replay_count == 4


@pytest.mark.parametrize(
    ("line", "field", "problem"),
    [
        ("9223372036854775792", "temperature_c", ""),  # INT64 BLANK: unknown, not an error
        ("9223372036854775793", "temperature_c", "temperature_c: NOT_FOUND"),
        ("9223372036854775795", "temperature_c", "temperature_c: NOT_PERMISSIONED"),
        ("2147483634", "temperature_c", "NOT_SUPPORTED"),  # INT32 NOT_SUPPORTED
        ("+Inf", "temperature_c", "temperature_c: infinite value"),
        ("1" + "0" * 30, "temperature_c", "temperature_c: value out of range"),
    ],
)
def test_sentinels_and_impossible_values_are_not_readings(line: str, field: str, problem: str) -> None:
    text = f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="GPU-x"}} {line}\n'
    (s,) = parse_exporter_page(text, "n").samples
    assert s.temperature_c is None
    if problem == "NOT_SUPPORTED":
        assert (s.unsupported, s.errors) == (("temperature_c",), ())
    elif problem:
        assert s.errors[0].startswith(problem)
    else:
        assert (s.unsupported, s.errors) == ((), ())


def test_negative_counter_is_an_error_not_a_value() -> None:
    (s,) = parse_exporter_page('DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} -3\n', "n").samples
    assert (s.pcie_replay_count, s.errors) == (
        None,
        ("pcie_replay_count: negative value -3 (DCGM_FI_DEV_PCIE_REPLAY_COUNTER)",),
    )


def test_samples_without_a_gpu_and_foreign_metrics_are_ignored() -> None:
    text = (
        'DCGM_FI_DEV_GPU_TEMP{device="nvidia2",UUID="GPU-y"} 60\n'  # index from `device` when `gpu` is absent
        "DCGM_FI_DEV_GPU_TEMP 99\n"  # no GPU at all
        'DCGM_FI_DEV_CPU_TEMP_CURRENT{cpu="0",Hostname="n"} 50\n'
        'DCGM_FI_DEV_NVSWITCH_TEMPERATURE_CURRENT{nvswitch="0"} 40\n'
        'node_load1{gpu="0"} 3\n'
    )
    (s,) = parse_exporter_page(text, "n").samples
    assert (s.index, s.uuid, s.temperature_c) == (2, "GPU-y", 60)


def test_garbage_is_an_exposition_error() -> None:
    with pytest.raises(ExpositionError, match="line 1: expected a metric name"):
        parse_exporter_page(page("not-metrics.html"), NODE)


# ------------------------------------------------------------------------------------------- diffing scrapes


def _s(index: int, uuid: str = "", last_xid: int | None = 0, **fields: object) -> GpuSample:
    return GpuSample.model_validate({"host": "n", "index": index, "uuid": uuid, "last_xid": last_xid, **fields})


def test_first_scrape_reports_a_nonzero_xid_once() -> None:
    samples, events = diff_scrapes("n", [], [_s(0, "a"), _s(1, "b", last_xid=79)])
    assert [(e.kind, e.index, e.uuid, e.xid, e.source) for e in events] == [(GpuEventKind.XID, 1, "b", 79, "dcgm")]
    assert len(samples) == 2
    _, again = diff_scrapes("n", samples, [_s(0, "a"), _s(1, "b", last_xid=79)])
    assert again == ()  # the gauge still says 79: nothing new


def test_xid_change_to_nonzero_is_an_event_a_reset_to_zero_is_not() -> None:
    before = [_s(0, "a", last_xid=13)]
    assert [e.xid for e in diff_scrapes("n", before, [_s(0, "a", last_xid=48)])[1]] == [48]
    assert diff_scrapes("n", before, [_s(0, "a", last_xid=0)])[1] == ()
    assert [e.xid for e in diff_scrapes("n", [_s(0, "a", last_xid=None)], [_s(0, "a", last_xid=31)])[1]] == [31]


def test_a_vanished_gpu_is_reported_once_and_kept_as_missing_until_back() -> None:
    at = datetime(2026, 5, 1, tzinfo=UTC)
    first = [_s(0, "a"), _s(1, "b", last_xid=79, temperature_c=55, pci_bus_id="00000000:2A:00.0")]
    samples, events = diff_scrapes("n", first, [_s(0, "a")], observed_at=at)
    assert [(e.kind, e.index, e.uuid, e.pci_bus_id, e.observed_at) for e in events] == [
        (GpuEventKind.GPU_MISSING, 1, "b", "00000000:2A:00.0", at)
    ]
    gone = samples[1]
    assert (gone.missing, gone.index, gone.uuid, gone.last_xid, gone.temperature_c) == (True, 1, "b", 79, None)
    samples2, events2 = diff_scrapes("n", samples, [_s(0, "a")])
    assert events2 == () and samples2[1].missing  # still gone: no second event, still in the samples
    back, events3 = diff_scrapes("n", samples2, [_s(0, "a"), _s(1, "b", last_xid=79)])
    assert events3 == () and not any(s.missing for s in back)  # back with the same last XID: not news


def test_gpus_are_matched_by_uuid_not_position() -> None:
    # The exporter renumbered (a GPU left the bus and indices shifted): the UUIDs tell which one is gone.
    before = [_s(0, "a"), _s(1, "b"), _s(2, "c")]
    _, events = diff_scrapes("n", before, [_s(0, "a"), _s(1, "c")])
    assert [(e.kind, e.uuid) for e in events] == [(GpuEventKind.GPU_MISSING, "b")]


# ------------------------------------------------------------------------------------------- over real HTTP


async def test_scrapes_over_http_and_diffs_consecutive_pages(exporter: Exporter) -> None:
    exporter.serve(page("h100-8gpu-healthy.prom"))
    source = DcgmExporterSource(NODE, exporter.url, timeout_s=5)
    first = await source.scrape()
    assert (len(first.samples), first.events, first.previous, first.driver_version) == (8, (), (), "550.54.15")
    assert first.samples[0].observed_at is not None
    exporter.serve(page("h100-8gpu-faults.prom"))
    second = await source.scrape()
    assert [(e.kind, e.index, e.xid) for e in second.events] == [
        (GpuEventKind.XID, 1, 13),
        (GpuEventKind.XID, 3, 79),
        (GpuEventKind.XID, 5, 48),
        (GpuEventKind.GPU_MISSING, 7, None),
    ]
    assert second.previous == first.samples and source.previous == second.samples
    assert [s.uuid for s in second.samples if s.missing] == [UUID7]
    third = await source.scrape()
    assert third.events == ()  # same page: nothing new, GPU 7 still missing
    assert [s.index for s in third.samples if s.missing] == [7]
    assert (exporter.state.requests, exporter.state.paths[-1]) == (3, "/metrics")


async def test_endpoint_down_is_a_clear_unavailable_error(exporter: Exporter) -> None:
    url = f"http://127.0.0.1:{_free_port()}/metrics"
    source = DcgmExporterSource(NODE, url, timeout_s=2)
    with pytest.raises(ReboundError) as caught:
        await source.scrape()
    assert caught.value.kind is FailureKind.GPU_SOURCE_UNAVAILABLE
    assert caught.value.message.startswith(f"DCGM exporter {url} for {NODE}: cannot connect")


async def test_http_500_keeps_the_baseline(exporter: Exporter) -> None:
    exporter.serve(page("h100-8gpu-healthy.prom"))
    source = DcgmExporterSource(NODE, exporter.url)
    baseline = (await source.scrape()).samples
    exporter.serve("DCGM hostengine connection lost\n" + "detail " * 200, status=500)
    with pytest.raises(ReboundError) as caught:
        await source.scrape()
    assert caught.value.kind is FailureKind.GPU_SOURCE_UNAVAILABLE
    assert "HTTP 500: 'DCGM hostengine connection lost" in caught.value.message
    assert len(caught.value.message) < 400  # the error page is quoted, not copied
    assert source.previous == baseline  # the next good scrape diffs against the last good one


async def test_slow_exporter_times_out_within_the_limit(exporter: Exporter) -> None:
    exporter.serve(page("h100-8gpu-healthy.prom"))
    exporter.state.delay_s = 3.0
    source = DcgmExporterSource(NODE, exporter.url, timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(ReboundError) as caught:
        await source.scrape()
    elapsed = time.monotonic() - started
    assert caught.value.kind is FailureKind.GPU_SOURCE_UNAVAILABLE
    assert "no complete answer within 0.3 s" in caught.value.message
    assert elapsed < 1.5


async def test_a_slow_drip_counts_against_the_total_limit(exporter: Exporter) -> None:
    # Every chunk arrives well inside a per-read timeout; only a deadline on the whole request stops it.
    exporter.serve(page("h100-8gpu-healthy.prom"))
    exporter.state.drip_chunk, exporter.state.drip_pause_s = 1000, 0.05  # ~59 chunks: ~3 s in all
    source = DcgmExporterSource(NODE, exporter.url, timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(ReboundError, match="no complete answer within 0.5 s"):
        await source.scrape()
    assert time.monotonic() - started < 1.5


async def test_huge_page_is_cut_off_not_parsed(exporter: Exporter) -> None:
    exporter.state.endless = True
    source = DcgmExporterSource(NODE, exporter.url, max_bytes=256 * 1024, timeout_s=10)
    with pytest.raises(ReboundError) as caught:
        await source.scrape()
    assert "page larger than 262144 bytes: cut off and not parsed" in caught.value.message
    # The scraper hung up near its limit: the server got nowhere near sending "forever".
    assert exporter.state.bytes_sent < 32 * 1024 * 1024  # measured: about 6 MB of socket buffers


async def test_garbage_and_empty_pages_are_errors_not_missing_gpus(exporter: Exporter) -> None:
    exporter.serve(page("h100-8gpu-healthy.prom"))
    source = DcgmExporterSource(NODE, exporter.url)
    await source.scrape()
    exporter.serve(page("not-metrics.html"))
    with pytest.raises(ReboundError, match="not a Prometheus metrics page: line 1: expected a metric name"):
        await source.scrape()
    # An exporter whose DCGM died serves HELP/TYPE lines only: that is no data, not eight missing GPUs.
    exporter.serve("# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n")
    with pytest.raises(ReboundError, match="no DCGM GPU metrics on the page"):
        await source.scrape()
    exporter.state.body = b"\xff\xfe\x00garbage"
    with pytest.raises(ReboundError, match="not UTF-8"):
        await source.scrape()
    assert not any(s.missing for s in source.previous)


async def test_gzip_page_is_decoded_and_bounded_after_decompression() -> None:
    import gzip

    body = gzip.compress(page("h100-8gpu-healthy.prom").encode())

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"Content-Encoding": "gzip"})

    transport = httpx.MockTransport(handler)
    ok = await DcgmExporterSource(NODE, "http://n:9400/metrics", transport=transport).scrape()
    assert len(ok.samples) == 8
    small = DcgmExporterSource(NODE, "http://n:9400/metrics", transport=transport, max_bytes=len(body) * 2)
    with pytest.raises(ReboundError, match="page larger than"):  # the limit is on the decoded page
        await small.scrape()


@pytest.mark.parametrize("url", ["ftp://n/metrics", "n1:9400/metrics", "http://", "http://[::1"])
def test_a_url_that_cannot_work_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ReboundError) as caught:
        DcgmExporterSource(NODE, url)
    assert caught.value.kind is FailureKind.CONFIGURATION
