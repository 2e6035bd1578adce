"""A dcgm-exporter page mapped to one ``GpuSample`` per GPU. Pure parsing: no I/O.

- The page is parsed by ``activities.gpu.promtext`` (strict, like Prometheus: one bad line fails the scrape)
  and mapped by metric NAME, legacy and DCGM >= 4.6 spellings alike, with both label spellings
  (``Hostname``/``hostname``, ``UUID``/``uuid``, ``modelName``/``model_name``). Per-link, NVSwitch and CPU
  samples and the exporter's own ``DCGM_EXP_*`` metrics are ignored; for MIG, the whole-GPU sample wins.
- DCGM's "blank" sentinels (just below 2**63, 2**31 and at 2**47 for doubles) are not values: NOT_SUPPORTED
  goes to ``unsupported``, NOT_FOUND/NOT_PERMISSIONED to ``errors``, like the NVML source's failed reads.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from activities.gpu.promtext import PromSample, parse_exposition
from workflows.domain.gpu import GpuSample

__all__ = ["DcgmPage", "parse_exporter_page"]

_MIB = 1024 * 1024
_BODY_SNIPPET = 200
_DEVICE = re.compile(r"nvidia([0-9]+)")

# DCGM's blank sentinels (dcgm_structs.h): BLANK, then +1 NOT_FOUND, +2 NOT_SUPPORTED, +3 NOT_PERMISSIONED.
_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
_INT32_BLANK = 0x7FFFFFF0
_FP64_BLANK = 140737488355328.0  # 2**47
_BLANK_KIND = {1: "NOT_FOUND", 2: "NOT_SUPPORTED", 3: "NOT_PERMISSIONED"}


def _int(value: float) -> int:
    return int(value)


def _bool(value: float) -> int:
    return int(value != 0)  # stored as 0/1, validated into the sample's bool field


def _mib(value: float) -> int:
    return int(value * _MIB)


def _milliwatts(value: float) -> int:
    return round(value * 1000)


#: Exporter metric -> (GpuSample field, conversion). Several names may feed one field (legacy and DCGM 4.6).
_FIELDS: dict[str, tuple[str, Callable[[float], int]]] = {
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", _int),
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": ("temperature_c", _int),
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_gpu_pct", _int),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": ("utilization_gpu_pct", _int),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("utilization_mem_pct", _int),
    "DCGM_FI_DEV_FB_USED": ("memory_used_bytes", _mib),
    "DCGM_FI_DEV_FB_FREE": ("memory_free_bytes", _mib),
    "DCGM_FI_DEV_FB_TOTAL": ("memory_total_bytes", _mib),
    "DCGM_FI_DEV_FB_RESERVED": ("memory_reserved", _mib),
    "DCGM_FI_DEV_POWER_USAGE": ("power_mw", _milliwatts),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": ("power_mw", _milliwatts),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", _int),
    "DCGM_FI_DEV_MAX_SM_CLOCK": ("sm_clock_max_mhz", _int),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clocks_event_reasons", _int),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("clocks_event_reasons", _int),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_corrected_volatile", _int),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_uncorrected_volatile", _int),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_corrected_aggregate", _int),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_uncorrected_aggregate", _int),
    "DCGM_FI_DEV_RETIRED_SBE": ("retired_pages_sbe", _int),
    "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL": ("retired_pages_sbe", _int),
    "DCGM_FI_DEV_RETIRED_DBE": ("retired_pages_dbe", _int),
    "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL": ("retired_pages_dbe", _int),
    "DCGM_FI_DEV_RETIRED_PENDING": ("retired_pages_pending", _bool),
    "DCGM_FI_DEV_PAGE_RETIRED_PENDING": ("retired_pages_pending", _bool),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remap_failure", _bool),
    "DCGM_FI_DEV_ROW_REMAP_FAILED": ("remap_failure", _bool),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remap_pending", _bool),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", _int),
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": ("remapped_rows_uncorrectable", _int),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", _int),
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": ("remapped_rows_correctable", _int),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay_count", _int),
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": ("pcie_replay_count", _int),
    "DCGM_FI_DEV_XID_ERRORS": ("last_xid", _int),
    "DCGM_FI_DEV_XID_ERROR": ("last_xid", _int),
    # Summed into nvlink_crc_errors (flit + data, as the NVML source sums them).
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("nvlink_crc_flit", _int),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL": ("nvlink_crc_flit", _int),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("nvlink_crc_data", _int),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL": ("nvlink_crc_data", _int),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("nvlink_replay_errors", _int),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("nvlink_recovery_errors", _int),
    # Violation counters: time (us) the GPU was held below its clocks by the power limit or by temperature.
    "DCGM_FI_DEV_POWER_VIOLATION": ("power_violation_us", _int),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("thermal_violation_us", _int),
}
_COUNTERS = frozenset(
    {
        "ecc_corrected_volatile",
        "ecc_uncorrected_volatile",
        "ecc_corrected_aggregate",
        "ecc_uncorrected_aggregate",
        "retired_pages_sbe",
        "retired_pages_dbe",
        "remapped_rows_uncorrectable",
        "remapped_rows_correctable",
        "pcie_replay_count",
        "nvlink_crc_flit",
        "nvlink_crc_data",
        "nvlink_replay_errors",
        "nvlink_recovery_errors",
        "power_violation_us",
        "thermal_violation_us",
    }
)
_NON_GPU_LABELS = ("nvlink", "nvswitch", "cpu", "cpucore")
_MIG_LABELS = ("GPU_I_ID", "GPU_I_PROFILE")


@dataclass(frozen=True, slots=True)
class DcgmPage:
    """One parsed exporter page: a sample per GPU (ordered by index), plus what the labels say about the node."""

    samples: tuple[GpuSample, ...]
    driver_version: str = ""
    exporter_hostname: str = ""


class _Gpu:
    """One GPU's values while the page is read."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.uuid = ""
        self.pci_bus_id = ""
        self.name = ""
        self.values: dict[str, int] = {}
        self.from_mig: set[str] = set()
        self.unsupported: list[str] = []
        self.errors: list[str] = []

    def put(self, field: str, sample: PromSample, convert: Callable[[float], int]) -> None:
        mig = any(label in sample.labels for label in _MIG_LABELS)
        if field in self.values and (mig or field not in self.from_mig):
            return  # first whole-GPU value wins; a MIG instance's copy only fills a gap
        problem = _problem(sample.value)
        if problem == "NOT_SUPPORTED":
            self.unsupported.append(field)
            return
        if problem == "BLANK":
            return  # DCGM has no value yet: unknown, like a field the page lacks
        if problem:
            self.errors.append(f"{field}: {problem} ({sample.name})")
            return
        if field in _COUNTERS and sample.value < 0:
            self.errors.append(f"{field}: negative value {sample.value} ({sample.name})")
            return
        self.values[field] = convert(sample.value)
        if mig:
            self.from_mig.add(field)
        else:
            self.from_mig.discard(field)


def _problem(value: float) -> str:
    """Why ``value`` is not a reading ("" when it is one): NaN, infinite, or one of DCGM's blank sentinels."""
    if isinstance(value, int):
        if abs(value) >= 2**64:
            return "value out of range"
    elif math.isnan(value):
        return "NaN"
    elif math.isinf(value):
        return "infinite value"
    for base, span in ((_INT64_BLANK, 16), (_INT32_BLANK, 16)):
        if isinstance(value, int) and base <= value < base + span:
            return _BLANK_KIND.get(value - base, "BLANK")
    if value >= float(_INT64_BLANK):  # an int64 sentinel written as a float
        return "BLANK"
    if _FP64_BLANK <= value < _FP64_BLANK + 16:
        return _BLANK_KIND.get(int(value - _FP64_BLANK), "BLANK")
    return ""


def _index(labels: dict[str, str]) -> int | None:
    gpu = labels.get("gpu", "")
    if gpu.isdigit():
        return int(gpu)
    match = _DEVICE.fullmatch(labels.get("device", ""))
    return int(match.group(1)) if match else None


def _label(labels: dict[str, str], *names: str) -> str:
    return next((labels[n] for n in names if labels.get(n)), "")


def parse_exporter_page(text: str, host: str, *, observed_at: datetime | None = None) -> DcgmPage:
    """Map a dcgm-exporter page to one ``GpuSample`` per GPU.

    Args:
        text: The page, as served at ``/metrics``.
        host: The node the page belongs to, stamped on every sample (the exporter's own host label may differ).
        observed_at: When the page was read, stamped on every sample.

    Returns:
        The GPUs on the page (ordered by index) and the driver version and hostname from the labels.

    Raises:
        ExpositionError: The text is not a valid exposition page.
    """
    page = parse_exposition(text)
    gpus: dict[str, _Gpu] = {}
    driver = hostname = ""
    for sample in page.samples:
        target = _FIELDS.get(sample.name)
        labels = dict(sample.labels)
        if not sample.name.startswith("DCGM_FI_") or any(label in labels for label in _NON_GPU_LABELS):
            continue
        index = _index(labels)
        if index is None:
            continue
        uuid = _label(labels, "UUID", "uuid", "gpu_uuid")
        gpu = gpus.setdefault(uuid or f"index:{index}", _Gpu(index))
        gpu.uuid = gpu.uuid or uuid
        gpu.pci_bus_id = gpu.pci_bus_id or labels.get("pci_bus_id", "")
        gpu.name = gpu.name or _label(labels, "modelName", "model_name")
        driver = driver or labels.get("DCGM_FI_DRIVER_VERSION", "")
        hostname = hostname or _label(labels, "Hostname", "hostname")
        if target is not None:
            gpu.put(target[0], sample, target[1])
    samples = [_to_sample(gpu, host, observed_at) for gpu in gpus.values()]
    samples.sort(key=lambda s: (s.index, s.uuid))
    return DcgmPage(samples=tuple(samples), driver_version=driver, exporter_hostname=hostname)


def _to_sample(gpu: _Gpu, host: str, observed_at: datetime | None) -> GpuSample:
    values = dict(gpu.values)
    flit, data = values.pop("nvlink_crc_flit", None), values.pop("nvlink_crc_data", None)
    unsupported = list(gpu.unsupported)
    if flit is not None or data is not None:
        values["nvlink_crc_errors"] = (flit or 0) + (data or 0)
    elif {"nvlink_crc_flit", "nvlink_crc_data"} & set(unsupported):
        unsupported.append("nvlink_crc_errors")
    unsupported = [f for f in unsupported if f not in ("nvlink_crc_flit", "nvlink_crc_data", "memory_reserved")]
    reserved = values.pop("memory_reserved", 0)
    if "memory_total_bytes" not in values and "memory_used_bytes" in values and "memory_free_bytes" in values:
        # FB_TOTAL is not in the default counters: DCGM's total is used + free + reserved.
        values["memory_total_bytes"] = values["memory_used_bytes"] + values["memory_free_bytes"] + reserved
    return GpuSample.model_validate(
        {
            **values,
            "host": host,
            "index": gpu.index,
            "uuid": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
            "name": gpu.name,
            "observed_at": observed_at,
            "unsupported": tuple(dict.fromkeys(unsupported)),
            "errors": tuple(dict.fromkeys(gpu.errors)),  # duplicate series (one per pod) repeat their problems
        }
    )
