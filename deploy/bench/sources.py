"""``rebound bench sources``: how fast each detection source tells Rebound about a fault on the lab.

For each source, one fault is injected through that source only into a running demo job, and the latency is read
from the job's JobRecovery (the clock that matters is Rebound's own record, not the bench's polling):

=============  ====================================================================  ==============================
source         fault                                                                 measured to
=============  ====================================================================  ==============================
``kernel``     an NVRM XID 79 line appended to the node's file-backed kernel log     the incident's first observation
``nvml``       XID 79 through the node's fake NVML only (``rebound lab inject xid``)  the incident's first observation
``dcgm``       a DCGM exporter page with double-bit ECC errors on the rank's GPU,    the ATTRIBUTED entry of a
               then a rank crash                                                     verdict resting on DCGM
``scheduler``  the node's slurmd killed, its tasks frozen (no log line, no exit)     the incident's first observation
``logs``       a rank logs an error and exits 13 (``rebound lab inject crash``)      the incident's first observation
=============  ====================================================================  ==============================

DCGM is not a detection source in Rebound: attribution reads the exporter when an incident is being explained
(``workflows/job_recovery/steps.py``), so its row is the time from the crash that opens the incident to the verdict
naming DCGM, which is what an operator waits for. Each run also checks that the incident came from the source
injected (the GPU event's source, the anomaly's kind, the verdict's basis); a run detected another way is a failed
run, not a sample.

Everything here is pure (the runs are ``deploy.bench.sources_run``), so scoring and the table are unit-tested.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal, get_args

from deploy.bench.scoring import incidents_after, seconds_between
from workflows.domain.base import Frozen
from workflows.domain.incident import AnomalyKind, Incident
from workflows.domain.recovery import JobRecoveryStatus
from workflows.policy.stats import mean, percentile

__all__ = [
    "SOURCES",
    "Source",
    "SourceRun",
    "format_sources_table",
    "is_detected",
    "parse_sources",
    "score_source_run",
    "source_summary",
    "sources_report",
]

Source = Literal["kernel", "nvml", "dcgm", "scheduler", "logs"]
SOURCES: tuple[Source, ...] = get_args(Source)

KERNEL_EVENT_SOURCE = "kernel log"
"""``activities.kernel.lines.SOURCE``: what a kernel-log GPU event names as its source."""
NVML_EVENT_SOURCE = "nvml"
"""``activities.gpu.nvml.SOURCE_NAME``."""
DCGM_BASIS = "gpu-dcgm"
"""``EvidenceKind.GPU_DCGM``: a verdict resting on the node's DCGM exporter."""

INJECTED: dict[Source, str] = {
    "kernel": "NVRM XID 79 line in the node's kernel log",
    "nvml": "XID 79 in the node's fake NVML",
    "dcgm": "DCGM page: ECC DBE on the GPU, then a rank crash",
    "scheduler": "slurmd killed, tasks frozen",
    "logs": "rank error line, exit 13",
}
MEASURED_TO: dict[Source, str] = {s: "first observation" for s in SOURCES} | {"dcgm": "verdict naming DCGM"}


def parse_sources(text: str | None) -> tuple[Source, ...]:
    """``"kernel,nvml"`` -> those sources in that order; None or ``"all"``: every source.

    Raises:
        ValueError: an unknown name, or none given.
    """
    if text is None or text.strip().lower() == "all":
        return SOURCES
    out: list[Source] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = next((s for s in SOURCES if s == part), None)
        if match is None:
            raise ValueError(f"unknown source {part!r}: choose from {', '.join(SOURCES)}")
        if match not in out:
            out.append(match)
    if not out:
        raise ValueError("no source given")
    return tuple(out)


# ----- one run (pure) ---------------------------------------------------------------------------------------------


def via_source(source: Source, incident: Incident) -> bool:
    """Whether the incident came from ``source``: the GPU event's source, the anomaly's kind, or (DCGM) the
    verdict's basis."""
    anomaly = incident.anomaly
    events = {e.source for e in anomaly.gpu_events}
    if source == "kernel":
        return anomaly.kind is AnomalyKind.GPU_FAULT and KERNEL_EVENT_SOURCE in events
    if source == "nvml":
        return anomaly.kind is AnomalyKind.GPU_FAULT and NVML_EVENT_SOURCE in events
    if source == "scheduler":
        return anomaly.kind is AnomalyKind.NODE_FAILURE
    if source == "logs":
        return anomaly.kind is AnomalyKind.RANK_CRASH
    att = incident.attribution
    return att is not None and att.basis.value == DCGM_BASIS


def is_detected(source: Source, status: JobRecoveryStatus, before: Iterable[int]) -> bool:
    """Whether a run has its measure: an incident after the fault (for DCGM: attributed), or the workflow ended."""
    after = incidents_after(status, before)
    if status.state.is_terminal():
        return True
    if source == "dcgm":
        return any(i.attribution is not None for i in after)
    return bool(after)


class SourceRun(Frozen):
    """One run of one source: what was injected where, what Rebound recorded, the latencies."""

    source: Source
    index: int
    run: str
    job_id: int | None = None
    node: str | None = None
    t0: datetime | None = None
    failed: bool
    error: str = ""
    latency_s: float | None = None
    """The source's measure (``MEASURED_TO``): ``detected_s``, or ``verdict_s`` for DCGM."""
    detected_s: float | None = None
    """The incident's first observation (``detected_at``: the agent's event, the tailer's read) - t0."""
    recorded_s: float | None = None
    """The workflow's DETECTED timeline entry - t0 (after the signal arrived or the watch returned)."""
    verdict_s: float | None = None
    """The incident's ATTRIBUTED timeline entry - t0."""
    anomaly: str = ""
    summary: str = ""
    event_sources: tuple[str, ...] = ()
    basis: str = ""
    cause: str = ""
    via_source: bool = False
    wall_s: float = 0.0


def _entry_s(t0: datetime, status: JobRecoveryStatus, event: str, number: int) -> float | None:
    entry = next((e for e in status.timeline if e.event == event and e.incident == number), None)
    return seconds_between(t0, entry.at) if entry is not None else None


def score_source_run(
    *,
    source: Source,
    index: int,
    run: str,
    job_id: int | None,
    node: str | None,
    t0: datetime,
    status: JobRecoveryStatus | None,
    before: Iterable[int],
    timed_out: bool,
    wall_s: float,
) -> SourceRun:
    """One run's measures from the workflow's last status: the first incident recorded after the fault."""
    base: dict[str, Any] = {
        "source": source,
        "index": index,
        "run": run,
        "job_id": job_id,
        "node": node,
        "t0": t0,
        "wall_s": round(wall_s, 1),
    }
    if status is None:
        return SourceRun(**base, failed=True, error="no status from the workflow")
    after = incidents_after(status, before)
    if not after:
        why = "timeout: " if timed_out else ""
        return SourceRun(**base, failed=True, error=f"{why}no incident after the fault (state {status.state.value})")
    first = after[0]
    att = first.attribution
    detected = seconds_between(t0, first.detected_at)
    verdict = _entry_s(t0, status, "ATTRIBUTED", first.number)
    came = via_source(source, first)
    error = ""
    if not came:
        if source == "dcgm":
            error = f"verdict rests on {att.basis.value if att is not None else 'nothing yet'}, not DCGM"
        else:
            events = sorted({e.source for e in first.anomaly.gpu_events})
            where = f" from {','.join(events)}" if events else ""
            error = f"detected as {first.anomaly.kind.value}{where}, not through {source}"
    return SourceRun(
        **base,
        failed=not came,
        error=error,
        latency_s=verdict if source == "dcgm" else detected,
        detected_s=detected,
        recorded_s=_entry_s(t0, status, "DETECTED", first.number),
        verdict_s=verdict,
        anomaly=first.anomaly.kind.value,
        summary=first.anomaly.summary[:200],
        event_sources=tuple(sorted({e.source for e in first.anomaly.gpu_events})),
        basis=att.basis.value if att is not None else "",
        cause=att.cause if att is not None else "",
        via_source=came,
    )


# ----- report (pure) ----------------------------------------------------------------------------------------------


def _stats(values: Iterable[float | None]) -> dict[str, float] | None:
    present = [v for v in values if v is not None and math.isfinite(v)]
    if not present:
        return None
    return {
        "n": len(present),
        "mean": round(mean(present), 3),
        "p50": round(percentile(present, 50), 3),
        "p99": round(percentile(present, 99), 3),
        "max": round(max(present), 3),
    }


def source_summary(source: Source, runs: Sequence[SourceRun]) -> dict[str, Any]:
    """One source's JSON: statistics over the runs detected through it; failures over every run."""
    ok = [r for r in runs if not r.failed]
    return {
        "injected": INJECTED[source],
        "measured_to": MEASURED_TO[source],
        "runs": len(runs),
        "failed_runs": len(runs) - len(ok),
        "latency_s": _stats(r.latency_s for r in ok),
        "detected_s": _stats(r.detected_s for r in ok),
        "recorded_s": _stats(r.recorded_s for r in ok),
        "verdict_s": _stats(r.verdict_s for r in ok),
        "errors": [f"#{r.index}: {r.error}" for r in runs if r.failed],
    }


def sources_report(runs: Sequence[SourceRun], sources: Sequence[Source]) -> dict[str, Any]:
    """``{"sources": {name: summary}, "runs": [raw results]}``, sources in the order asked."""
    return {
        "sources": {s: source_summary(s, [r for r in runs if r.source == s]) for s in sources},
        "runs": [r.model_dump(mode="json") for r in runs],
    }


def _cell(stats: dict[str, float] | None) -> str:
    return "-" if stats is None else f"{stats['p50']:.2f}/{stats['p99']:.2f}"


def format_sources_table(report: dict[str, Any]) -> str:
    """A plain aligned table, one row per source; latency cells are ``p50/p99`` seconds from the fault."""
    header = ["source", "fault", "runs", "ok", "latency s", "measured to", "recorded s", "verdict s"]
    rows = [header, ["", "", "", "", "p50/p99", "", "p50/p99", "p50/p99"]]
    for name, s in report["sources"].items():
        rows.append(
            [
                name,
                s["injected"],
                str(s["runs"]),
                str(s["runs"] - s["failed_runs"]),
                _cell(s["latency_s"]),
                s["measured_to"],
                _cell(s["recorded_s"]),
                _cell(s["verdict_s"]),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        cells[5] = row[5].ljust(widths[5])
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
