"""The NVML path to the verdict: the fake NVML, the unmodified pynvml, NvmlSource, the node agent's activity, and
the same verdict the DCGM path gets for the same faults."""

from __future__ import annotations

from temporalio.testing import ActivityEnvironment

from activities.gpu.activities import GpuActivities, NvmlReadGpuHealthInput
from activities.gpu.dcgm_page import parse_exporter_page
from activities.gpu.nvml import NvmlSource
from activities.gpu.xid_catalog import default_xid_catalog
from deploy.local.fake_nvml import fake_gpu_uuid, fake_pci_bus_id
from tests.gpu.conftest import HOST, FakeNvml, wait_for
from workflows.domain.gpu import GpuAction, GpuHealthReport, GpuHealthStatus, GpuSample, NodeGpuVerdict
from workflows.policy.gpu_health import gpu_health_verdict, verdict_for_report

CATALOG = default_xid_catalog()


async def _read(acts: GpuActivities, cursor: int = 0) -> GpuHealthReport:
    return await ActivityEnvironment().run(acts.read_gpu_health, NvmlReadGpuHealthInput(event_cursor=cursor))


def _per_gpu(v: NodeGpuVerdict) -> dict[int | None, tuple[str, str, list[str]]]:
    return {g.index: (g.status.value, g.action.value, sorted({f.rule for f in g.findings})) for g in v.gpus}


async def test_nvml_report_to_verdict(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    acts = GpuActivities(source)
    first = await _read(acts)
    healthy = verdict_for_report(first, catalog=CATALOG, source="nvml")
    assert (healthy.status, healthy.action, healthy.reasons) == (GpuHealthStatus.HEALTHY, GpuAction.NONE, ())
    assert len(healthy.gpus) == 4

    fake_nvml.append(
        "gpu 0 ecc_unc_vol 1",
        "event 0 0x2 0",  # nvmlEventTypeDoubleBitEccError
        "gpu 1 clocks_event 0x40",
        "gpu 1 temp 88",
        "gpu 1 sm_clock 1200",
        "gpu 2 lost 1",
        "xid 2 79",
        "gpu 3 pcie_replay 500",
        "xid 3 13",
    )
    wait_for(lambda: len(source.events_after(first.next_event_cursor).events) >= 4, what="DBE, XID 79, lost, XID 13")
    second = await _read(acts, first.next_event_cursor)
    v = verdict_for_report(second, catalog=CATALOG, previous=first.samples, source="nvml")
    assert _per_gpu(v) == {
        0: ("failed", "reset_gpu", ["ecc_dbe_event", "ecc_dbe_volatile"]),
        1: ("degraded", "watch", ["temperature_high", "thermal_throttle"]),
        2: ("failed", "drain_node", ["gpu_lost", "xid"]),
        3: ("degraded", "restart_job", ["pcie_replay_growth", "xid"]),
    }
    assert (v.status, v.action, v.source) == (GpuHealthStatus.FAILED, GpuAction.DRAIN_NODE, "nvml")
    gpu2 = next(g for g in v.gpus if g.index == 2)
    assert (gpu2.uuid, gpu2.pci_bus_id) == (fake_gpu_uuid(HOST, 2), fake_pci_bus_id(HOST, 2))
    assert any(r.startswith("XID 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS") for r in gpu2.reasons)
    gpu1 = next(g for g in v.gpus if g.index == 1)
    assert "thermal slowdown, 88 C, SM clock 1200/1980 MHz" in gpu1.reasons[0]


def _dcgm_page(faults: dict[int, dict[str, int]]) -> str:
    lines = []
    for index in range(4):
        labels = f'gpu="{index}",UUID="{fake_gpu_uuid(HOST, index)}",device="nvidia{index}",Hostname="{HOST}"'
        values = {"DCGM_FI_DEV_GPU_TEMP": 40, "DCGM_FI_DEV_XID_ERRORS": 0, **faults.get(index, {})}
        lines += [f"{name}{{{labels}}} {value}" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def _judge(samples: tuple[GpuSample, ...] | list[GpuSample]) -> dict[int | None, tuple[str, str, list[str]]]:
    return _per_gpu(gpu_health_verdict(HOST, samples, catalog=CATALOG))


def test_both_sources_give_the_same_verdict_for_the_same_faults(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    fake_nvml.append(
        "gpu 0 ecc_unc_vol 2",
        "gpu 1 clocks_event 0x60",
        "gpu 1 temp 91",
        "gpu 2 remap 0 3 0 1",
        "gpu 3 retired_pending 1",
    )
    source.open()
    nvml = _judge(source.sample())
    dcgm_page = _dcgm_page(
        {
            0: {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 2},
            1: {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0x60, "DCGM_FI_DEV_GPU_TEMP": 91},
            2: {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 3, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1},
            3: {"DCGM_FI_DEV_RETIRED_PENDING": 1},
        }
    )
    dcgm = _judge(parse_exporter_page(dcgm_page, HOST).samples)
    assert (
        nvml
        == dcgm
        == {
            0: ("failed", "reset_gpu", ["ecc_dbe_volatile"]),
            1: ("degraded", "watch", ["temperature_high", "thermal_throttle"]),
            2: ("failed", "drain_node", ["row_remap_failure"]),
            3: ("degraded", "watch", ["retired_pages_pending"]),
        }
    )
