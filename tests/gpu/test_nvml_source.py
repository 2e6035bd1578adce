"""NvmlSource against the fake NVML: per-field reads, lost GPUs, the event thread, cursors, fallbacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from activities.gpu.nvml import NvmlSource
from activities.gpu.port import EventBatch, EventLog
from deploy.local.fake_nvml import fake_gpu_uuid, fake_pci_bus_id
from tests.gpu.conftest import HOST, FakeNvml, run_python, wait_for
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import GpuEvent, GpuEventKind


def _kinds(source: NvmlSource, cursor: int = 0) -> list[tuple[GpuEventKind, int | None, int | None]]:
    return [(e.kind, e.index, e.xid) for e in source.events_after(cursor).events]


def test_sample_reads_every_field(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    fake_nvml.append(
        "gpu 3 temp 91",
        "gpu 3 util 97 40",
        "gpu 3 mem_used 1073741824",
        "gpu 3 power_mw 699100",
        "gpu 3 ecc_unc_vol 2",
        "gpu 3 ecc_cor_vol 11",
        "gpu 3 ecc_unc_agg 3",
        "gpu 3 ecc_cor_agg 12",
        "gpu 3 retired_pending 1",
        "gpu 3 remap 4 1 1 0",
        "gpu 3 clocks_event 0x40",
        "gpu 3 pcie_replay 12",
        "gpu 3 nvlink 5 crc_flit 7",
        "gpu 3 nvlink 17 crc_data 3",
        "gpu 3 nvlink 5 replay 100",  # not a CRC counter: not summed
        "gpu 3 retired_sbe 4",
        "gpu 3 retired_dbe 2",
        "gpu 3 sm_clock 1275",
        "gpu 3 sm_clock_max 1980",
    )
    source.open()
    samples = source.sample()
    assert [s.index for s in samples] == [0, 1, 2, 3]
    s = samples[3]
    assert (s.host, s.uuid, s.pci_bus_id, s.name) == (
        HOST,
        fake_gpu_uuid(HOST, 3),
        fake_pci_bus_id(HOST, 3),
        "NVIDIA H100 80GB HBM3",
    )
    assert (s.temperature_c, s.utilization_gpu_pct, s.utilization_mem_pct) == (91, 97, 40)
    assert (s.memory_used_bytes, s.memory_total_bytes, s.power_mw) == (1 << 30, 85520809984, 699100)
    assert (s.ecc_uncorrected_volatile, s.ecc_corrected_volatile) == (2, 11)
    assert (s.ecc_uncorrected_aggregate, s.ecc_corrected_aggregate) == (3, 12)
    assert s.retired_pages_pending is True
    assert (s.remapped_rows_correctable, s.remapped_rows_uncorrectable, s.remap_pending, s.remap_failure) == (
        4,
        1,
        True,
        False,
    )
    assert (s.clocks_event_reasons, s.pcie_replay_count, s.nvlink_crc_errors) == (0x40, 12, 10)
    assert (s.retired_pages_sbe, s.retired_pages_dbe, s.sm_clock_mhz, s.sm_clock_max_mhz) == (4, 2, 1275, 1980)
    assert s.memory_free_bytes == 85520809984 - (1 << 30)
    assert s.observed_at is not None and s.observed_at.tzinfo is not None and (s.last_xid, s.missing) == (None, False)
    assert (s.lost, s.unsupported, s.errors) == (False, (), ())
    assert samples[0].temperature_c == 40 and samples[0].ecc_uncorrected_volatile == 0
    assert source.driver_version() == "550.54.15"
    assert fake_nvml.count("nvmlDeviceGetCurrentClocksEventReasons") == 4  # the current API, no fallback needed


def test_not_supported_and_errors_are_recorded_not_raised(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    fake_nvml.append(
        "gpu 1 nvlinks 0",
        "gpu 1 fail nvmlDeviceGetRemappedRows 3",  # 3 = NOT_SUPPORTED (no row remapper, e.g. before Ampere)
        "gpu 1 fail nvmlDeviceGetRetiredPages 3",  # and no page retirement (Ampere and later remap rows instead)
        "gpu 1 fail nvmlDeviceGetPowerUsage 999",
        "gpu 1 temp 77",
    )
    source.open()
    s = source.sample()[1]
    assert set(s.unsupported) == {
        "nvlink_crc_errors",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remap_pending",
        "remap_failure",
        "retired_pages_sbe",
        "retired_pages_dbe",
    }
    assert s.errors == ("power_mw: Unknown Error (NVML error 999)",)
    assert (s.power_mw, s.remap_failure, s.nvlink_crc_errors) == (None, None, None)
    assert s.temperature_c == 77 and s.ecc_uncorrected_volatile == 0  # the rest of the sample survived
    assert source.sample()[0].unsupported == ()


def test_xid79_while_blocked_then_gpu_lost_mapped_by_handle_address(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    source.open()
    wait_for(lambda: fake_nvml.count("nvmlEventSetWait_v2 rc=10") >= 1, what="the event thread to block in wait")
    # One write: by the time the waiter sees the XID, nvmlDeviceGetIndex on GPU 2 already fails with
    # GPU_IS_LOST, so index 2 below can only come from the handle-address map.
    fake_nvml.append("gpu 2 lost 1", "xid 2 79")
    wait_for(lambda: len(source.events_after(0).events) >= 2, what="XID 79 and gpu_lost")
    events = source.events_after(0).events
    assert [(e.kind, e.index, e.xid) for e in events] == [(GpuEventKind.XID, 2, 79), (GpuEventKind.GPU_LOST, 2, None)]
    assert {(e.uuid, e.pci_bus_id, e.host, e.source) for e in events} == {
        (fake_gpu_uuid(HOST, 2), fake_pci_bus_id(HOST, 2), HOST, "nvml")
    }
    assert events[0].observed_at is not None and events[0].sequence < events[1].sequence
    assert fake_nvml.count("nvmlDeviceGetIndex gpu=2 rc=15") >= 1

    lost = source.sample()[2]
    assert lost.lost and lost.uuid == fake_gpu_uuid(HOST, 2)  # identity cached at open survives the loss
    assert (lost.temperature_c, lost.errors) == (None, ())
    assert not source.sample()[1].lost
    probes = fake_nvml.count("nvmlDeviceGetIndex gpu=2")
    wait_for(lambda: fake_nvml.count("nvmlDeviceGetIndex gpu=2") >= probes + 2, what="two more loss probes")
    assert len(source.events_after(0).events) == 2  # still lost: reported once, not once per wait


def test_double_bit_ecc_event_and_supported_mask(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    fake_nvml.append("gpu 0 events_supported 0x8", "event 0 0x2 0", "event 1 0x2 0", "event 1 0x4 0")
    source.open()
    wait_for(lambda: len(source.events_after(0).events) >= 1, what="the DBE event")
    wait_for(lambda: fake_nvml.count("nvmlEventSetWait_v2 rc=10") >= 1, what="the log to be drained")
    # GPU 0 cannot report DBEs (not registered for them); the PState change (0x4) was never asked for.
    assert _kinds(source) == [(GpuEventKind.ECC_DBE, 1, None)]
    assert "nvmlDeviceRegisterEvents gpu=0 rc=0" in fake_nvml.calls()  # registered for XIDs only


def test_cursor_returns_each_event_once(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    source.open()
    fake_nvml.append("xid 0 13", "xid 1 31")
    wait_for(lambda: len(source.events_after(0).events) == 2, what="two XIDs")
    first = source.events_after(0)
    assert [e.xid for e in first.events] == [13, 31]
    assert first.next_cursor == first.events[-1].sequence and first.missed == 0
    assert source.events_after(first.next_cursor).events == ()
    fake_nvml.append("xid 3 43")
    wait_for(lambda: len(source.events_after(first.next_cursor).events) == 1, what="the third XID")
    second = source.events_after(first.next_cursor)
    assert [(e.index, e.xid) for e in second.events] == [(3, 43)]
    assert source.events_after(second.next_cursor).events == ()
    assert len(source.events_after(second.next_cursor + 10**9).events) == 3  # foreign cursor: everything


def test_event_log_counts_what_it_dropped() -> None:
    log = EventLog(capacity=2, first_sequence=100)
    for xid in (1, 2, 3):
        log.append(GpuEvent(kind=GpuEventKind.XID, host=HOST, xid=xid))
    batch = log.after(0)
    assert [(e.sequence, e.xid) for e in batch.events] == [(102, 2), (103, 3)]
    assert (batch.next_cursor, batch.missed) == (103, 1)
    assert log.after(102).missed == 0 and [e.xid for e in log.after(102).events] == [3]
    assert EventLog(first_sequence=5).after(0) == EventBatch(events=(), next_cursor=5, missed=0)
    fresh = EventLog()
    assert fresh.after(0).next_cursor > 1_600_000_000_000_000  # wall-clock base: a restarted agent never repeats


def test_driver_not_loaded_is_gpu_source_unavailable(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    fake_nvml.append("init_error 9")
    with pytest.raises(ReboundError) as caught:
        source.open()
    assert caught.value.kind is FailureKind.GPU_SOURCE_UNAVAILABLE
    assert "Driver Not Loaded" in caught.value.message
    with pytest.raises(ReboundError) as not_open:
        source.sample()
    assert not_open.value.kind is FailureKind.GPU_SOURCE_UNAVAILABLE
    fake_nvml.reset()  # the driver loads: the next open() succeeds
    source.open()
    assert len(source.sample()) == 4


def test_gpu_lost_before_open_and_back_after_reset(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    fake_nvml.append("gpu 1 lost 1")
    source.open()
    assert _kinds(source) == [(GpuEventKind.GPU_LOST, 1, None)]
    s = source.sample()[1]
    assert (s.lost, s.uuid, s.errors) == (True, "", ())
    fake_nvml.reset()
    back = source.sample()[1]
    assert (back.lost, back.uuid, back.temperature_c) == (False, fake_gpu_uuid(HOST, 1), 40)


_FALLBACK_SCRIPT = """
import json, pynvml
from activities.gpu.nvml import NvmlSource
with NvmlSource("n1", event_poll_ms=20) as src:
    s = src.sample()[0]
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    missing = []
    calls = {
        "nvmlDeviceGetTemperatureV": lambda: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
    }
    for name, call in calls.items():
        try:
            call()
        except pynvml.NVMLError_FunctionNotFound:
            missing.append(name)
print(json.dumps({"sample": s.model_dump(mode="json"), "missing": missing}))
"""


def test_old_driver_falls_back_to_throttle_reasons(old_driver_lib: Path, fake_nvml: FakeNvml) -> None:
    fake_nvml.append("gpu 0 clocks_event 0x20", "gpu 0 temp 83")
    proc = run_python(_FALLBACK_SCRIPT, ld_library_path=old_driver_lib.parent)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["missing"] == ["nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons"]
    sample = result["sample"]
    assert (sample["clocks_event_reasons"], sample["temperature_c"], sample["errors"]) == (0x20, 83, [])
    assert fake_nvml.count("nvmlDeviceGetCurrentClocksThrottleReasons gpu=0 rc=0") == 1
    assert fake_nvml.count("nvmlDeviceGetTemperature gpu=0 rc=0") == 1


_NO_LIBRARY_SCRIPT = """
import ctypes, json
try:
    ctypes.CDLL("libnvidia-ml.so.1")
    print(json.dumps({"real_nvml": True}))
    raise SystemExit(0)
except OSError:
    pass
from activities.gpu.nvml import NvmlSource
from workflows.domain.errors import ReboundError
try:
    NvmlSource("n1").open()
    print(json.dumps({"opened": True}))
except ReboundError as exc:
    print(json.dumps({"kind": exc.kind.value, "message": exc.message}))
"""


def test_no_library_is_gpu_source_unavailable(tmp_path: Path, fake_nvml: FakeNvml) -> None:
    proc = run_python(_NO_LIBRARY_SCRIPT, ld_library_path=tmp_path)  # an empty directory
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    if result.get("real_nvml"):
        pytest.skip("a real libnvidia-ml.so.1 is installed on this machine")
    assert result == {"kind": "GPU_SOURCE_UNAVAILABLE", "message": "NVML init failed: NVML Shared Library Not Found"}
