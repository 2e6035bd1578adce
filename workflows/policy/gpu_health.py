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

Counters that go down were reset (reboot, driver reload): that is not growth. Rates use the samples' times;
without them the interval is taken as ``assumed_interval_s``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime

from pydantic import Field

from workflows.domain.base import Frozen
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
    XidCatalogEntry,
)

__all__ = [
    "CLOCKS_EVENT_REASONS",
    "DEFAULT_THRESHOLDS",
    "GpuHealthThresholds",
    "decode_clocks_event_reasons",
    "gpu_health_verdict",
    "verdict_for_report",
    "xid_verdict",
]

_H, _D, _F = GpuHealthStatus.HEALTHY, GpuHealthStatus.DEGRADED, GpuHealthStatus.FAILED
_STATUS_RANK = {_H: 0, _D: 1, _F: 2}

#: NVML's clocks-event ("throttle") reason bits (nvml.h ``nvmlClocksEventReason*``); DCGM exports the same mask.
CLOCKS_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)
_THERMAL_BITS = 0x20 | 0x40
_HW_SLOWDOWN_BITS = 0x8 | 0x80

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


class GpuHealthThresholds(Frozen):
    """The numbers behind the rules; defaults are DCGM's own limits where DCGM has one."""

    temperature_watch_c: int = Field(85, gt=0)
    """Watch a GPU at or above this temperature (the default exporter page has no throttle reasons)."""
    pcie_replays_per_min: float = Field(8.0, ge=0)
    """DCGM_LIMIT_MAX_PCIREPLAY_RATE: "8 replays per minute is the maximum recommended by RM"."""
    nvlink_crc_per_s: float = Field(100.0, ge=0)
    """DCGM: "CRC errors only matter at rates of 100+ per second"."""
    retired_pages_drain: int = Field(63, gt=0)
    """DCGM_LIMIT_MAX_RETIRED_PAGES: SBE plus DBE retired pages at which the GPU is due for RMA."""
    xid_repeats_drain: int = Field(3, ge=2)
    """An application-class XID seen this often on one GPU (within the events given) drains the node."""
    assumed_interval_s: float = Field(60.0, gt=0)
    """Seconds between two samples that carry no ``observed_at``."""


DEFAULT_THRESHOLDS = GpuHealthThresholds()


def decode_clocks_event_reasons(mask: int) -> tuple[str, ...]:
    """Names of the set bits of a clocks-event (throttle) mask; unknown bits as ``bit_0x...``."""
    names = [name for bit, name in CLOCKS_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCKS_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    names += [f"bit_{1 << i:#x}" for i in range(rest.bit_length()) if rest & (1 << i)]
    return tuple(names)


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
        node_findings.append(_finding("source_down", _D, GpuAction.WATCH, f"no GPU data: {source_error}"))
    for event in events:
        if event.kind is GpuEventKind.SOURCE_DOWN:
            if not source_error:
                node_findings.append(
                    _finding("source_down", _D, GpuAction.WATCH, f"{event.source or 'source'} down", event=event)
                )
            continue
        if event.index is None and not event.uuid:
            node_findings.extend(_event_findings(event, catalog, pinned=False))
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
            findings += _sample_findings(facts.sample, before.match(facts.sample), thresholds)
        for event in facts.events:
            findings += _event_findings(event, catalog, pinned=True)
        findings += _repeat_findings(facts.events, catalog, thresholds)
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


def _finding(
    rule: str,
    status: GpuHealthStatus,
    action: GpuAction,
    reason: str,
    *,
    field: str = "",
    value: object = "",
    previous: object = "",
    xid: int | None = None,
    event: GpuEvent | None = None,
) -> GpuHealthFinding:
    return GpuHealthFinding(
        rule=rule,
        status=status,
        action=action,
        reason=reason,
        field=field,
        value=str(value),
        previous=str(previous),
        xid=xid,
        event=event,
    )


def _sample_findings(s: GpuSample, prev: GpuSample | None, t: GpuHealthThresholds) -> list[GpuHealthFinding]:
    out: list[GpuHealthFinding] = []
    if s.lost:
        out.append(
            _finding(
                "gpu_lost",
                _F,
                GpuAction.DRAIN_NODE,
                "lost=True: the GPU no longer answers (fell off the bus); drain, reboot the host, RMA if it recurs",
                field="lost",
                value=True,
            )
        )
    if s.missing:
        out.append(
            _finding(
                "gpu_missing",
                _F,
                GpuAction.DRAIN_NODE,
                "missing=True: the GPU was listed by the source before and is gone now; drain and check the host",
                field="missing",
                value=True,
            )
        )
    if s.ecc_uncorrected_volatile:
        out.append(
            _finding(
                "ecc_dbe_volatile",
                _F,
                GpuAction.RESET_GPU,
                f"ecc_uncorrected_volatile={s.ecc_uncorrected_volatile}: uncorrectable (double-bit) ECC errors since "
                "the last reset; reset the GPU to remap the rows",
                field="ecc_uncorrected_volatile",
                value=s.ecc_uncorrected_volatile,
            )
        )
    dbe_growth = _growth(s.ecc_uncorrected_aggregate, prev.ecc_uncorrected_aggregate if prev else None)
    if dbe_growth and not s.ecc_uncorrected_volatile:
        out.append(
            _finding(
                "ecc_dbe_aggregate_growth",
                _F,
                GpuAction.RESET_GPU,
                f"ecc_uncorrected_aggregate grew {prev.ecc_uncorrected_aggregate if prev else 0} -> "
                f"{s.ecc_uncorrected_aggregate}: a new uncorrectable ECC error; reset the GPU",
                field="ecc_uncorrected_aggregate",
                value=s.ecc_uncorrected_aggregate,
                previous=prev.ecc_uncorrected_aggregate if prev else "",
            )
        )
    if s.remap_failure:
        out.append(
            _finding(
                "row_remap_failure",
                _F,
                GpuAction.DRAIN_NODE,
                "remap_failure=True: the GPU ran out of spare rows to remap; drain and RMA",
                field="remap_failure",
                value=True,
            )
        )
    retired = (s.retired_pages_sbe or 0) + (s.retired_pages_dbe or 0)
    if retired >= t.retired_pages_drain:
        out.append(
            _finding(
                "retired_pages_limit",
                _F,
                GpuAction.DRAIN_NODE,
                f"retired_pages_sbe+retired_pages_dbe={retired} reached the limit {t.retired_pages_drain}: "
                "drain and RMA",
                field="retired_pages_sbe+retired_pages_dbe",
                value=retired,
            )
        )
    if s.retired_pages_pending:
        out.append(
            _watch(
                "retired_pages_pending",
                "retired_pages_pending=True: pages wait for retirement; reset the GPU when it is idle",
                "retired_pages_pending",
                True,
            )
        )
    if s.remap_pending:
        out.append(
            _watch(
                "row_remap_pending",
                "remap_pending=True: a row remap waits for the next GPU reset",
                "remap_pending",
                True,
            )
        )
    out += _throttle_findings(s, t)
    if prev is not None:
        out += _growth_findings(s, prev, t)
    return out


def _watch(rule: str, reason: str, field: str, value: object, previous: object = "") -> GpuHealthFinding:
    return _finding(rule, _D, GpuAction.WATCH, reason, field=field, value=value, previous=previous)


def _throttle_findings(s: GpuSample, t: GpuHealthThresholds) -> list[GpuHealthFinding]:
    out: list[GpuHealthFinding] = []
    mask = s.clocks_event_reasons or 0
    clocks = ""
    if s.sm_clock_mhz is not None and s.sm_clock_max_mhz:
        clocks = f", SM clock {s.sm_clock_mhz}/{s.sm_clock_max_mhz} MHz"
    elif s.sm_clock_mhz is not None:
        clocks = f", SM clock {s.sm_clock_mhz} MHz"
    temp = f", {s.temperature_c} C" if s.temperature_c is not None else ""
    for rule, bits, what in (
        ("thermal_throttle", _THERMAL_BITS, "thermal slowdown"),
        ("hw_slowdown", _HW_SLOWDOWN_BITS, "hardware slowdown (power brake or HW slowdown)"),
    ):
        if mask & bits:
            names = "+".join(decode_clocks_event_reasons(mask & bits))
            out.append(
                _watch(
                    rule,
                    f"clocks_event_reasons={mask:#x} ({names}): {what}{temp}{clocks}",
                    "clocks_event_reasons",
                    f"{mask:#x}",
                )
            )
    if s.temperature_c is not None and s.temperature_c >= t.temperature_watch_c:
        out.append(
            _watch(
                "temperature_high",
                f"temperature_c={s.temperature_c} is at or above {t.temperature_watch_c}{clocks}",
                "temperature_c",
                s.temperature_c,
            )
        )
    return out


def _growth(now: int | None, before: int | None) -> int:
    """How much a counter grew; 0 when unknown or when it went down (a reset, not growth)."""
    if now is None or before is None or now <= before:
        return 0
    return now - before


def _interval_s(s: GpuSample, prev: GpuSample, t: GpuHealthThresholds) -> float:
    if s.observed_at is not None and prev.observed_at is not None:
        seconds = _seconds(s.observed_at, prev.observed_at)
        if seconds > 0:
            return seconds
    return t.assumed_interval_s


def _seconds(now: datetime, before: datetime) -> float:
    try:
        return (now - before).total_seconds()
    except TypeError:  # one naive, one aware: no usable interval
        return 0.0


def _growth_findings(s: GpuSample, prev: GpuSample, t: GpuHealthThresholds) -> list[GpuHealthFinding]:
    out: list[GpuHealthFinding] = []
    for field, rule, what in (
        ("ecc_corrected_volatile", "ecc_sbe_growth", "corrected (single-bit) ECC errors"),
        ("retired_pages_sbe", "retired_pages_growth", "pages retired for single-bit errors"),
        ("retired_pages_dbe", "retired_pages_growth", "pages retired for double-bit errors"),
        ("remapped_rows_uncorrectable", "row_remap_uncorrectable_growth", "rows remapped for uncorrectable errors"),
    ):
        now, before = getattr(s, field), getattr(prev, field)
        if _growth(now, before):
            out.append(_watch(rule, f"{field} grew {before} -> {now}: more {what}", field, now, before))
    if not _growth(s.ecc_corrected_volatile, prev.ecc_corrected_volatile):
        # Volatile counters restart at a reset; the aggregate one still shows growth across it.
        now, before = s.ecc_corrected_aggregate, prev.ecc_corrected_aggregate
        if _growth(now, before):
            out.append(
                _watch(
                    "ecc_sbe_growth",
                    f"ecc_corrected_aggregate grew {before} -> {now}: more corrected (single-bit) ECC errors",
                    "ecc_corrected_aggregate",
                    now,
                    before,
                )
            )
    seconds = _interval_s(s, prev, t)
    replays = _growth(s.pcie_replay_count, prev.pcie_replay_count)
    if replays and replays * 60 / seconds > t.pcie_replays_per_min:
        out.append(
            _watch(
                "pcie_replay_growth",
                f"pcie_replay_count grew {prev.pcie_replay_count} -> {s.pcie_replay_count} "
                f"({replays * 60 / seconds:.1f}/min over {seconds:.0f} s, limit {t.pcie_replays_per_min:g}/min): "
                "the PCIe link retries; check seating and riser",
                "pcie_replay_count",
                s.pcie_replay_count,
                prev.pcie_replay_count,
            )
        )
    crc = _growth(s.nvlink_crc_errors, prev.nvlink_crc_errors)
    if crc and crc / seconds >= t.nvlink_crc_per_s:
        out.append(
            _watch(
                "nvlink_crc_growth",
                f"nvlink_crc_errors grew {prev.nvlink_crc_errors} -> {s.nvlink_crc_errors} "
                f"({crc / seconds:.0f}/s over {seconds:.0f} s, limit {t.nvlink_crc_per_s:g}/s): NVLink CRC errors",
                "nvlink_crc_errors",
                s.nvlink_crc_errors,
                prev.nvlink_crc_errors,
            )
        )
    return out


def _event_findings(event: GpuEvent, catalog: XidCatalog, *, pinned: bool) -> list[GpuHealthFinding]:
    where = "" if pinned else " (GPU unknown)"
    via = f" ({event.source})" if event.source else ""
    if event.kind is GpuEventKind.XID:
        if event.xid is None:
            return [_finding("xid", _D, GpuAction.WATCH, f"an XID event without a code{via}{where}", event=event)]
        status, action, text = xid_verdict(event.xid, catalog)
        return [_finding("xid", status, action, f"{text}{where}", xid=event.xid, event=event)]
    if event.kind is GpuEventKind.ECC_DBE:
        return [
            _finding(
                "ecc_dbe_event",
                _F,
                GpuAction.RESET_GPU,
                f"double-bit ECC error event{via}{where}: reset the GPU",
                event=event,
            )
        ]
    if event.kind is GpuEventKind.GPU_LOST:
        return [_finding("gpu_lost", _F, GpuAction.DRAIN_NODE, f"GPU lost event{via}{where}", event=event)]
    if event.kind is GpuEventKind.GPU_MISSING:
        return [_finding("gpu_missing", _F, GpuAction.DRAIN_NODE, f"GPU gone from the source{via}{where}", event=event)]
    return []


def _repeat_findings(events: Sequence[GpuEvent], catalog: XidCatalog, t: GpuHealthThresholds) -> list[GpuHealthFinding]:
    counts = Counter(e.xid for e in events if e.kind is GpuEventKind.XID and e.xid is not None)
    out: list[GpuHealthFinding] = []
    for xid, count in sorted(counts.items()):
        status, action, _ = xid_verdict(xid, catalog)
        if action is GpuAction.RESTART_JOB and count >= t.xid_repeats_drain:
            out.append(
                _finding(
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
