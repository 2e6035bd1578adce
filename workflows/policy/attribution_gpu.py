"""Attribution's rule 1, the GPU's own word: a GPU fault event (XID, lost GPU, double-bit ECC) on one of the job's
nodes, or a GPU that the merged NVML + DCGM verdict of a job node fails (``workflows.policy.gpu_merge``). Pure.

Events come first (they carry the fault's time and kind: the cause is ``xid-79``, ``gpu-lost``); a GPU failed only
by the merged verdict (a double-bit ECC count or a row remap failure on the DCGM exporter's page, which no event
announced) makes the cause its rule (``ecc-dbe-volatile``, ``row-remap-failure``). Every evidence item names its
source, and a GPU the sources disagree on says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from workflows.domain.gpu import GpuEvent, GpuEventKind, GpuHealthFinding, GpuHealthStatus, GpuVerdict
from workflows.domain.incident import Attribution, Evidence, EvidenceKind, EvidenceSource, FailureClass
from workflows.policy.attribution_facts import AttributionFacts
from workflows.policy.gpu_merge import DISAGREE, failed_gpus
from workflows.policy.node_events import is_actionable

__all__ = ["gpu_attribution", "gpu_faults"]

_MAX_EVIDENCE = 5


def gpu_faults(facts: AttributionFacts) -> list[GpuEvent]:
    """The GPU fault events on the job's nodes (a source going down is no fault of the GPU; a kernel-log event that
    only asks to be watched, a hung task or an NFS server slow to answer, is no fault either: docs/node-events.md)."""
    job_nodes = set(facts.job_nodes)
    return [
        e
        for e in facts.gpu_events
        if e.host in job_nodes and e.kind is not GpuEventKind.SOURCE_DOWN and is_actionable(e)
    ]


def _cause(event: GpuEvent) -> str:
    """``xid-79``, ``gpu-lost``; from the kernel log ``sxid-24007``, ``fs-readonly``, ``pcie-aer``..."""
    if event.kind is GpuEventKind.XID and event.xid:
        return f"xid-{event.xid}"
    if event.kind is GpuEventKind.SXID and event.sxid is not None:
        return f"sxid-{event.sxid}"
    if event.kind is GpuEventKind.NODE and event.node_event is not None:
        return event.node_event.value.replace("_", "-")
    return event.kind.value.replace("_", "-")


def _explain(event: GpuEvent) -> str:
    if event.index is None and event.kind in (GpuEventKind.SXID, GpuEventKind.NODE):
        where = f" ({event.device})" if event.device else ""
        return f"{_cause(event)} on {event.host}{where}, from its kernel log: {event.detail}"
    return f"{event.kind.value} on GPU {event.index} of {event.host}" + (f" (XID {event.xid})" if event.xid else "")


def _failed(facts: AttributionFacts) -> list[GpuVerdict]:
    job_nodes = set(facts.job_nodes)
    return [g for v in facts.gpu_verdicts if v.host in job_nodes for g in failed_gpus(v)]


def has_gpu_fault(facts: AttributionFacts) -> bool:
    """Whether rule 1 decides."""
    return bool(gpu_faults(facts) or _failed(facts))


def gpu_attribution(facts: AttributionFacts) -> Attribution | None:
    """Rule 1's attribution, or None when no GPU of the job's nodes reports a fault."""
    events, failed = gpu_faults(facts), _failed(facts)
    if events:
        return _from_events(events, failed)
    if failed:
        return _from_verdicts(failed)
    return None


def _from_events(events: list[GpuEvent], failed: Sequence[GpuVerdict]) -> Attribution:
    first = events[0]
    cause = _cause(first)
    gpus = [f"{e.host}:{e.index}" for e in events if e.index is not None] + [_gpu_id(g) for g in failed]
    evidence = [
        Evidence(
            source=EvidenceSource.GPU,
            text=(f"[{e.source}] " if e.source else "")
            + f"{e.kind.value} gpu={e.index} uuid={e.uuid} xid={e.xid}"
            + (f" sxid={e.sxid}" if e.sxid is not None else "")
            + (f": {e.detail}" if e.detail else ""),
            node=e.host,
            at=e.observed_at,
        )
        for e in events[:_MAX_EVIDENCE]
    ]
    return Attribution(
        failure_class=FailureClass.HARDWARE,
        cause=cause,
        retryable=True,
        confidence=0.95,
        implicated_nodes=tuple(dict.fromkeys([*(e.host for e in events), *(g.host for g in failed)])),
        implicated_gpus=tuple(dict.fromkeys(gpus)),
        explanation=_explain(first),
        evidence=tuple(evidence + _verdict_evidence(failed))[: _MAX_EVIDENCE + 3],
        basis=EvidenceKind.GPU_AGENT,
    )


def _from_verdicts(failed: Sequence[GpuVerdict]) -> Attribution:
    first = failed[0]
    deciding = next(f for f in first.findings if f.status is GpuHealthStatus.FAILED)
    disagree = [f.reason for f in first.findings if f.rule == DISAGREE]
    dcgm = any(f.source == "dcgm" for g in failed for f in _bad(g))
    return Attribution(
        failure_class=FailureClass.HARDWARE,
        cause=deciding.rule.replace("_", "-"),
        retryable=True,
        confidence=0.9,
        implicated_nodes=tuple(dict.fromkeys(g.host for g in failed)),
        implicated_gpus=tuple(dict.fromkeys(_gpu_id(g) for g in failed)),
        explanation=f"GPU {first.index} of {first.host} failed: {deciding.reason}"
        + (f" ({disagree[0]})" if disagree else ""),
        evidence=tuple(_verdict_evidence(failed)),
        basis=EvidenceKind.GPU_DCGM if dcgm else EvidenceKind.GPU_AGENT,
    )


def _bad(g: GpuVerdict) -> list[GpuHealthFinding]:
    return [f for f in g.findings if f.status is GpuHealthStatus.FAILED]


def _verdict_evidence(failed: Sequence[GpuVerdict]) -> list[Evidence]:
    out = []
    for g in failed:
        for f in [*_bad(g), *(f for f in g.findings if f.rule == DISAGREE)]:
            text = f.reason if f.reason.startswith(f"{f.source}: ") else f"{f.source}: {f.reason}"
            out.append(Evidence(source=EvidenceSource.GPU, text=f"GPU {g.index} {f.rule}: {text}", node=g.host))
    return out[:_MAX_EVIDENCE]


def _gpu_id(g: GpuVerdict) -> str:
    return f"{g.host}:{g.index}" if g.index is not None else f"{g.host}:{g.uuid}"
