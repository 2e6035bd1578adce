"""Kernel-log node events: what a severity read from the line means for the node. Pure.

The node agent's kernel-log reader (``activities/kernel``) gives each event a ``KernelSeverity`` from the line
itself (an SXid's also from NVIDIA's table). Here that becomes a health status and an action, on the same scale as
the XID catalogue's (``gpu_event_rules``), so one verdict covers NVML, DCGM and the kernel log:

| severity    | status   | action      | meaning                                                      |
|-------------|----------|-------------|--------------------------------------------------------------|
| info        | healthy  | none        | evidence only (a corrected AER, an MCE logged, an overrun)   |
| watch       | degraded | watch       | a symptom (hung task, soft lockup, NFS/Lustre server, link)  |
| restart_job | degraded | restart_job | the jobs using it failed (uncorrected non-fatal AER, SXid 12028) |
| reset       | failed   | reset_gpu   | node-level: drain, reset the GPU/NVSwitch fabric, return     |
| drain       | failed   | drain_node  | node-level: drain and keep out (fatal AER, MCE, RO fs, fatal SXid) |

Only the last two are node-level evidence (a drain for everyone: ``NODE_LEVEL_ACTIONS``); info and watch events
are recorded and never start an incident (``is_actionable``). An XID or a lost GPU from the kernel log is judged as
NVML's (the XID catalogue).
"""

from __future__ import annotations

from workflows.domain.gpu import GpuAction, GpuEvent, GpuEventKind, GpuHealthStatus
from workflows.domain.node_events import KernelSeverity, NodeEventKind

__all__ = ["is_actionable", "kernel_verdict"]

_VERDICTS: dict[KernelSeverity, tuple[GpuHealthStatus, GpuAction]] = {
    KernelSeverity.INFO: (GpuHealthStatus.HEALTHY, GpuAction.NONE),
    KernelSeverity.WATCH: (GpuHealthStatus.DEGRADED, GpuAction.WATCH),
    KernelSeverity.RESTART_JOB: (GpuHealthStatus.DEGRADED, GpuAction.RESTART_JOB),
    KernelSeverity.RESET: (GpuHealthStatus.FAILED, GpuAction.RESET_GPU),
    KernelSeverity.DRAIN: (GpuHealthStatus.FAILED, GpuAction.DRAIN_NODE),
}

_WHAT = {
    NodeEventKind.SXID: "NVSwitch SXid",
    NodeEventKind.FABRIC_MANAGER: "fabric manager failure",
    NodeEventKind.IB_PORT: "InfiniBand/mlx5 error",
    NodeEventKind.PCIE_AER: "PCIe AER error",
    NodeEventKind.MCE: "machine check",
    NodeEventKind.HUNG_TASK: "hung task",
    NodeEventKind.SOFT_LOCKUP: "soft lockup",
    NodeEventKind.FS_READONLY: "file system remounted read-only",
    NodeEventKind.NFS_NOT_RESPONDING: "NFS server not responding",
    NodeEventKind.LUSTRE_CONNECTION_LOST: "Lustre connection lost",
    NodeEventKind.KMSG_OVERRUN: "kernel log overrun",
}


def kernel_verdict(event: GpuEvent) -> tuple[GpuHealthStatus, GpuAction, str]:
    """Status, action and a sentence for a kernel-log ``SXID`` or ``NODE`` event (its severity; WATCH when the
    event carries none, e.g. from an agent older than the field)."""
    severity = event.severity or KernelSeverity.WATCH
    status, action = _VERDICTS[severity]
    what = _WHAT.get(event.node_event, "kernel log event") if event.node_event else "kernel log event"
    if event.kind is GpuEventKind.SXID and event.sxid is not None:
        what = f"{what} {event.sxid}"
    where = f" on {event.device}" if event.device else ""
    line = f": {event.detail}" if event.detail else ""
    return status, action, f"{what}{where} ({severity.value}){line}"


def is_actionable(event: GpuEvent) -> bool:
    """Whether the event may start or support an incident: every NVML/DCGM event, and a kernel-log SXID/NODE
    event whose severity asks for more than watching. Info and watch events stay evidence only."""
    if event.kind not in (GpuEventKind.SXID, GpuEventKind.NODE):
        return True
    _, action, _ = kernel_verdict(event)
    return action not in (GpuAction.NONE, GpuAction.WATCH)
