"""A late hardware fault on a suspected node: the node-level evidence its suspicion was waiting for. Pure.

A rank that died with no hardware evidence leaves only a suspicion of its node (``suspicion``): excluded from that
job's placement, not drained. When the node's agent later reports a GPU fault that NVIDIA's catalogue reads as the
node's (reset the GPU, or drain: ``NodeGpuFault.action``), the suspicion and the fault together are node-level
evidence. The Fleet turns them into a drain request naming both, keyed by the suspicion's incident (one escalation
per suspicion, whatever is re-sent); the request then goes through the normal drain rules (mode, ownership,
correlation, approvals, breaker) and restarts nothing.
"""

from __future__ import annotations

from datetime import datetime

from workflows.domain.fleet import FleetPolicy, FleetState, IsolationRequest, NodeGpuFault, NodeIncident
from workflows.domain.gpu import GpuAction, GpuEvent, GpuEventKind
from workflows.domain.incident import ActionRung, FailureClass
from workflows.domain.progress import aware
from workflows.policy.fleet.common import age_s, span

__all__ = ["HARDWARE_CONFIDENCE", "NODE_LEVEL_ACTIONS", "late_fault_escalation"]

#: Catalogue actions that put the fault on the node, not on the job that saw it (an application-class XID does not).
NODE_LEVEL_ACTIONS = frozenset({GpuAction.RESET_GPU, GpuAction.DRAIN_NODE})

#: The escalation's confidence: the catalogue itself puts the fault on the node, and the node was suspected already.
HARDWARE_CONFIDENCE = 0.95


def _fault_words(event: GpuEvent) -> str:
    """``xid-79``, ``ecc_dbe``, ``sxid-24007``, ``fs_readonly``...: the hardware half of the drain reason."""
    if event.kind is GpuEventKind.XID and event.xid is not None:
        return f"xid-{event.xid}"
    if event.kind is GpuEventKind.SXID and event.sxid is not None:
        return f"sxid-{event.sxid}"
    if event.kind is GpuEventKind.NODE and event.node_event is not None:
        return event.node_event.value
    return event.kind.value


def _suspicion_of(state: FleetState, node: str, at: datetime, window_s: float) -> NodeIncident | None:
    """The node's newest suspicion within ``window_s`` of ``at`` (closed window), or None."""
    record = state.nodes.get(node)
    if record is None:
        return None
    found = [i for i in record.incidents if i.suspicion and abs(age_s(at, i.at)) <= window_s]
    return max(found, key=lambda i: aware(i.at)) if found else None


def late_fault_escalation(
    state: FleetState, fault: NodeGpuFault, policy: FleetPolicy, now: datetime, fleet_id: str
) -> tuple[IsolationRequest, str] | None:
    """The drain request a node-level GPU fault makes of a suspicion of its node, and the reason naming both; None
    when the fault is not the node's (the job that saw it handles it) or the node holds no suspicion in the window.
    """
    if fault.action not in NODE_LEVEL_ACTIONS:
        return None
    at = fault.event.observed_at or now
    suspicion = _suspicion_of(state, fault.node, at, policy.suspicion_window_s)
    if suspicion is None:
        return None
    record = state.nodes[fault.node]
    reason = (
        f"{fault.node}: suspected since {suspicion.incident} ({suspicion.cause}, job {suspicion.job_id}: "
        f"{suspicion.evidence or 'only the job implicated it'}); within {span(policy.suspicion_window_s)} its node "
        f"agent reported {fault.finding} at {aware(at):%Y-%m-%d %H:%M:%S} UTC: hardware evidence: drain requested"
    )
    request = IsolationRequest(
        request_id=f"{fleet_id}/gpu-fault/{fault.node}/{suspicion.incident}",
        reply_to="",
        job_id=suspicion.job_id,
        partition=",".join(record.partitions),
        incident=suspicion.incident,
        cause=f"{suspicion.cause}+{_fault_words(fault.event)}",
        failure_class=FailureClass.HARDWARE.value,
        confidence=HARDWARE_CONFIDENCE,
        nodes=(fault.node,),
        requested_at=now,
        rung=ActionRung.DRAIN,
        evidence=fault.finding,
        restart=False,
        user=suspicion.user,
    )
    return request, reason
