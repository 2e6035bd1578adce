"""One verdict per GPU from several sources' readings (the node agent's NVML read, the node's DCGM exporter). Pure.

- GPUs are matched by UUID where both readings carry one, else by index.
- Every finding keeps the source whose reading fired it (``GpuHealthFinding.source``); its reason is prefixed
  with the source, so an operator reading the verdict knows whose word it is.
- The stronger evidence wins: a GPU's status and action are the worst of all its findings, whichever source.
- Disagreements are named, never resolved by voting: a GPU one source fails or watches while the other reads it
  healthy gets a ``sources_disagree`` finding (healthy: it changes nothing, it says who said what), and so does a
  GPU one source lists and the other, read fine, does not.
- A source that could not be read (its ``source_down`` finding) is its own finding, never a healthy reading:
  ``unreadable_sources`` names it, and a health check fails on it (``health_check_outcome``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from workflows.domain.gpu import GpuAction, GpuHealthFinding, GpuHealthStatus, GpuVerdict, NodeGpuVerdict
from workflows.domain.gpu_sources import DcgmReadResult

__all__ = [
    "dcgm_evidence",
    "failed_gpus",
    "health_check_outcome",
    "health_check_with_dcgm",
    "merge_node_verdicts",
    "unreadable_sources",
]

_RANK = {GpuHealthStatus.HEALTHY: 0, GpuHealthStatus.DEGRADED: 1, GpuHealthStatus.FAILED: 2}
SOURCE_DOWN = "source_down"
DISAGREE = "sources_disagree"


class _Gpu:
    def __init__(self, v: GpuVerdict) -> None:
        self.index, self.uuid, self.pci_bus_id = v.index, v.uuid, v.pci_bus_id
        self.by_source: dict[str, GpuVerdict] = {}

    def matches(self, v: GpuVerdict) -> bool:
        if self.uuid and v.uuid:
            return self.uuid == v.uuid
        return self.index is not None and self.index == v.index


def merge_node_verdicts(host: str, verdicts: Sequence[NodeGpuVerdict]) -> NodeGpuVerdict:
    """One node's verdict from each source's verdict of it (each with its ``source`` set; order is kept).

    Returns:
        The merged verdict: ``source`` names the sources (``nvml+dcgm``), every GPU once with the findings of all
        sources (each naming its source), node-level findings of all sources, the worst status and action.
    """
    sources = [v.source or f"source{i}" for i, v in enumerate(verdicts)]
    readable = {s for s, v in zip(sources, verdicts, strict=True) if not _down(v)}
    gpus: list[_Gpu] = []
    for source, verdict in zip(sources, verdicts, strict=True):
        for gv in verdict.gpus:
            gpu = next((g for g in gpus if g.matches(gv)), None)
            if gpu is None:
                gpu = _Gpu(gv)
                gpus.append(gpu)
            gpu.uuid = gpu.uuid or gv.uuid
            gpu.index = gpu.index if gpu.index is not None else gv.index
            gpu.pci_bus_id = gpu.pci_bus_id or gv.pci_bus_id
            gpu.by_source.setdefault(source, gv)
    merged = [_merge_gpu(host, g, sources, readable) for g in gpus]
    merged.sort(key=lambda v: (v.index is None, v.index or 0, v.uuid))
    node_findings = [
        _tagged(f, source) for source, verdict in zip(sources, verdicts, strict=True) for f in verdict.findings
    ]
    status, action = _worst([*node_findings, *(f for v in merged for f in v.findings)])
    reasons = [f.reason for f in node_findings]
    reasons += [f"{_name(v)}: {r}" for v in merged for r in v.reasons]
    return NodeGpuVerdict(
        host=host,
        status=status,
        action=action,
        reasons=tuple(reasons),
        gpus=tuple(merged),
        findings=tuple(node_findings),
        source="+".join(dict.fromkeys(sources)),
    )


def unreadable_sources(verdict: NodeGpuVerdict) -> tuple[GpuHealthFinding, ...]:
    """The node-level findings that say a source gave no data (its lookup failed)."""
    return tuple(f for f in verdict.findings if f.rule == SOURCE_DOWN)


def failed_gpus(verdict: NodeGpuVerdict) -> tuple[GpuVerdict, ...]:
    """The GPUs the verdict fails (status FAILED), in index order."""
    return tuple(g for g in verdict.gpus if g.status is GpuHealthStatus.FAILED)


def health_check_outcome(verdict: NodeGpuVerdict) -> tuple[bool, str]:
    """Whether a drained node is fit again by its GPUs: no GPU failed and every source could be read.

    Returns:
        ``(healthy, detail)``; the detail names the failing GPUs' reasons (with their sources) and the sources
        that could not be read, else a count of GPUs per status.
    """
    problems = [f.reason for f in unreadable_sources(verdict)]
    problems += [f"{_name(g)}: {f.reason}" for g in failed_gpus(verdict) for f in g.findings if _bad(f)]
    if problems:
        return False, "; ".join(problems[:4])
    if verdict.status is GpuHealthStatus.DEGRADED:
        watched = [f"{_name(g)}: {r}" for g in verdict.gpus for r in g.reasons if g.status is not _HEALTHY]
        return True, f"{len(verdict.gpus)} GPU(s) fit, watched ({verdict.source}): " + "; ".join(watched[:3])
    return True, f"{len(verdict.gpus)} GPU(s) healthy ({verdict.source})"


def dcgm_evidence(nodes: Sequence[str], read: DcgmReadResult | None) -> tuple[tuple[NodeGpuVerdict, ...], list[str]]:
    """Attribution's view of a ``dcgm_read_gpus`` result: the verdicts of the nodes with an exporter (merged with
    NVML where the read had it, else DCGM's alone) and a timeline line per such node (or why nothing was read)."""
    if read is None:
        return (), ["DCGM exporters not read: the read failed (no DCGM evidence; not taken as healthy)"]
    verdicts: list[NodeGpuVerdict] = []
    notes: list[str] = []
    for node in nodes:
        got = read.get(node)
        if got is None or not got.configured:
            continue
        if got.verdict is None:
            continue
        # Without the agent's NVML read (it did not answer) DCGM's verdict stands alone, its findings still named.
        verdict = got.merged or merge_node_verdicts(node, (got.verdict,))
        verdicts.append(verdict)
        said = "; ".join(verdict.reasons[:3]) or f"{len(verdict.gpus)} GPU(s) healthy"
        notes.append(f"{node} {verdict.source}: {verdict.status.value}: {said}"[:400])
    return tuple(verdicts), notes


def health_check_with_dcgm(
    node: str, nvml: NodeGpuVerdict | None, nvml_outcome: tuple[bool, str], read: DcgmReadResult | None
) -> tuple[bool, str]:
    """A drained node's health check with its DCGM exporter read beside the agent's NVML check.

    Args:
        node: The node.
        nvml: The agent's NVML verdict (None: the agent gave none; ``nvml_outcome`` then says why it failed).
        nvml_outcome: The agent check's ``(healthy, detail)``.
        read: ``dcgm_read_gpus`` of the node; None when that read failed (then the node is not passed).

    Returns:
        ``(healthy, detail)``: the NVML outcome where the node has no exporter; else the merged verdict's
        (``health_check_outcome``), failing also when the NVML check failed.
    """
    if read is None:
        return False, f"{nvml_outcome[1]}; DCGM read failed: the node is not passed unread"
    got = read.get(node)
    if got is None or not got.configured or got.verdict is None:
        return nvml_outcome
    merged = merge_node_verdicts(node, (nvml, got.verdict) if nvml is not None else (got.verdict,))
    healthy, detail = health_check_outcome(merged)
    if not nvml_outcome[0]:
        return False, f"{nvml_outcome[1]}; {detail}" if not healthy else nvml_outcome[1]
    return healthy, detail


# ---------------------------------------------------------------------------------------------------- internals

_HEALTHY = GpuHealthStatus.HEALTHY


def _down(v: NodeGpuVerdict) -> bool:
    return any(f.rule == SOURCE_DOWN for f in v.findings)


def _bad(f: GpuHealthFinding) -> bool:
    return f.status is GpuHealthStatus.FAILED


def _tagged(f: GpuHealthFinding, source: str) -> GpuHealthFinding:
    src = f.source or source
    reason = f.reason if f.reason.startswith(f"{src}: ") else f"{src}: {f.reason}"
    return f.model_copy(update={"source": src, "reason": reason})


def _merge_gpu(host: str, gpu: _Gpu, sources: Sequence[str], readable: set[str]) -> GpuVerdict:
    findings = [_tagged(f, s) for s, v in gpu.by_source.items() for f in v.findings]
    said = {s: v.status for s, v in gpu.by_source.items()}
    notes: list[str] = []
    if len(set(said.values())) > 1:
        notes.append(
            ", ".join(f"{s} reads it {st.value}" for s, st in said.items()) + ": the stronger evidence is kept"
        )
    absent = [s for s in dict.fromkeys(sources) if s not in said and s in readable]
    if absent:
        notes.append(f"listed by {', '.join(said)}, not by {', '.join(absent)}")
    for note in notes:
        findings.append(
            GpuHealthFinding(
                rule=DISAGREE,
                status=_HEALTHY,
                action=GpuAction.NONE,
                reason=f"sources disagree: {note}",
                source="+".join(said),
            )
        )
    status, action = _worst(findings)
    return GpuVerdict(
        host=host,
        index=gpu.index,
        uuid=gpu.uuid,
        pci_bus_id=gpu.pci_bus_id,
        status=status,
        action=action,
        reasons=tuple(dict.fromkeys(f.reason for f in findings)),
        findings=tuple(findings),
    )


def _worst(findings: Iterable[GpuHealthFinding]) -> tuple[GpuHealthStatus, GpuAction]:
    status, action = _HEALTHY, GpuAction.NONE
    for f in findings:
        if _RANK[f.status] > _RANK[status]:
            status = f.status
        if f.action.rank > action.rank:
            action = f.action
    return status, action


def _name(v: GpuVerdict) -> str:
    return f"GPU {v.index}" if v.index is not None else f"GPU {v.uuid}"
