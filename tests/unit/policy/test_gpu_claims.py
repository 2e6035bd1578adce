"""A signalled GPU event counts only as the node's agent lists it (issue 13's rule, kernel-log events included)."""

from __future__ import annotations

from workflows.domain.gpu import GpuEvent, GpuEventKind, GpuHealthReport
from workflows.domain.node_events import KernelSeverity, NodeEventKind
from workflows.policy.gpu_claims import confirm_gpu_events


def test_the_agents_copy_counts_not_the_signals() -> None:
    listed = GpuEvent(
        kind=GpuEventKind.SXID,
        host="n1",
        sxid=20009,
        sequence=7,
        node_event=NodeEventKind.SXID,
        severity=KernelSeverity.WATCH,
        source="kernel log",
    )
    forged = listed.model_copy(update={"severity": KernelSeverity.DRAIN})  # same key, graver severity
    stranger = GpuEvent(kind=GpuEventKind.XID, host="n1", index=0, xid=79, sequence=8)
    kept, notes = confirm_gpu_events([forged, stranger], {"n1": GpuHealthReport(host="n1", events=(listed,))})
    assert kept == (listed,)
    assert len(notes) == 1 and "does not list it" in notes[0]
