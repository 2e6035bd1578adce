"""NvmlSource: one node's GPU health through NVML, with the unmodified nvidia-ml-py (module ``pynvml``).

Decisions (docs: shared/facts/gpu-signals.md §5):

- UUID, PCI bus id and name are cached at open: after a GPU falls off the bus every query on it fails, and
  the identity is exactly what a fault report needs then.
- Every field is read on its own (``activities.gpu.nvml_reads``), so one ``NOT_SUPPORTED`` or other failure
  never sinks the rest of the sample; ``GPU_IS_LOST`` sets ``lost``.
- A daemon thread waits in ``nvmlEventSetWait_v2`` with short timeouts (ctypes releases the GIL while it
  blocks), so ``close()`` stops it within one timeout. It maps ``eventData.device`` to an index by handle
  ADDRESS: ``nvmlDeviceGetIndex`` on the device of an XID 79 returns ``GPU_IS_LOST``, as nvml.h documents.
- ``gpu_lost`` is reported once per loss: by the event thread for GPUs registered with it (after the pending
  events, so an XID 79 comes before the loss it caused), by ``sample()`` for the others.
- An XID 154 event only says that the GPU's recovery action changed: the event thread reads the action then
  (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``) and the event carries it, so 154 back to none is not judged a fault.

pynvml is imported lazily, in ``open()``, so nothing else needs NVML installed to import this module.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from activities.gpu.nvml_reads import NvmlGpu, NvmlReader, handle_address
from activities.gpu.port import EventBatch, EventLog
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import GpuEvent, GpuEventKind, GpuRecoveryAction, GpuSample

__all__ = ["NvmlSource"]

log = logging.getLogger(__name__)

SOURCE_NAME = "nvml"


class NvmlSource:
    """GPU health of this node through NVML. Thread-safe; blocking: call it from a worker thread."""

    def __init__(self, host: str, *, event_poll_ms: int = 100, event_capacity: int = 1024) -> None:
        """Create a closed source.

        Args:
            host: This node's scheduler name, stamped on every sample and event.
            event_poll_ms: Longest single wait in ``nvmlEventSetWait_v2``; bounds how long ``close()`` takes.
            event_capacity: Events buffered for readers; older ones are dropped and counted as missed.
        """
        self._host = host
        self._poll_ms = event_poll_ms
        self._log = EventLog(event_capacity)
        self._lock = threading.Lock()  # open/close/sample
        self._lost_lock = threading.Lock()  # _lost_reported/_covered, shared with the event thread
        self._lost_reported: set[int] = set()
        self._covered: set[int] = set()  # GPUs whose losses the event thread reports
        self._nv: Any = None
        self._gpus: list[NvmlGpu] = []
        self._driver = ""
        self._open = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reader: NvmlReader | None = None

    @property
    def host(self) -> str:
        """The node whose GPUs this source reads."""
        return self._host

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Initialise NVML, cache every GPU's identity and start the event thread. Idempotent.

        Raises:
            ReboundError: ``GPU_SOURCE_UNAVAILABLE`` if NVML cannot be initialised or enumerated (no library,
                no driver); ``CONFIGURATION`` if nvidia-ml-py is not installed.
        """
        with self._lock:
            if self._open:
                return
            nv = self._import_pynvml()
            try:
                nv.nvmlInit()
            except nv.NVMLError as exc:
                raise ReboundError(FailureKind.GPU_SOURCE_UNAVAILABLE, f"NVML init failed: {exc}") from exc
            try:
                driver = str(nv.nvmlSystemGetDriverVersion())
                count = int(nv.nvmlDeviceGetCount())
            except nv.NVMLError as exc:
                self._shutdown(nv)
                raise ReboundError(FailureKind.GPU_SOURCE_UNAVAILABLE, f"NVML enumeration failed: {exc}") from exc
            self._nv, self._driver = nv, driver
            self._reader = NvmlReader(nv, self._host)
            self._gpus = [self._reader.identify(i) for i in range(count)]
            for gpu in self._gpus:
                if gpu.handle is None and gpu.open_error == "lost":
                    self._note_lost(gpu)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run_events, name=f"nvml-events-{self._host}", daemon=True)
            self._thread.start()
            self._open = True
            log.info("NVML open on %s: driver %s, %d GPU(s)", self._host, driver, count)

    def close(self) -> None:
        """Stop the event thread and shut NVML down. Idempotent."""
        with self._lock:
            if not self._open:
                return
            self._open = False
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=2 + 3 * self._poll_ms / 1000)
                if self._thread.is_alive():
                    # nvmlShutdown under a thread still inside NVML is undefined behaviour: leave NVML up.
                    log.warning("NVML event thread on %s did not stop; NVML left initialised", self._host)
                    return
            self._shutdown(self._nv)

    def __enter__(self) -> NvmlSource:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @staticmethod
    def _import_pynvml() -> Any:
        try:
            import pynvml
        except ImportError as exc:
            raise ReboundError(
                FailureKind.CONFIGURATION, "nvidia-ml-py is not installed (module pynvml missing)"
            ) from exc
        return pynvml

    @staticmethod
    def _shutdown(nv: Any) -> None:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.warning("nvmlShutdown failed: %s", exc)

    # ------------------------------------------------------------------ reads

    def driver_version(self) -> str:
        """The driver version read at open.

        Raises:
            ReboundError: ``GPU_SOURCE_UNAVAILABLE`` when the source is not open.
        """
        with self._lock:
            self._require_open()
            return self._driver

    def sample(self) -> list[GpuSample]:
        """Read every GPU once; failures are recorded per field, never raised.

        Raises:
            ReboundError: ``GPU_SOURCE_UNAVAILABLE`` when the source is not open.
        """
        with self._lock:
            self._require_open()
            return [self._sample_one(gpu) for gpu in self._gpus]

    def events_after(self, cursor: int) -> EventBatch:
        """Events collected since ``cursor`` (0: everything still buffered), oldest first."""
        return self._log.after(cursor)

    def add_event(self, event: GpuEvent) -> GpuEvent:
        """An event the node's kernel log reported, into the same stream as NVML's own (``GpuSource.add_event``)."""
        return self._log.append(event)

    def _require_open(self) -> None:
        if not self._open:
            raise ReboundError(FailureKind.GPU_SOURCE_UNAVAILABLE, f"NVML source for {self._host} is not open")

    def _sample_one(self, gpu: NvmlGpu) -> GpuSample:
        assert self._reader is not None
        if gpu.handle is None:
            # Lost (or unreadable) at open: it may have come back since (the lab resets a node's GPUs).
            retry = self._reader.identify(gpu.index)
            if retry.handle is None:
                lost = retry.open_error == "lost"
                errors = () if lost else (retry.open_error,)
                return GpuSample(
                    host=self._host, index=gpu.index, lost=lost, errors=errors, observed_at=datetime.now(UTC)
                )
            self._gpus[gpu.index] = gpu = retry
        sample = self._reader.read(gpu)
        if sample.lost:
            self._note_lost(gpu, from_sample=True)
        else:
            with self._lost_lock:
                self._lost_reported.discard(gpu.index)  # back on the bus: a later loss is news again
        return sample

    # ------------------------------------------------------------------ events

    def _note_lost(self, gpu: NvmlGpu, *, from_sample: bool = False) -> None:
        with self._lost_lock:
            if gpu.index in self._lost_reported or (from_sample and gpu.index in self._covered):
                return
            self._lost_reported.add(gpu.index)
        self._emit(GpuEventKind.GPU_LOST, gpu)

    def _emit(
        self,
        kind: GpuEventKind,
        gpu: NvmlGpu | None,
        xid: int | None = None,
        recovery_action: GpuRecoveryAction | None = None,
    ) -> None:
        event = GpuEvent(
            kind=kind,
            host=self._host,
            index=gpu.index if gpu is not None else None,
            uuid=gpu.uuid if gpu is not None else "",
            pci_bus_id=gpu.pci_bus_id if gpu is not None else "",
            xid=xid,
            source=SOURCE_NAME,
            observed_at=datetime.now(UTC),
            recovery_action=recovery_action,
        )
        numbered = self._log.append(event)
        log.warning("GPU event on %s: %s GPU %s xid=%s", self._host, kind.value, numbered.index, xid)

    def _run_events(self) -> None:
        nv, stop = self._nv, self._stop
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.error("NVML events unavailable on %s: %s", self._host, exc)
            return
        try:
            by_address = self._register(event_set)
            if by_address:
                self._wait_loop(event_set, by_address, stop)
        except Exception:  # a dead event thread must be visible in the log, not silent
            log.exception("NVML event thread on %s failed", self._host)
        finally:
            with self._lost_lock:
                self._covered.clear()  # sample() reports losses from now on
            try:
                nv.nvmlEventSetFree(event_set)
            except nv.NVMLError as exc:
                log.warning("nvmlEventSetFree failed on %s: %s", self._host, exc)

    def _register(self, event_set: Any) -> dict[int, NvmlGpu]:
        nv = self._nv
        wanted = int(nv.nvmlEventTypeXidCriticalError) | int(nv.nvmlEventTypeDoubleBitEccError)
        by_address: dict[int, NvmlGpu] = {}
        for gpu in list(self._gpus):
            if gpu.handle is None or gpu.address is None:
                continue
            try:
                mask = wanted & int(nv.nvmlDeviceGetSupportedEventTypes(gpu.handle))
                if mask:
                    nv.nvmlDeviceRegisterEvents(gpu.handle, mask, event_set)
                    by_address[gpu.address] = gpu
            except nv.NVMLError_GpuIsLost:
                self._note_lost(gpu)
            except nv.NVMLError as exc:
                log.warning("GPU %d on %s: no events (%s)", gpu.index, self._host, exc)
        with self._lost_lock:
            self._covered.update(gpu.index for gpu in by_address.values())
        return by_address

    def _wait_loop(self, event_set: Any, by_address: dict[int, NvmlGpu], stop: threading.Event) -> None:
        nv = self._nv
        xid_mask = int(nv.nvmlEventTypeXidCriticalError)
        dbe_mask = int(nv.nvmlEventTypeDoubleBitEccError)
        pause = self._poll_ms / 1000
        while not stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(event_set, self._poll_ms)
            except nv.NVMLError_Timeout:
                continue
            except nv.NVMLError_GpuIsLost:
                # Pending events came first; now find which registered GPU is gone. The wait keeps failing
                # at once while it stays lost, so pause instead of spinning.
                self._probe_lost(by_address.values())
                stop.wait(pause)
                continue
            except nv.NVMLError as exc:
                log.warning("nvmlEventSetWait_v2 on %s failed: %s", self._host, exc)
                stop.wait(pause)
                continue
            address = handle_address(data.device)
            gpu = by_address.get(address) if address is not None else None
            event_type = int(data.eventType)
            if event_type & xid_mask:
                xid = int(data.eventData)
                action = self._reader.recovery_action(gpu) if xid == 154 and gpu and self._reader else None
                self._emit(GpuEventKind.XID, gpu, xid=xid, recovery_action=action)
            elif event_type & dbe_mask:
                self._emit(GpuEventKind.ECC_DBE, gpu)

    def _probe_lost(self, gpus: Iterable[NvmlGpu]) -> None:
        nv = self._nv
        for gpu in gpus:
            try:
                nv.nvmlDeviceGetIndex(gpu.handle)  # cheap; documented to return GPU_IS_LOST for a lost GPU
            except nv.NVMLError_GpuIsLost:
                self._note_lost(gpu)
            except nv.NVMLError:
                continue
