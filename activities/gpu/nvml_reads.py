"""Reading one GPU through pynvml: its identity (cached at open), then every health field on its own.

Every field is read on its own, so one ``NOT_SUPPORTED`` (recorded in ``unsupported``) or other failure (recorded
in ``errors``) never sinks the rest of the sample; ``GPU_IS_LOST`` sets ``lost``. Drivers without
``ClocksEventReasons``/``TemperatureV`` fall back to ``ThrottleReasons``/``Temperature``. The GPU recovery action is
a field value (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, R570+): each field carries its own return code, which is
checked like a call's, so a driver without it leaves the action unread (None), never ``none``. Blocking; the caller
(``activities.gpu.nvml.NvmlSource``) serialises the calls.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from workflows.domain.gpu import GpuRecoveryAction, GpuSample

__all__ = ["NvmlGpu", "NvmlReader", "handle_address"]

log = logging.getLogger(__name__)

_NVLINK_CRC_COUNTERS = ("NVML_NVLINK_ERROR_DL_CRC_FLIT", "NVML_NVLINK_ERROR_DL_CRC_DATA")
_ECC_FIELDS = (
    ("ecc_uncorrected_volatile", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
    ("ecc_corrected_volatile", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
    ("ecc_uncorrected_aggregate", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"),
    ("ecc_corrected_aggregate", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"),
)
_REMAP_FIELDS = ("remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending", "remap_failure")
# Page retirement (before Ampere; Ampere and later answer NOT_SUPPORTED and remap rows instead).
_RETIRED_PAGE_FIELDS = (
    ("retired_pages_sbe", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
    ("retired_pages_dbe", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"),
)


@dataclass
class NvmlGpu:
    """What open() learnt about one GPU; the handle is None when the GPU was already unreachable."""

    index: int
    handle: Any = None
    address: int | None = None
    uuid: str = ""
    pci_bus_id: str = ""
    name: str = ""
    open_error: str = ""


class _Fields:
    """Collects one GPU's fields, turning each failed read into ``unsupported``/``errors``/``lost``."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self.values: dict[str, object] = {}
        self.unsupported: list[str] = []
        self.errors: list[str] = []
        self.lost = False

    def read(self, fields: tuple[str, ...], call: Callable[[], tuple[object, ...]]) -> None:
        """Store ``call()``'s values under ``fields``; a failure is recorded against all of them."""
        nv = self._nv
        try:
            self.values.update(zip(fields, call(), strict=True))
        except nv.NVMLError_NotSupported:
            self.unsupported.extend(fields)
        except nv.NVMLError_GpuIsLost:
            self.lost = True
        except nv.NVMLError as exc:
            self.errors.extend(f"{field}: {exc} (NVML error {exc.value})" for field in fields)


def handle_address(handle: Any) -> int | None:
    """The device a pynvml handle points to, as a number (events name their device by handle)."""
    # A pynvml handle is a ctypes pointer; its integer value identifies the device across calls and events.
    value = ctypes.cast(handle, ctypes.c_void_p).value
    return int(value) if value is not None else None


class NvmlReader:
    """Reads GPUs through an initialised pynvml module, remembering which newer calls this driver lacks."""

    def __init__(self, nv: Any, host: str) -> None:
        self._nv = nv
        self._host = host
        self._use_temperature_v = True
        self._use_clocks_event = True

    def identify(self, index: int) -> NvmlGpu:
        """The GPU at ``index`` with its handle and identity; ``open_error`` says why there is no handle."""
        nv = self._nv
        gpu = NvmlGpu(index=index)
        try:
            gpu.handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError_GpuIsLost:
            gpu.open_error = "lost"
            return gpu
        except nv.NVMLError as exc:
            gpu.open_error = f"handle: {exc} (NVML error {exc.value})"
            return gpu
        gpu.address = handle_address(gpu.handle)
        # Each identity field on its own: a GPU that answers some queries still gets what it can give.
        for attr, fetch in (
            ("uuid", nv.nvmlDeviceGetUUID),
            ("pci_bus_id", lambda h: nv.nvmlDeviceGetPciInfo(h).busId),
            ("name", nv.nvmlDeviceGetName),
        ):
            try:
                setattr(gpu, attr, str(fetch(gpu.handle)))
            except nv.NVMLError as exc:
                log.warning("GPU %d on %s: cannot read %s: %s", index, self._host, attr, exc)
        return gpu

    def read(self, gpu: NvmlGpu) -> GpuSample:
        """One sample of ``gpu`` (which has a handle); each failed read is recorded in the sample, never raised."""
        nv = self._nv
        h = gpu.handle
        f = _Fields(nv)
        observed_at = datetime.now(UTC)
        f.read(("temperature_c",), lambda: (self._temperature(h),))
        f.read(("utilization_gpu_pct", "utilization_mem_pct"), lambda: self._utilization(h))
        f.read(("memory_used_bytes", "memory_total_bytes", "memory_free_bytes"), lambda: self._memory(h))
        f.read(("power_mw",), lambda: (int(nv.nvmlDeviceGetPowerUsage(h)),))
        f.read(("sm_clock_mhz",), lambda: (int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),))
        f.read(("sm_clock_max_mhz",), lambda: (int(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),))
        for field, err_type, counter in _ECC_FIELDS:
            f.read((field,), functools.partial(self._ecc, h, err_type, counter))
        f.read(
            ("retired_pages_pending",),
            lambda: (int(nv.nvmlDeviceGetRetiredPagesPendingStatus(h)) == int(nv.NVML_FEATURE_ENABLED),),
        )
        for field, cause in _RETIRED_PAGE_FIELDS:
            f.read((field,), functools.partial(self._retired_pages, h, cause))
        f.read(_REMAP_FIELDS, lambda: self._remapped_rows(h))
        f.read(("clocks_event_reasons",), lambda: (self._clocks_event_reasons(h),))
        f.read(("pcie_replay_count",), lambda: (int(nv.nvmlDeviceGetPcieReplayCounter(h)),))
        f.read(("nvlink_crc_errors",), lambda: (self._nvlink_crc_errors(h),))
        f.read(("recovery_action", "recovery_action_code"), lambda: self._recovery_action(h))
        return GpuSample.model_validate(
            {
                **f.values,
                "host": self._host,
                "index": gpu.index,
                "uuid": gpu.uuid,
                "pci_bus_id": gpu.pci_bus_id,
                "name": gpu.name,
                "lost": f.lost,
                "observed_at": observed_at,
                "unsupported": tuple(f.unsupported),
                "errors": tuple(f.errors),
            }
        )

    def _temperature(self, h: Any) -> int:
        nv = self._nv
        if self._use_temperature_v and hasattr(nv, "nvmlDeviceGetTemperatureV"):
            try:
                return int(nv.nvmlDeviceGetTemperatureV(h, nv.NVML_TEMPERATURE_GPU))
            except nv.NVMLError_FunctionNotFound:
                self._use_temperature_v = False  # older driver: the deprecated call is all there is
        return int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))

    def _clocks_event_reasons(self, h: Any) -> int:
        nv = self._nv
        if self._use_clocks_event and hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons"):
            try:
                return int(nv.nvmlDeviceGetCurrentClocksEventReasons(h))
            except nv.NVMLError_FunctionNotFound:
                self._use_clocks_event = False  # drivers before the rename only know "throttle reasons"
        return int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))

    def _ecc(self, h: Any, err_type: str, counter: str) -> tuple[int]:
        nv = self._nv
        return (int(nv.nvmlDeviceGetTotalEccErrors(h, getattr(nv, err_type), getattr(nv, counter))),)

    def _utilization(self, h: Any) -> tuple[int, int]:
        rates = self._nv.nvmlDeviceGetUtilizationRates(h)
        return int(rates.gpu), int(rates.memory)

    def _memory(self, h: Any) -> tuple[int, int, int]:
        mem = self._nv.nvmlDeviceGetMemoryInfo(h)
        return int(mem.used), int(mem.total), int(mem.free)

    def _retired_pages(self, h: Any, cause: str) -> tuple[int]:
        # The count is all a verdict needs; pynvml sizes the buffer itself (a first call with count 0).
        return (len(self._nv.nvmlDeviceGetRetiredPages(h, getattr(self._nv, cause))),)

    def _remapped_rows(self, h: Any) -> tuple[int, int, bool, bool]:
        corr, unc, pending, failure = self._nv.nvmlDeviceGetRemappedRows(h)
        return int(corr), int(unc), bool(pending), bool(failure)

    def recovery_action(self, gpu: NvmlGpu) -> GpuRecoveryAction | None:
        """The GPU's recovery action now, or None when it cannot be read (XID 154's event carries it: the event
        itself says only that the action changed)."""
        if gpu.handle is None:
            return None
        try:
            return self._recovery_action(gpu.handle)[0]
        except self._nv.NVMLError:
            return None

    def _recovery_action(self, h: Any) -> tuple[GpuRecoveryAction, int]:
        nv = self._nv
        field = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field is None:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)  # a pynvml older than the field cannot ask for it
        try:
            (value,) = nv.nvmlDeviceGetFieldValues(h, [field])
        except nv.NVMLError_FunctionNotFound:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED) from None
        rc = int(value.nvmlReturn)
        if rc == int(nv.NVML_ERROR_INVALID_ARGUMENT):
            rc = int(nv.NVML_ERROR_NOT_SUPPORTED)  # a driver that does not know the field id at all
        if rc != int(nv.NVML_SUCCESS):
            raise nv.NVMLError(rc)
        code = _field_int(nv, value)
        return GpuRecoveryAction.from_code(code), code

    def _nvlink_crc_errors(self, h: Any) -> int:
        nv = self._nv
        total = 0
        for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
            try:
                active = int(nv.nvmlDeviceGetNvLinkState(h, link)) == int(nv.NVML_FEATURE_ENABLED)
            except (nv.NVMLError_InvalidArgument, nv.NVMLError_NotSupported):
                if link == 0:
                    raise  # no NVLink at all: the caller records NOT_SUPPORTED (or the error)
                break  # past this GPU's last link
            if active:
                total += sum(
                    int(nv.nvmlDeviceGetNvLinkErrorCounter(h, link, getattr(nv, c))) for c in _NVLINK_CRC_COUNTERS
                )
        return total


def _field_int(nv: Any, value: Any) -> int:
    """A field value's number, read from the union member its ``valueType`` names."""
    member = {
        int(nv.NVML_VALUE_TYPE_UNSIGNED_INT): "uiVal",
        int(nv.NVML_VALUE_TYPE_UNSIGNED_LONG): "ulVal",
        int(nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG): "ullVal",
        int(nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG): "sllVal",
        int(nv.NVML_VALUE_TYPE_SIGNED_INT): "siVal",
        int(nv.NVML_VALUE_TYPE_UNSIGNED_SHORT): "usVal",
    }.get(int(value.valueType))
    if member is None:  # a double, or a type this code does not know: not a recovery action number
        raise nv.NVMLError(nv.NVML_ERROR_UNKNOWN)
    return int(getattr(value.value, member))
