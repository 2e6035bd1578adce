"""GPU health verdict: from samples (now and before) and events to HEALTHY / DEGRADED / FAILED and an action. Pure.

Both sources feed it the same records: the node agent's NVML reads and the central DCGM-exporter scrapes. The
XID catalogue comes in as data (``activities.gpu.xid_catalog`` loads it), so this module reads no file and is
safe in the workflow sandbox.

Rules (each that fires is a ``GpuHealthFinding``; a GPU's verdict is its worst finding, a node's its worst GPU):

FAILED, the GPU must not run work:
- ``gpu_lost`` / ``gpu_missing``: fell off the bus (NVML ``GPU_IS_LOST``) or vanished from the exporter page ->
  drain node (the catalogue's action for XID 79 is a reboot of the host).
- ``ecc_dbe_volatile``: uncorrectable ECC errors since the last reset, ``ecc_dbe_aggregate_growth``: the lifetime
  count grew, ``ecc_dbe_event``: NVML's double-bit event -> reset GPU (the reset applies the row remap).
- ``row_remap_failure``: no spare rows left -> drain node (RMA). ``retired_pages_limit``: SBE + DBE retired pages
  reached DCGM's limit (63) -> drain node (RMA).
- ``xid`` whose catalogue action is a reset (``RESET_GPU``, ``WORKFLOW_XID_48``, NVLink workflows) -> reset GPU;
  a reboot, support case or hardware check (``RESTART_BM``, ``CONTACT_SUPPORT``, ``CHECK_MECHANICALS`` ...)
  -> drain node. ``xid_repeated``: an application-class XID repeated on one GPU -> drain node, as the catalogue
  says ("drain + investigate only if it repeats on the same GPU").

DEGRADED, keep running but watch (or restart the job):
- ``xid`` with catalogue action ``RESTART_APP`` (or ``WORKFLOW_XID_45``) -> restart job: the GPU is fine.
- ``thermal_throttle`` (SW/HW thermal slowdown bits), ``hw_slowdown`` (HW slowdown, power brake),
  ``temperature_high``, ``retired_pages_pending``, ``row_remap_pending``, growth of corrected ECC errors, of
  retired pages or of rows remapped for uncorrectable errors, PCIe replays above DCGM's 8 a minute, NVLink CRC
  errors above DCGM's 100 a second -> watch.
- An XID the catalogue lacks, or lists without an action -> watch: its companions (XID 48 before 171, a lost GPU
  after 167) carry the real action.
- ``source_down`` (node level): no GPU data at all -> watch.

HEALTHY with a finding: XIDs the catalogue says to ignore (informational; kept as evidence).

The sample rules live in ``workflows.policy.gpu_sample_rules``, the event and XID rules in
``workflows.policy.gpu_event_rules``, their numbers in ``workflows.policy.gpu_thresholds``; this module matches
samples and events to GPUs and folds the findings into verdicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from workflows.domain.gpu import (
    GpuAction,
    GpuEvent,
    GpuEventKind,
    GpuHealthFinding,
    GpuHealthReport,
    GpuHealthStatus,
    GpuSample,
    GpuVerdict,
    NodeGpuVerdict,
    XidCatalog,
)
from workflows.policy.gpu_dcgm_rules import dcgm_sample_findings
from workflows.policy.gpu_event_rules import event_findings, repeat_findings
from workflows.policy.gpu_sample_rules import sample_findings
from workflows.policy.gpu_thresholds import DEFAULT_THRESHOLDS, GpuHealthThresholds, gpu_finding
from workflows.policy.xid_copies import one_copy_per_fault

__all__ = ["gpu_health_verdict", "verdict_for_report"]

_H = GpuHealthStatus.HEALTHY
_STATUS_RANK = {GpuHealthStatus.HEALTHY: 0, GpuHealthStatus.DEGRADED: 1, GpuHealthStatus.FAILED: 2}


def verdict_for_report(
    report: GpuHealthReport,
    *,
    catalog: XidCatalog,
    previous: Sequence[GpuSample] = (),
    thresholds: GpuHealthThresholds = DEFAULT_THRESHOLDS,
    source: str = "",
) -> NodeGpuVerdict:
    """``gpu_health_verdict`` of one source's report (NVML's ``nvml_read_gpu_health`` or a DCGM scrape)."""
    return gpu_health_verdict(
        report.host,
        report.samples,
        previous=previous,
        events=report.events,
        catalog=catalog,
        thresholds=thresholds,
        source=source,
        source_error=report.error,
    )


def gpu_health_verdict(
    host: str,
    samples: Sequence[GpuSample],
    *,
    catalog: XidCatalog,
    previous: Sequence[GpuSample] = (),
    events: Sequence[GpuEvent] = (),
    thresholds: GpuHealthThresholds = DEFAULT_THRESHOLDS,
    source: str = "",
    source_error: str = "",
) -> NodeGpuVerdict:
    """One node's verdict from its current samples, the previous ones (for growth) and the events since then.

    Args:
        host: The node.
        samples: Every GPU's current sample.
        catalog: NVIDIA's XID catalogue, as data.
        previous: The samples of the read before (matched by UUID, else index); empty: no growth rules.
        events: XIDs, lost/missing GPUs and double-bit ECC events since the previous read.
        thresholds: The rules' numbers.
        source: Named in the verdict (``nvml``, ``dcgm``).
        source_error: Why the source gave no samples (a report's ``error``); makes a node-level finding.

    Returns:
        The node's verdict: its GPUs' verdicts (ordered by index), node-level findings, worst status and action.
    """
    gpus: dict[str, _GpuFacts] = {}
    for sample in samples:
        facts = gpus.setdefault(_key(sample.index, sample.uuid), _GpuFacts(sample.index, sample.uuid))
        facts.sample = sample
        facts.pci_bus_id = facts.pci_bus_id or sample.pci_bus_id
    before = _Previous(previous)
    node_findings: list[GpuHealthFinding] = []
    if source_error:
        node_findings.append(
            gpu_finding("source_down", GpuHealthStatus.DEGRADED, GpuAction.WATCH, f"no GPU data: {source_error}")
        )
    for event in one_copy_per_fault(events):  # NVML's event and the kernel's line of one XID judged once
        if event.kind is GpuEventKind.SOURCE_DOWN:
            if not source_error:
                node_findings.append(
                    gpu_finding(
                        "source_down",
                        GpuHealthStatus.DEGRADED,
                        GpuAction.WATCH,
                        f"{event.source or 'source'} down",
                        event=event,
                    )
                )
            continue
        if event.index is None and not event.uuid:
            node_findings.extend(event_findings(event, catalog, pinned=False))
            continue
        facts = _find(gpus, event.index, event.uuid) or gpus.setdefault(
            _key(event.index, event.uuid), _GpuFacts(event.index, event.uuid)
        )
        facts.pci_bus_id = facts.pci_bus_id or event.pci_bus_id
        facts.events.append(event)

    verdicts = []
    for facts in sorted(gpus.values(), key=lambda f: (f.index is None, f.index or 0, f.uuid)):
        findings: list[GpuHealthFinding] = []
        if facts.sample is not None:
            prev = before.match(facts.sample)
            findings += sample_findings(facts.sample, prev, thresholds)
            findings += dcgm_sample_findings(facts.sample, prev, thresholds)
        for event in facts.events:
            findings += event_findings(event, catalog, pinned=True)
        findings += repeat_findings(facts.events, catalog, thresholds)
        verdicts.append(_gpu_verdict(host, facts, findings))

    status, action = _worst([*node_findings, *(f for v in verdicts for f in v.findings)])
    reasons = [f.reason for f in node_findings]
    reasons += [f"{_gpu_name(v)}: {r}" for v in verdicts for r in v.reasons]
    return NodeGpuVerdict(
        host=host,
        status=status,
        action=action,
        reasons=tuple(reasons),
        gpus=tuple(verdicts),
        findings=tuple(node_findings),
        source=source,
    )


# ---------------------------------------------------------------------------------------------------- internals


class _GpuFacts:
    """Everything known about one GPU in this read."""

    def __init__(self, index: int | None, uuid: str) -> None:
        self.index = index
        self.uuid = uuid
        self.pci_bus_id = ""
        self.sample: GpuSample | None = None
        self.events: list[GpuEvent] = []


class _Previous:
    """The previous read's samples, found by UUID when both sides have one, else by index."""

    def __init__(self, samples: Iterable[GpuSample]) -> None:
        self._by_uuid = {s.uuid: s for s in samples if s.uuid}
        self._by_index = {s.index: s for s in samples}

    def match(self, sample: GpuSample) -> GpuSample | None:
        if sample.uuid and self._by_uuid:
            return self._by_uuid.get(sample.uuid)
        return self._by_index.get(sample.index)


def _key(index: int | None, uuid: str) -> str:
    return f"uuid:{uuid}" if uuid else f"index:{index}"


def _find(gpus: dict[str, _GpuFacts], index: int | None, uuid: str) -> _GpuFacts | None:
    """The GPU an event names: by UUID when both sides know it, else by index."""
    if uuid and (match := gpus.get(_key(index, uuid))) is not None:
        return match
    return next((f for f in gpus.values() if f.index == index and not (uuid and f.uuid)), None)


def _worst(findings: Iterable[GpuHealthFinding]) -> tuple[GpuHealthStatus, GpuAction]:
    status, action = _H, GpuAction.NONE
    for f in findings:
        if _STATUS_RANK[f.status] > _STATUS_RANK[status]:
            status = f.status
        if f.action.rank > action.rank:
            action = f.action
    return status, action


def _gpu_verdict(host: str, facts: _GpuFacts, findings: list[GpuHealthFinding]) -> GpuVerdict:
    status, action = _worst(findings)
    reasons = list(dict.fromkeys(f.reason for f in findings))  # one sentence once, in rule order
    return GpuVerdict(
        host=host,
        index=facts.index,
        uuid=facts.uuid,
        pci_bus_id=facts.pci_bus_id,
        status=status,
        action=action,
        reasons=tuple(reasons),
        findings=tuple(findings),
    )


def _gpu_name(v: GpuVerdict) -> str:
    return f"GPU {v.index}" if v.index is not None else f"GPU {v.uuid}"
