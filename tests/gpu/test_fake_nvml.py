"""The fake libnvidia-ml.so.1 through the unmodified pynvml: loading, state grammar, lost GPUs, events, ABI, build."""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from deploy.local import fake_nvml as fake_nvml_build
from deploy.local.fake_nvml import (
    FAKE_NVML_SOURCE,
    FakeNvmlBuildError,
    build_fake_nvml,
    fake_gpu_uuid,
    fake_pci_bus_id,
    find_nvml_header,
)
from tests.gpu.conftest import FakeNvml

XID = pynvml.nvmlEventTypeXidCriticalError
DBE = pynvml.nvmlEventTypeDoubleBitEccError


@pytest.fixture
def nvml(fake_nvml: FakeNvml) -> Iterator[object]:
    """pynvml initialised against the fake for one test, shut down afterwards."""
    pynvml.nvmlInit()
    yield pynvml
    pynvml.nvmlShutdown()
    fake_nvml.assert_balanced()


def test_the_fake_is_the_library_pynvml_mapped(nvml: object, fake_nvml_lib: Path, fake_nvml: FakeNvml) -> None:
    mapped = {
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if "libnvidia-ml" in line and len(line.split()) >= 6
    }
    assert mapped == {str(fake_nvml_lib)}
    assert fake_nvml.calls()[0] == "nvmlInitWithFlags rc=0"
    assert pynvml.nvmlDeviceGetCount() == 4
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.550.54.15"


def test_init_is_reference_counted(fake_nvml: FakeNvml) -> None:
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 4  # one session still open
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_host_seeds_uuid_and_bus_id(nvml: object, fake_nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(3)
    n1 = (pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetPciInfo(handle).busId)
    fake_nvml.append("host n2")  # the state is re-read on every call, so the same handle now reads node n2
    n2 = (pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetPciInfo(handle).busId)
    assert n1 == (fake_gpu_uuid("n1", 3), fake_pci_bus_id("n1", 3))
    assert n2 == (fake_gpu_uuid("n2", 3), fake_pci_bus_id("n2", 3))
    assert n1[0] != n2[0] and n1[1] != n2[1]
    assert n1[0].startswith("GPU-") and n1[0].endswith("-000000000003")
    index_0 = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert index_0 != n2[0] and index_0.rsplit("-", 1)[0] == n2[0].rsplit("-", 1)[0]


def test_telemetry_fields_follow_the_state(nvml: object, fake_nvml: FakeNvml) -> None:
    fake_nvml.append(
        "gpu 1 temp 91",
        "gpu 1 util 97 40",
        "gpu 1 mem_used 1073741824",
        "gpu 1 power_mw 699100",
        "gpu 1 ecc_unc_vol 2",
        "gpu 1 ecc_cor_agg 9",
        "gpu 1 clocks_event 0x40",
        "gpu 1 remap 1 2 1 0",
        "gpu 1 name NVIDIA A100-SXM4-40GB  # trailing comment",
    )
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU) == 91
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 91
    rates = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert (rates.gpu, rates.memory) == (97, 40)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert mem.used == 1 << 30 and mem.free == mem.total - mem.used
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 699100
    unc = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    cor = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, unc, pynvml.NVML_VOLATILE_ECC) == 2
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, cor, pynvml.NVML_AGGREGATE_ECC) == 9
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, cor, pynvml.NVML_VOLATILE_ECC) == 0
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0x40
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (1, 2, 1, 0)
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-40GB"
    assert pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(0), 0) == 40  # others untouched


def test_retired_pages_by_cause_through_both_pynvml_wrappers(nvml: object, fake_nvml: FakeNvml) -> None:
    fake_nvml.append("gpu 1 retired_sbe 3", "gpu 1 retired_dbe 1")
    sbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    dbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
    # pynvml asks for the size first (count 0, no buffer: INSUFFICIENT_SIZE with the count), then fills a buffer.
    pages = pynvml.nvmlDeviceGetRetiredPages(h1, sbe)
    assert len(pages) == 3 and len(set(pages)) == 3
    assert fake_nvml.count("nvmlDeviceGetRetiredPages gpu=1 rc=7") == 1  # 7 = NVML_ERROR_INSUFFICIENT_SIZE
    assert fake_nvml.count("nvmlDeviceGetRetiredPages gpu=1 rc=0") == 1
    assert not set(pages) & set(pynvml.nvmlDeviceGetRetiredPages(h1, dbe))
    v2 = pynvml.nvmlDeviceGetRetiredPages_v2(h1, dbe)
    assert [sorted(p) for p in v2] == [["address", "timestamp"]] and v2[0]["timestamp"] > 0
    assert pynvml.nvmlDeviceGetRetiredPages(pynvml.nvmlDeviceGetHandleByIndex(0), sbe) == []  # size query: SUCCESS
    fake_nvml.append("gpu 0 retired_sbe 513")  # more than any GPU can retire: a typo, not a state
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetCount()


def test_sm_clock_and_max_clock(nvml: object, fake_nvml: FakeNvml) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
    fake_nvml.append("gpu 2 sm_clock 1275", "gpu 2 sm_clock_max 1830")
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1275
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS) == 1275
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 1830
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == 2619
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_COUNT)


def test_lost_gpu_fails_every_call_including_handle_and_index(nvml: object, fake_nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    fake_nvml.append("gpu 2 lost 1")
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetIndex(handle)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUUID(handle)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByIndex(1)) == 1


def test_injected_failure_hits_one_function_of_one_gpu(nvml: object, fake_nvml: FakeNvml) -> None:
    fake_nvml.append("gpu 0 fail nvmlDeviceGetPowerUsage 999", "gpu 0 nvlinks 0")
    h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetPowerUsage(h0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(h0, 0)
    assert pynvml.nvmlDeviceGetPowerUsage(h1) == 70000
    assert pynvml.nvmlDeviceGetNvLinkState(h1, 17) == pynvml.NVML_FEATURE_ENABLED
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(h1, 18)  # past the last link: how a caller finds the end
    assert "nvmlDeviceGetPowerUsage gpu=0 rc=999" in fake_nvml.calls()


def test_a_bad_state_line_fails_loudly(nvml: object, fake_nvml: FakeNvml) -> None:
    fake_nvml.append("gpu 0 tmep 90")
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetCount()
    assert any("bad line: 5: gpu 0 tmep 90" in line for line in fake_nvml.calls())


def test_events_are_filtered_by_device_and_mask_and_replayed_per_set(nvml: object, fake_nvml: FakeNvml) -> None:
    fake_nvml.append("xid 1 79", "event 0 0x2 0", "xid 3 13", "event 2 0x2 0", "gpu 2 events_supported 0x8")
    h = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    first = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h[1], XID, first)
    pynvml.nvmlDeviceRegisterEvents(h[0], DBE, first)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(h[2], DBE, first)  # outside GPU 2's supported mask
    xid = pynvml.nvmlEventSetWait_v2(first, 0)
    assert (xid.eventType, xid.eventData, xid.gpuInstanceId, xid.computeInstanceId) == (XID, 79, 0xFFFFFFFF, 0xFFFFFFFF)
    dbe = pynvml.nvmlEventSetWait_v2(first, 0)
    assert (dbe.eventType, dbe.eventData) == (DBE, 0)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(first, 10)  # GPU 3's XID 13 is not registered: skipped for good

    second = pynvml.nvmlEventSetCreate()  # a new set replays the log from its start
    pynvml.nvmlDeviceRegisterEvents(h[3], XID, second)
    assert pynvml.nvmlEventSetWait_v2(second, 0).eventData == 13
    pynvml.nvmlEventSetFree(first)
    pynvml.nvmlEventSetFree(second)


def test_a_replaced_state_file_is_a_new_event_log(nvml: object, fake_nvml: FakeNvml) -> None:
    fake_nvml.append("xid 0 31", "xid 0 43")
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(0), XID, es)
    assert [pynvml.nvmlEventSetWait_v2(es, 0).eventData for _ in range(2)] == [31, 43]
    fake_nvml.reset("xid 0 94")  # shorter than the old log: a position-only reader would never see it
    assert pynvml.nvmlEventSetWait_v2(es, 0).eventData == 94
    pynvml.nvmlEventSetFree(es)


def test_wait_delivers_pending_events_before_gpu_is_lost(nvml: object, fake_nvml: FakeNvml) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h, XID, es)
    fake_nvml.append("gpu 1 lost 1", "xid 1 79")
    event = pynvml.nvmlEventSetWait_v2(es, 0)
    assert event.eventData == 79
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlEventSetWait_v2(es, 0)
    pynvml.nvmlEventSetFree(es)


# ------------------------------------------------------------------ ABI: ctypes vs the real header

_CTYPES_STRUCTS = {
    "nvmlEventData_t": pynvml.c_nvmlEventData_t,
    "nvmlPciInfo_t": pynvml.nvmlPciInfo_t,
    "nvmlMemory_t": pynvml.c_nvmlMemory_t,
    "nvmlUtilization_t": pynvml.c_nvmlUtilization_t,
    "nvmlTemperature_v1_t": pynvml.c_nvmlTemperature_v1_t,
}


def test_ctypes_layouts_match_offsetof_from_the_real_header(tmp_path: Path) -> None:
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <nvml.h>", "int main(void) {"]
    expected: dict[str, int] = {}
    for c_name, cls in _CTYPES_STRUCTS.items():
        lines.append(f'    printf("{c_name} %zu\\n", sizeof({c_name}));')
        expected[c_name] = ctypes.sizeof(cls)
        for field, *_ in cls._fields_:
            lines.append(f'    printf("{c_name}.{field} %zu\\n", offsetof({c_name}, {field}));')
            expected[f"{c_name}.{field}"] = getattr(cls, field).offset
    lines += ["    return 0;", "}"]
    (tmp_path / "layout.c").write_text("\n".join(lines) + "\n")
    gcc = shutil.which("gcc")
    assert gcc is not None
    include = f"-I{find_nvml_header().parent}"
    subprocess.run([gcc, "-std=c11", include, "-o", str(tmp_path / "layout"), str(tmp_path / "layout.c")], check=True)
    out = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout
    actual = {key: int(value) for key, value in (line.split() for line in out.splitlines())}
    assert actual == expected
    assert actual["nvmlEventData_t"] == 32 and actual["nvmlEventData_t.eventData"] == 16  # pinned by the facts doc


# ------------------------------------------------------------------ building


def test_abi_drift_fails_the_build_with_gccs_message(tmp_path: Path) -> None:
    drifted = tmp_path / "fake_nvml.c"
    text = FAKE_NVML_SOURCE.read_text()
    original = "nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)"
    assert original in text
    drifted.write_text(text.replace(original, original.replace("unsigned int *", "unsigned long long *")))
    with pytest.raises(FakeNvmlBuildError, match="conflicting types for 'nvmlDeviceGetPcieReplayCounter'"):
        build_fake_nvml(tmp_path / "out", source=drifted)


def test_rebuilds_only_when_inputs_or_flags_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fake_nvml_build.main([str(tmp_path)]) == 0
    lib = Path(capsys.readouterr().out.strip())
    assert lib == tmp_path.resolve() / "libnvidia-ml.so.1"
    built = lib.stat().st_mtime_ns
    assert build_fake_nvml(tmp_path) == lib and lib.stat().st_mtime_ns == built  # up to date: untouched
    build_fake_nvml(tmp_path, old_driver=True)  # same directory, other flags: rebuilt
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in symbols
    assert "nvmlDeviceGetCurrentClocksEventReasons" not in symbols
    assert "nvmlDeviceGetTemperatureV" not in symbols


def test_missing_header_names_the_package_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FakeNvmlBuildError, match="pip install nvidia-nvml-dev"):
        find_nvml_header()
