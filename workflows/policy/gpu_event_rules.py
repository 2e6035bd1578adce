"""GPU health rules over events: what an XID means by NVIDIA's catalogue, double-bit ECC, lost and missing GPUs,
and an application-class XID that keeps repeating on one GPU. Pure; the catalogue comes in as data.
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
from workflows.policy.gpu_thresholds import GpuHealthThresholds, gpu_finding

__all__ = ["event_findings", "repeat_findings", "xid_verdict"]

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
        status, action, text = xid_verdict(event.xid, catalog)
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
