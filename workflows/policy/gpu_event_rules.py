"""GPU health rules over events: what an XID means by NVIDIA's catalogue, double-bit ECC, lost and missing GPUs,
and an application-class XID that keeps repeating on one GPU. Pure; the catalogue comes in as data.

Where the source read the driver's line (job logs, the kernel log), what the line says outranks the catalogue's
fixed row for the number: a ``Nonfatal`` label (NVLink5 XIDs 144-150 print one per error; NVIDIA's decode table
says non-fatal ones need no action) makes the XID informational, a ``Fatal`` one at least a GPU reset; XID 154's
new recovery action decides XID 154 (``workflows.policy.gpu_recovery``), so 154 back to None is no fault.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from workflows.domain.gpu import (
    GpuAction,
    GpuEvent,
    GpuEventKind,
    GpuHealthFinding,
    GpuHealthStatus,
    XidCatalog,
    XidCatalogEntry,
)
from workflows.policy.gpu_recovery import recovery_verdict
from workflows.policy.gpu_thresholds import GpuHealthThresholds, gpu_finding
from workflows.policy.node_events import is_actionable, kernel_verdict

__all__ = ["event_findings", "is_gpu_fault", "repeat_findings", "xid_event_verdict", "xid_verdict"]

_H, _D, _F = GpuHealthStatus.HEALTHY, GpuHealthStatus.DEGRADED, GpuHealthStatus.FAILED

#: NVIDIA's immediate action ("resolution bucket") -> what Rebound does. NVSentinel's spellings are included
#: because the catalogue falls back to them where NVIDIA gives no action.
_XID_BUCKETS: dict[str, tuple[GpuHealthStatus, GpuAction]] = {
    "IGNORE": (_H, GpuAction.NONE),
    "RESTART_APP": (_D, GpuAction.RESTART_JOB),
    "WORKFLOW_XID_45": (_D, GpuAction.RESTART_JOB),
    "CHECK_UVM": (_D, GpuAction.WATCH),
    "RESET_GPU": (_F, GpuAction.RESET_GPU),
    "RESET_FABRIC": (_F, GpuAction.RESET_GPU),
    "WORKFLOW_XID_48": (_F, GpuAction.RESET_GPU),
    "WORKFLOW_NVLINK_ERR": (_F, GpuAction.RESET_GPU),
    "WORKFLOW_NVLINK5_ERR": (_F, GpuAction.RESET_GPU),
    "RESTART_BM": (_F, GpuAction.DRAIN_NODE),
    "RESTART_VM": (_F, GpuAction.DRAIN_NODE),
    "CONTACT_SUPPORT": (_F, GpuAction.DRAIN_NODE),
    "UNEXPECTED_ERR_REPORT_ISSUE": (_F, GpuAction.DRAIN_NODE),
    "CHECK_MECHANICALS": (_F, GpuAction.DRAIN_NODE),
    "UPDATE_SWFW": (_F, GpuAction.DRAIN_NODE),
    # "The driver changed the recovery action": the new action (reset, reboot) is in the message, not the number.
    "XID_154": (_F, GpuAction.DRAIN_NODE),
}


def xid_verdict(xid: int, catalog: XidCatalog) -> tuple[GpuHealthStatus, GpuAction, str]:
    """What one XID means on its own: status, action and a sentence quoting the catalogue."""
    entry = catalog.get(xid)
    if entry is None:
        return _D, GpuAction.WATCH, f"XID {xid} is not in the XID catalogue ({catalog.version or 'empty'}): watch"
    bucket = _bucket(entry)
    what = f"XID {xid} ({entry.mnemonic}: {entry.meaning})"
    if bucket is None:
        return _D, GpuAction.WATCH, f"{what}: the catalogue gives no action: watch"
    status, action = _XID_BUCKETS[bucket]
    advice = f"; {entry.recommended_action}" if entry.recommended_action else ""
    return status, action, f"{what}: catalogue action {bucket}{advice}"


def xid_event_verdict(event: GpuEvent, catalog: XidCatalog) -> tuple[GpuHealthStatus, GpuAction, str]:
    """What one XID event means: the catalogue's verdict for its number, overruled by what the driver's line said
    (its Fatal/Nonfatal label, XID 154's new recovery action) where the source read one."""
    xid = event.xid if event.xid is not None else -1
    status, action, text = xid_verdict(xid, catalog)
    if xid == 154 and event.recovery_action is not None:
        r_status, r_action, r_text = recovery_verdict(event.recovery_action)
        return r_status, r_action, f"XID 154 (GPU recovery action changed) to {event.recovery_action.value}: {r_text}"
    if event.fatal is False:
        return _H, GpuAction.NONE, f"{text}; the driver labels this one Nonfatal: no action"
    if event.fatal is True and action.rank < GpuAction.RESET_GPU.rank:
        return _F, GpuAction.RESET_GPU, f"{text}; the driver labels this one Fatal: reset the GPU"
    return status, action, text


def is_gpu_fault(event: GpuEvent, catalog: XidCatalog) -> bool:
    """Whether the event is a fault at all: False for one whose every finding asks for no action (an informational
    XID, a Nonfatal NVLink error, XID 154 back to None, a source going down). Such an event stays evidence but must
    interrupt no job and rate no failure as hardware."""
    if event.kind is GpuEventKind.SOURCE_DOWN or not is_actionable(event):
        return False  # a kernel-log event that asks only to be watched (a hung task, an NFS server) is no fault
    findings = event_findings(event, catalog, pinned=event.index is not None)
    return any(f.action is not GpuAction.NONE for f in findings)


def _bucket(entry: XidCatalogEntry) -> str | None:
    for candidate in (entry.action, entry.nvsentinel_action):
        if candidate in _XID_BUCKETS:
            return candidate
    return None


def event_findings(event: GpuEvent, catalog: XidCatalog, *, pinned: bool) -> list[GpuHealthFinding]:
    """What one event says; ``pinned`` False when the event names no GPU (the reason says so)."""
    where = "" if pinned else " (GPU unknown)"
    via = f" ({event.source})" if event.source else ""
    if event.kind is GpuEventKind.XID:
        if event.xid is None:
            return [gpu_finding("xid", _D, GpuAction.WATCH, f"an XID event without a code{via}{where}", event=event)]
        status, action, text = xid_event_verdict(event, catalog)
        return [gpu_finding("xid", status, action, f"{text}{where}", xid=event.xid, event=event)]
    if event.kind is GpuEventKind.ECC_DBE:
        return [
            gpu_finding(
                "ecc_dbe_event",
                _F,
                GpuAction.RESET_GPU,
                f"double-bit ECC error event{via}{where}: reset the GPU",
                event=event,
            )
        ]
    if event.kind is GpuEventKind.GPU_LOST:
        return [gpu_finding("gpu_lost", _F, GpuAction.DRAIN_NODE, f"GPU lost event{via}{where}", event=event)]
    if event.kind is GpuEventKind.GPU_MISSING:
        return [
            gpu_finding("gpu_missing", _F, GpuAction.DRAIN_NODE, f"GPU gone from the source{via}{where}", event=event)
        ]
    if event.kind in (GpuEventKind.SXID, GpuEventKind.NODE):
        status, action, text = kernel_verdict(event)
        if action is GpuAction.NONE:
            return []  # informational (a corrected error, an overrun): the event stays in the report as evidence
        rule = "sxid" if event.kind is GpuEventKind.SXID else f"kernel_{event.node_event or 'node'}"
        return [gpu_finding(rule, status, action, f"{text}{via}", event=event)]
    return []


def repeat_findings(events: Sequence[GpuEvent], catalog: XidCatalog, t: GpuHealthThresholds) -> list[GpuHealthFinding]:
    """``xid_repeated``: an application-class XID seen ``xid_repeats_drain`` times in one GPU's events."""
    counts = Counter(e.xid for e in events if e.kind is GpuEventKind.XID and e.xid is not None)
    out: list[GpuHealthFinding] = []
    for xid, count in sorted(counts.items()):
        status, action, _ = xid_verdict(xid, catalog)
        if action is GpuAction.RESTART_JOB and count >= t.xid_repeats_drain:
            out.append(
                gpu_finding(
                    "xid_repeated",
                    _F,
                    GpuAction.DRAIN_NODE,
                    f"XID {xid} {count} times on this GPU (limit {t.xid_repeats_drain}): an application-class XID that "
                    "keeps coming back is the GPU's; drain and investigate",
                    xid=xid,
                    value=count,
                )
            )
    return out
