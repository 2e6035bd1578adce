"""GPU health records shared by the node-side NVML source and the central DCGM-exporter source."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from workflows.domain.base import Frozen


class GpuSample(Frozen):
    """One GPU's health fields at one moment. ``None`` means unknown; ``unsupported`` names fields the driver lacks."""

    host: str
    index: int
    uuid: str = ""
    pci_bus_id: str = ""
    name: str = ""
    lost: bool = False
    temperature_c: int | None = None
    utilization_gpu_pct: int | None = None
    utilization_mem_pct: int | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_mw: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    ecc_corrected_aggregate: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    clocks_event_reasons: int | None = None
    pcie_replay_count: int | None = None
    nvlink_crc_errors: int | None = None
    """CRC flit plus CRC data errors, summed over the active NVLinks."""
    unsupported: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    """Fields whose read failed for another reason, as ``field: error``."""


class GpuEventKind(StrEnum):
    """What happened to a GPU."""

    XID = "xid"
    ECC_DBE = "ecc_dbe"
    GPU_LOST = "gpu_lost"
    GPU_MISSING = "gpu_missing"
    SOURCE_DOWN = "source_down"


class GpuEvent(Frozen):
    """A discrete GPU fault, as reported by NVML's event API or derived from a DCGM-exporter scrape."""

    kind: GpuEventKind
    host: str
    index: int | None = None
    uuid: str = ""
    pci_bus_id: str = ""
    xid: int | None = None
    source: str = ""
    observed_at: datetime | None = None
    sequence: int = 0
    """Position in the reporting source's event stream; an event cursor names the last sequence seen."""


class GpuHealthReport(Frozen):
    """What a node agent returns for one read: every GPU's sample plus the events seen since the cursor."""

    host: str
    driver_version: str = ""
    samples: tuple[GpuSample, ...] = ()
    events: tuple[GpuEvent, ...] = ()
    error: str = ""
    """Set when NVML itself could not be read (no driver, library missing): the report is then empty but valid."""
    next_event_cursor: int = 0
    """Pass this as the next read's ``event_cursor`` to get only the events after these ones."""
    events_missed: int = 0
    """Events that left the source's bounded buffer before this cursor could read them."""


class NvmlReadGpuHealthInput(Frozen):
    """Input of the ``nvml_read_gpu_health`` activity."""

    event_cursor: int = 0
    """The previous report's ``next_event_cursor``; 0 reads every event the node agent still holds."""


class NodeGpuHealthInput(Frozen):
    """Read one node's GPUs through its node agent; events after ``event_cursor``."""

    node: str
    event_cursor: int = 0


class NodeGpuHealthResult(Frozen):
    """The node's report, or why the agent could not give one (``agent_reachable=False``)."""

    node: str
    agent_reachable: bool
    report: GpuHealthReport | None = None
    error: str = ""
