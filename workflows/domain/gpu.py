"""GPU health records shared by the node-side NVML source and the central DCGM-exporter source."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from workflows.domain.base import Frozen
from workflows.domain.node_events import KernelSeverity, NodeEventKind


class GpuRecoveryAction(StrEnum):
    """What the driver says a GPU needs to recover (NVML's ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` field, and the new
    action an XID 154 line names). The values are pynvml's ``NVML_GPU_RECOVERY_ACTION_*`` constants 0-7, in order;
    ``UNKNOWN`` is a value pynvml does not define (its number is kept beside it)."""

    NONE = "none"
    GPU_RESET = "gpu_reset"
    NODE_REBOOT = "node_reboot"
    DRAIN_P2P = "drain_p2p"
    DRAIN_AND_RESET = "drain_and_reset"
    RECOVER_IMEX_DOMAIN = "recover_imex_domain"
    BUS_RESET = "bus_reset"
    SYSTEM_REBOOT = "system_reboot"
    UNKNOWN = "unknown"

    @classmethod
    def from_code(cls, code: int) -> GpuRecoveryAction:
        """The action NVML's number stands for; ``UNKNOWN`` for a number pynvml does not define."""
        return _RECOVERY_BY_CODE.get(code, cls.UNKNOWN)


#: pynvml's NVML_GPU_RECOVERY_ACTION_NONE (0) ... NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT (7), in that order.
_RECOVERY_BY_CODE = {code: action for code, action in enumerate(tuple(GpuRecoveryAction)[:-1])}


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
    memory_free_bytes: int | None = None
    power_mw: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    """The SM clock's maximum: a clock far below it while the GPU is busy and throttled shows what is withheld."""
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    ecc_corrected_aggregate: int | None = None
    retired_pages_pending: bool | None = None
    retired_pages_sbe: int | None = None
    """Pages retired for repeated single-bit errors (page retirement: before Ampere; later GPUs remap rows)."""
    retired_pages_dbe: int | None = None
    """Pages retired for double-bit errors."""
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    clocks_event_reasons: int | None = None
    pcie_replay_count: int | None = None
    nvlink_crc_errors: int | None = None
    """CRC flit plus CRC data errors, summed over the active NVLinks."""
    nvlink_replay_errors: int | None = None
    """DCGM: NVLink retransmissions, summed over the links (``DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL``)."""
    nvlink_recovery_errors: int | None = None
    """DCGM: NVLink link recoveries (the link went down and came back), ``..._RECOVERY_ERROR_COUNT_TOTAL``."""
    power_violation_us: int | None = None
    """DCGM: time throttled by the power limit, in microseconds since DCGM started (``DCGM_FI_DEV_POWER_VIOLATION``)."""
    thermal_violation_us: int | None = None
    """DCGM: time throttled by temperature, in microseconds (``DCGM_FI_DEV_THERMAL_VIOLATION``)."""
    recovery_action: GpuRecoveryAction | None = None
    """NVML's GPU recovery action field (drivers R570+); None: not read (unsupported, or the read failed: see
    ``unsupported``/``errors``), never taken for ``NONE``."""
    recovery_action_code: int | None = None
    """The field's raw number, kept for an ``UNKNOWN`` action (a value newer than pynvml)."""
    last_xid: int | None = None
    """DCGM only: the exporter's XID gauge, the LAST XID the GPU raised (0: none). Not an event: see GpuEvent."""
    missing: bool = False
    """The source listed this GPU before and does not any more (DCGM: gone from the exporter page)."""
    observed_at: datetime | None = None
    """When the source read the fields; two samples' times turn counter growth into a rate."""
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
    SXID = "sxid"
    """An NVSwitch error (kernel log): ``sxid`` set, ``pci_bus_id`` the switch's, no GPU index."""
    NODE = "node"
    """A kernel-log event about the node, not one GPU (``node_event`` says what: PCIe AER, InfiniBand, MCE...)."""


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
    sxid: int | None = None
    """Kind ``SXID``: the NVSwitch error number."""
    node_event: NodeEventKind | None = None
    """Kernel-log events: what the line reported (``source`` is then ``kernel log``)."""
    severity: KernelSeverity | None = None
    """Kernel-log events: the severity read from the line (an SXid's also from NVIDIA's table); policy maps it to an
    action (``workflows/policy/node_events.py``). None for NVML/DCGM events (the XID catalogue decides)."""
    device: str = ""
    """Kernel-log events: the other device the line names (NIC and port, block device, file system, server)."""
    detail: str = ""
    """Kernel-log events: the line itself, trimmed, for the record."""
    fatal: bool | None = None
    """The XID line's own ``Fatal``/``Nonfatal`` label (NVLink5 XIDs 144-150 print one); None where the source
    gives no line or the line no label. Where set, it outranks the catalogue's fixed severity for that XID."""
    recovery_action: GpuRecoveryAction | None = None
    """XID 154's new recovery action ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot
    Required)"); None where the source gives no line or the line names none."""


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


class XidCatalogEntry(Frozen):
    """One row of NVIDIA's XID catalogue (``activities/logs/xid_catalog.tsv``, read by ``activities.gpu.xid_catalog``).

    ``action`` is NVIDIA's immediate action ("resolution bucket": ``RESTART_APP``, ``RESET_GPU``, ``RESTART_BM``,
    ``IGNORE``, ``CONTACT_SUPPORT``, ``WORKFLOW_XID_48`` ...); ``-`` where the catalogue gives none.
    """

    xid: int
    mnemonic: str
    meaning: str
    action: str
    nvsentinel_action: str = "-"
    severity: str = "-"
    """NVSentinel's ``FATAL``/``NONFATAL``, or ``-``."""
    recommended_action: str = ""


class XidCatalog(Frozen):
    """The whole catalogue as data, so pure policy (and workflows) can use it without reading a file."""

    entries: tuple[XidCatalogEntry, ...] = ()
    version: str = ""
    """Where the table came from (file name and row count), for the record."""

    def get(self, xid: int) -> XidCatalogEntry | None:
        """The entry for ``xid``, or None for an XID the catalogue does not list."""
        return next((e for e in self.entries if e.xid == xid), None)


class GpuHealthStatus(StrEnum):
    """How a GPU (or a node: its worst GPU) is doing."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    """Working, but a signal is worth watching (or the job on it should restart)."""
    FAILED = "failed"
    """Must not run work until reset, rebooted or replaced."""


class GpuAction(StrEnum):
    """What to do about it, mildest first; a node's action is its GPUs' strongest."""

    NONE = "none"
    WATCH = "watch"
    RESTART_JOB = "restart_job"
    """The GPU is fine; the job that saw the error must restart (catalogue ``RESTART_APP``)."""
    RESET_GPU = "reset_gpu"
    """Drain the node, reset the GPU (``nvidia-smi -r``), return the node."""
    DRAIN_NODE = "drain_node"
    """Drain and keep out: reboot, diagnostics, RMA (a human decides)."""

    @property
    def rank(self) -> int:
        """Strength, for taking the strongest of several actions."""
        return _ACTION_RANK[self]


_ACTION_RANK = {action: rank for rank, action in enumerate(GpuAction)}


class GpuHealthFinding(Frozen):
    """One rule that fired for one GPU: the evidence behind a verdict, with a sentence a person can act on."""

    rule: str
    """Stable rule id (``ecc_dbe_volatile``, ``xid``, ``thermal_throttle`` ...): match on this, not on the text."""
    status: GpuHealthStatus
    action: GpuAction
    reason: str
    """Human-readable: names the field and its value, or the XID and its catalogue meaning."""
    field: str = ""
    """The ``GpuSample`` field the rule read; empty for event rules."""
    value: str = ""
    previous: str = ""
    """The previous sample's value, for growth rules."""
    xid: int | None = None
    event: GpuEvent | None = None
    source: str = ""
    """Which source's reading fired the rule (``nvml``, ``dcgm``); set where verdicts of two sources are merged."""


class GpuVerdict(Frozen):
    """One GPU's verdict: the worst of its findings (HEALTHY with no findings when nothing fired)."""

    host: str
    index: int | None = None
    uuid: str = ""
    pci_bus_id: str = ""
    status: GpuHealthStatus = GpuHealthStatus.HEALTHY
    action: GpuAction = GpuAction.NONE
    reasons: tuple[str, ...] = ()
    findings: tuple[GpuHealthFinding, ...] = ()


class NodeGpuVerdict(Frozen):
    """One node's verdict: its worst GPU, plus findings about the node itself (source down, unknown GPU)."""

    host: str
    status: GpuHealthStatus = GpuHealthStatus.HEALTHY
    action: GpuAction = GpuAction.NONE
    reasons: tuple[str, ...] = ()
    gpus: tuple[GpuVerdict, ...] = ()
    findings: tuple[GpuHealthFinding, ...] = ()
    """Node-level findings only (no GPU to pin them on); the GPUs' own are in ``gpus``."""
    source: str = ""


class DcgmScrapeNodeInput(Frozen):
    """Input of the ``dcgm_scrape_node`` activity: one node's dcgm-exporter, diffed against the previous scrape."""

    node: str
    url: str = ""
    """The exporter's metrics URL; empty: ``gpu.dcgm_url_template`` with ``{node}`` filled in."""
    previous: tuple[GpuSample, ...] = ()
    """The last result's ``next_previous`` (empty on the first scrape): XIDs and vanished GPUs are found by diffing."""


class DcgmScrapeNodeResult(Frozen):
    """The scrape as a report, its verdict, and the state to pass as ``previous`` next time."""

    report: GpuHealthReport
    verdict: NodeGpuVerdict
    next_previous: tuple[GpuSample, ...] = ()
    """This scrape's samples (the input's ``previous`` again when the exporter could not be read)."""


class NodeHealthCheckInput(Frozen):
    """Input of the node agent's ``node_health_check``: judge the node's GPUs now, ignoring events before ``since``
    (the fault that got the node drained is history; a health check asks whether it is fit again)."""

    since: datetime | None = None


class NodeHealthCheckResult(Frozen):
    node: str
    healthy: bool
    """No GPU failed (degraded counts as fit: it is watched, not held) and the GPUs could be read."""
    verdict: NodeGpuVerdict | None = None
    detail: str = ""
