"""The node agent's kernel-log follower: records -> node events -> the node's one GPU event stream.

Each poll reads what is new (``activities.kernel.readers``), parses it (``activities.kernel.lines``), names the GPU
a line's PCI bus id belongs to from the agent's NVML view (``GpuSource.sample``), and adds the event to the node's
source (``GpuSource.add_event``). From there the existing path takes it (ADR 008): the push loop signals the jobs
on the node and, for a node-level fault no job heard of, the Fleet; a fresh read of the agent lists it, which is
what the trust rule asks before a claimed event counts (``workflows/policy/gpu_claims.py``). The position is saved
after each batch is in the stream, so a restarted agent goes on after it (ADR 016).

An XID NVML already reported (same GPU and XID within ``COPY_WINDOW``) is not added again: on a real node the
driver reports one fault both ways, and two copies would count as a repeat. Unless the line says more than NVML's
event (an NVLink5 XID's Fatal/Nonfatal label): that copy is added, and the verdicts judge it in place of NVML's
(``workflows/policy/xid_copies.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime, timedelta

from activities.gpu.port import GpuSource
from activities.kernel.lines import SOURCE, normalize_pci, parse_line
from activities.kernel.readers import KernelLogReader, PositionStore
from workflows.domain.errors import ReboundError
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.node_events import KernelRecord, KernelSeverity, NodeEventKind, SxidCatalog
from workflows.policy.xid_copies import copies_of_one_fault

__all__ = ["KernelLogFollower", "follow_kernel_log"]

log = logging.getLogger("rebound.node_agent.kernel_log")


class KernelLogFollower:
    """Turns one node's kernel log into events on its GPU source. Synchronous; ``follow_kernel_log`` runs it."""

    def __init__(
        self, host: str, reader: KernelLogReader, source: GpuSource, sxids: SxidCatalog, store: PositionStore
    ) -> None:
        self._host = host
        self._reader = reader
        self._source = source
        self._sxids = sxids
        self._store = store
        self._gpus: dict[str, tuple[int, str]] = {}

    def poll(self) -> list[GpuEvent]:
        """Read, parse and add what is new; the events added.

        Raises:
            ReboundError: ``GPU_SOURCE_UNAVAILABLE`` when the log cannot be read (the caller retries).
        """
        batch = self._reader.read()
        added: list[GpuEvent] = []
        if batch.missed:
            added.append(self._source.add_event(self._overrun(batch.missed)))
        for record in batch.records:
            event = parse_line(record.message, host=self._host, sxids=self._sxids, observed_at=_wall_time(record))
            if event is None:
                continue
            event = self._pin(event)
            if event.kind is GpuEventKind.XID and self._nvml_has(event):
                if event.fatal is None and event.recovery_action is None:
                    log.info("XID %s on GPU %s: NVML reported it already", event.xid, event.index)
                    continue
                log.info("XID %s on GPU %s: NVML reported it; its line says more, added", event.xid, event.index)
            added.append(self._source.add_event(event))
            log.warning("kernel log on %s: %s", self._host, event.detail)
        if batch.records or batch.missed:
            self._store.save(batch.position)
        return added

    def _overrun(self, missed: int) -> GpuEvent:
        log.warning("kernel log of %s: %d records overwritten before they were read", self._host, missed)
        return GpuEvent(
            kind=GpuEventKind.NODE,
            host=self._host,
            source=SOURCE,
            observed_at=datetime.now(UTC),
            node_event=NodeEventKind.KMSG_OVERRUN,
            severity=KernelSeverity.INFO,
            device=self._reader.name,
            detail=f"{missed} kernel log records were overwritten before the agent read them",
        )

    def _pin(self, event: GpuEvent) -> GpuEvent:
        """The event with the GPU its PCI bus id names (index, UUID), where the NVML view has one."""
        if not event.pci_bus_id or event.kind not in (GpuEventKind.XID, GpuEventKind.GPU_LOST, GpuEventKind.NODE):
            return event
        key = normalize_pci(event.pci_bus_id)
        if key not in self._gpus:
            with contextlib.suppress(ReboundError):
                samples = self._source.sample()
                self._gpus = {normalize_pci(s.pci_bus_id): (s.index, s.uuid) for s in samples if s.pci_bus_id}
        if key not in self._gpus:
            return event  # not a GPU (a NIC's AER, an NVSwitch) or no NVML view: the PCI id stays the evidence
        index, uuid = self._gpus[key]
        return event.model_copy(update={"index": index, "uuid": uuid})

    def _nvml_has(self, event: GpuEvent) -> bool:
        dated = event if event.observed_at is not None else event.model_copy(update={"observed_at": datetime.now(UTC)})
        return any(copies_of_one_fault(dated, e) for e in self._source.events_after(0).events)

    def close(self) -> None:
        self._reader.close()


def _wall_time(record: KernelRecord) -> datetime:
    """When the kernel logged it: its boot-relative stamp on the wall clock (now, for a file-backed source)."""
    now = datetime.now(UTC)
    if record.ts_usec is None:
        return now
    age_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000 - record.ts_usec
    return now - timedelta(microseconds=max(0, age_us))


async def follow_kernel_log(follower: KernelLogFollower, stop: asyncio.Event, poll_s: float = 0.2) -> None:
    """Poll until ``stop`` is set. Never raises: an unreadable log is logged (once per change) and retried."""
    last_error = ""
    try:
        while not stop.is_set():
            try:
                await asyncio.to_thread(follower.poll)
                last_error = ""
            except ReboundError as e:
                if str(e) != last_error:
                    log.warning("kernel log not readable (%s); retrying", e)
                    last_error = str(e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=poll_s)
    finally:
        follower.close()
