"""What a node's kernel log says, as typed records: the reader's records, its restart-safe position, and the
kinds and severities of the node events parsed from them (``activities/kernel``).

A kernel-log event travels as a ``GpuEvent`` (the node agent's one event stream, ADR 008/017): an XID line becomes
the same ``XID`` event NVML raises, "fallen off the bus" a ``GPU_LOST``, an NVSwitch SXid an ``SXID`` and anything
else a ``NODE`` event naming its ``NodeEventKind``. Policy maps a ``KernelSeverity`` to an action
(``workflows/policy/node_events.py``).
"""

from __future__ import annotations

from enum import StrEnum

from workflows.domain.base import Frozen

__all__ = ["KernelLogPosition", "KernelRecord", "KernelSeverity", "NodeEventKind", "SxidCatalog", "SxidEntry"]


class NodeEventKind(StrEnum):
    """What a kernel line reported."""

    XID = "xid"
    SXID = "sxid"
    GPU_FALLEN_OFF_BUS = "gpu_fallen_off_bus"
    FABRIC_MANAGER = "fabric_manager"
    IB_PORT = "ib_port"
    """An mlx5/InfiniBand port or adapter error (a benign notice, "Cable plugged", is not one)."""
    PCIE_AER = "pcie_aer"
    MCE = "mce"
    HUNG_TASK = "hung_task"
    SOFT_LOCKUP = "soft_lockup"
    FS_READONLY = "fs_readonly"
    NFS_NOT_RESPONDING = "nfs_not_responding"
    LUSTRE_CONNECTION_LOST = "lustre_connection_lost"
    KMSG_OVERRUN = "kmsg_overrun"
    """The reader fell behind and the kernel overwrote records it had not read (EPIPE, or a gap in sequence numbers):
    reported so that the silence is not read as health."""


class KernelSeverity(StrEnum):
    """How bad the line is, as read from the line itself (and, for an SXid, NVIDIA's catalogue). Mildest first."""

    INFO = "info"
    """Recorded as evidence, never acted on (a corrected error the hardware handled, a reader overrun)."""
    WATCH = "watch"
    """Worth watching: a node-local symptom that alone proves nothing (a hung task, a server slow to answer)."""
    RESTART_JOB = "restart_job"
    """The jobs using it failed; the node itself is fine."""
    RESET = "reset"
    """Node-level: drain, reset the GPU or the NVLink fabric, return the node."""
    DRAIN = "drain"
    """Node-level: drain and keep out (reboot, repair)."""


class KernelRecord(Frozen):
    """One kernel-log record: ``/dev/kmsg``'s ``pri,seq,ts_usec,flags;message`` (continuation lines dropped), or
    one line of a file-backed source (its line number as ``seq``)."""

    seq: int
    message: str
    priority: int = 6
    """syslog level (0 emerg ... 7 debug)."""
    facility: int = 0
    ts_usec: int | None = None
    """Microseconds since boot (``/dev/kmsg``); None for a file-backed source."""


class KernelLogPosition(Frozen):
    """Where a reader stopped, persisted in the agent's state directory so a restarted agent goes on from there.

    ``boot`` is ``/proc/sys/kernel/random/boot_id`` for ``/dev/kmsg`` (sequence numbers restart at each boot) and
    the file's identity (device, inode) for a file-backed source (a rewritten file starts over).
    """

    source: str
    boot: str
    seq: int
    """The last sequence number handled; the next record to handle is the first with a larger one."""


class SxidEntry(Frozen):
    """One row of the SXid (NVSwitch) table (``activities/kernel/sxid_catalog.tsv``)."""

    sxid: int
    name: str
    category: str
    """NVIDIA's section: ``non_fatal``, ``fatal`` (potentially fatal), ``always_fatal`` or ``notable``."""
    severity: KernelSeverity
    """What Rebound makes of the row when the line itself does not say otherwise."""
    recovery: str = ""
    source: str = ""


class SxidCatalog(Frozen):
    """The SXid table as data."""

    entries: tuple[SxidEntry, ...] = ()
    version: str = ""

    def get(self, sxid: int) -> SxidEntry | None:
        """The row for ``sxid``, or None for one the table does not list."""
        return next((e for e in self.entries if e.sxid == sxid), None)
