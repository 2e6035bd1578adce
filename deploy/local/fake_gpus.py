"""A ``GpuSource`` over the fake NVML's state file, read in Python: many fake nodes in one process.

The fake ``libnvidia-ml.so.1`` (``deploy/local/fake_nvml``) serves one node per process (NVML is one library per
process, its state file named by ``FAKE_NVML_STATE``). A process that serves many nodes' task queues (the lab at
64 nodes, the scale benchmark's thousands: ``deploy/local/node_agents.py``) reads each node's state file here
instead, with the same grammar (``deploy/local/fake_nvml_state.py``), so ``rebound lab inject xid`` and the
benchmark's injector raise faults the same way for both.

What it reads: ``driver``, ``count``, ``gpu I lost 1`` (the GPU falls off the bus: ``lost`` in samples and one
``gpu_lost`` event), ``gpu I temp T`` and ``xid I N`` (an XID event on GPU I). Other per-GPU fields of the grammar
are accepted and not modelled (the C fake models them; tests of those fields use it). Lines appended after the
source opened are new events; lines present at open are events observed at open (as the C fake replays its event
log to a new event set: the push loop's start-up grace leaves them as evidence, not triggers). A state file
rewritten smaller (a node's GPUs reset) starts a fresh healthy state.
"""

from __future__ import annotations

import contextlib
import threading
from datetime import UTC, datetime
from pathlib import Path

from activities.gpu.port import EventBatch, EventLog
from deploy.local.fake_nvml import fake_gpu_uuid, fake_pci_bus_id
from deploy.local.fake_nvml_state import DEFAULT_DRIVER_VERSION
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import GpuEvent, GpuEventKind, GpuSample

__all__ = ["StateFileGpuSource"]

SOURCE_NAME = "fake-state"
_GPU_NAME = "NVIDIA H100 80GB HBM3 (fake)"
_MEMORY_TOTAL = 80 * 1024**3


class StateFileGpuSource:
    """One fake node's GPUs, read from its fake NVML state file. Thread-safe; cheap (a ``stat`` per event read)."""

    def __init__(self, host: str, state_file: Path, *, event_capacity: int = 1024) -> None:
        self._host = host
        self._path = state_file
        self._log = EventLog(event_capacity)
        self._lock = threading.Lock()
        self._open = False
        self._offset = 0
        self._size = -1
        self._driver = DEFAULT_DRIVER_VERSION
        self._count = 0
        self._lost: set[int] = set()
        self._temp: dict[int, int] = {}
        self._last_xid: dict[int, int] = {}

    @property
    def host(self) -> str:
        return self._host

    def open(self) -> None:
        """Read the state file. Idempotent.

        Raises:
            ReboundError: ``GPU_SOURCE_UNAVAILABLE`` when the state file cannot be read.
        """
        with self._lock:
            if not self._open:
                self._refresh()
                self._open = True

    def driver_version(self) -> str:
        with self._lock:
            self._require_open()
            return self._driver

    def sample(self) -> list[GpuSample]:
        with self._lock:
            self._require_open()
            self._refresh()
            now = datetime.now(UTC)
            return [self._sample_one(i, now) for i in range(self._count)]

    def events_after(self, cursor: int) -> EventBatch:
        with self._lock:
            if self._open:
                # A state file briefly missing (being rewritten) is read again next time.
                with contextlib.suppress(ReboundError):
                    self._refresh()
            return self._log.after(cursor)

    def add_event(self, event: GpuEvent) -> GpuEvent:
        return self._log.append(event)

    def close(self) -> None:
        with self._lock:
            self._open = False

    # ------------------------------------------------------------------ reading the file

    def _require_open(self) -> None:
        if not self._open:
            raise ReboundError(FailureKind.GPU_SOURCE_UNAVAILABLE, f"fake GPUs of {self._host} are not open")

    def _refresh(self) -> None:
        try:
            size = self._path.stat().st_size
            if size == self._size:
                return
            if size < self._size:  # rewritten: a fresh healthy node
                self._offset, self._lost, self._temp, self._last_xid = 0, set(), {}, {}
            with self._path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError as e:
            raise ReboundError(FailureKind.GPU_SOURCE_UNAVAILABLE, f"fake GPU state {self._path}: {e}") from e
        complete = data[: data.rfind(b"\n") + 1]  # a line still being appended is read next time
        self._offset += len(complete)
        self._size = self._offset if len(complete) < len(data) else size
        for line in complete.decode("utf-8", "replace").splitlines():
            self._apply(line.split("#", 1)[0].split())

    def _apply(self, words: list[str]) -> None:
        if len(words) == 2 and words[0] == "driver":
            self._driver = words[1]
        elif len(words) == 2 and words[0] == "count" and words[1].isdigit():
            self._count = int(words[1])
        elif len(words) == 3 and words[0] == "xid" and words[1].isdigit() and words[2].isdigit():
            index, xid = int(words[1]), int(words[2])
            self._last_xid[index] = xid
            self._emit(GpuEventKind.XID, index, xid)
        elif len(words) >= 4 and words[0] == "gpu" and words[1].isdigit() and words[3].lstrip("-").isdigit():
            index, field, value = int(words[1]), words[2], int(words[3])
            if field == "lost" and value and index not in self._lost:
                self._lost.add(index)
                self._emit(GpuEventKind.GPU_LOST, index, None)
            elif field == "temp":
                self._temp[index] = value

    def _emit(self, kind: GpuEventKind, index: int, xid: int | None) -> None:
        self._log.append(
            GpuEvent(
                kind=kind,
                host=self._host,
                index=index,
                uuid=fake_gpu_uuid(self._host, index),
                pci_bus_id=fake_pci_bus_id(self._host, index),
                xid=xid,
                source=SOURCE_NAME,
                observed_at=datetime.now(UTC),
            )
        )

    def _sample_one(self, index: int, now: datetime) -> GpuSample:
        base = GpuSample(
            host=self._host,
            index=index,
            uuid=fake_gpu_uuid(self._host, index),
            pci_bus_id=fake_pci_bus_id(self._host, index),
            name=_GPU_NAME,
            last_xid=self._last_xid.get(index),
            observed_at=now,
        )
        if index in self._lost:
            return base.model_copy(update={"lost": True})
        return base.model_copy(
            update={
                "temperature_c": self._temp.get(index, 40),
                "utilization_gpu_pct": 0,
                "memory_total_bytes": _MEMORY_TOTAL,
                "memory_used_bytes": 0,
                "memory_free_bytes": _MEMORY_TOTAL,
                "ecc_uncorrected_volatile": 0,
                "ecc_corrected_volatile": 0,
                "retired_pages_pending": False,
                "remap_pending": False,
                "remap_failure": False,
            }
        )
