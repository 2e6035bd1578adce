"""The attribution activity: gathers evidence around an anomaly, then applies the pure rules.

Its I/O is its own (the settle window's log reads, fresh node states, the corroboration wait); what the logs say
(``LogEvidence``), the facts (``AttributionFacts.from_findings``) and the verdict (``attribute``) are the functions
``rebound bench attribution`` and ``rebound diagnose`` call too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from temporalio import activity

from activities.errors import classified_errors
from activities.gpu.xid_catalog import default_xid_catalog
from activities.logs.crash import LineReader, to_findings
from activities.logs.job_logs import LogPolicy, log_patterns
from activities.logs.job_watcher import unresponsive
from activities.logs.line import LogLine
from activities.slurm.port import SchedulerReads
from workflows.domain.errors import ReboundError
from workflows.domain.findings import Cause
from workflows.domain.gpu import GpuEvent
from workflows.domain.incident import Attribution, LogFinding
from workflows.domain.loop import AttributeInput, AttributeResult
from workflows.domain.slurm import ClusterSnapshot
from workflows.policy.attribution import AttributionFacts, attribute
from workflows.policy.gpu_event_rules import is_gpu_fault
from workflows.policy.xid_copies import one_copy_per_fault

__all__ = ["AttributionActivities", "LogEvidence", "gpu_faults_since"]

#: Attributions that rest on silence alone: worth waiting for the scheduler's word on the nodes.
_WEAK_CAUSES = frozenset({Cause.RANKS_VANISHED})


class LogEvidence:
    """What the logs said about one failure so far: the findings in reading order, and every rank that wrote.

    Starts from the detector's findings (all it knows of the ranks before the window); ``read`` adds the lines read
    in the settle window, through one ``LineReader`` (so a traceback split across two reads keeps its context).
    """

    def __init__(self, findings: Iterable[LogFinding] = ()) -> None:
        self.findings: list[LogFinding] = list(findings)
        self.ranks_logging: set[int] = {f.rank for f in self.findings if f.rank is not None}
        self._reader = LineReader()

    def read(self, lines: Sequence[LogLine]) -> None:
        self.ranks_logging |= {line.rank for line in lines if line.rank is not None}
        self.findings += to_findings(self._reader.scan(lines), start_order=len(self.findings))


class AttributionActivities:
    """Bound to the scheduler port: attribution reads a fresh cluster state, not the shared snapshot."""

    def __init__(self, scheduler: SchedulerReads, logs: LogPolicy | None = None) -> None:
        self._scheduler = scheduler
        self._logs = logs or LogPolicy()

    @activity.defn(name="attribute_failure")
    async def attribute_failure(self, inp: AttributeInput) -> AttributeResult:
        """Collect late log lines for ``settle_s``, read node states, attribute; corroborate weak verdicts."""
        evidence = LogEvidence(inp.findings)
        offsets = dict(inp.offsets)
        with classified_errors():
            snap = await self._scheduler.snapshot()
        job = snap.job(inp.job_id)
        tail = self._logs.tail(log_patterns(inp.log_patterns, job, inp.job_id), job, inp.job_id)
        deadline = time.monotonic() + inp.settle_s
        while True:
            lines, offsets = await asyncio.to_thread(tail.read_new, offsets)
            evidence.read(lines)
            activity.heartbeat()
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.2)

        persistence = _Persistence()
        persistence.see(snap, inp.job_nodes)
        verdict = self._attribute(inp, persistence, evidence)
        deadline = time.monotonic() + inp.corroborate_s
        while (_weak(verdict, evidence) or persistence.pending) and time.monotonic() < deadline:
            # Only silence points at a node, or a node has just stopped answering: a dead host stays
            # NOT_RESPONDING (then DOWN); a blip clears within a ping or two.
            await asyncio.sleep(0.5)
            activity.heartbeat()
            with classified_errors():
                snap = await self._scheduler.snapshot()
            persistence.see(snap, inp.job_nodes)
            verdict = self._attribute(inp, persistence, evidence)
        with classified_errors():
            final = await self._scheduler.get_job(inp.job_id)
        return AttributeResult(
            attribution=verdict,
            offsets=offsets,
            findings=tuple(evidence.findings),
            job_state=final.state if final is not None else None,
        )

    def _attribute(self, inp: AttributeInput, persistence: _Persistence, evidence: LogEvidence) -> Attribution:
        since = inp.anomaly.observed_at - timedelta(minutes=5)
        facts = AttributionFacts.from_findings(
            inp.job_nodes,
            evidence.findings,
            ranks=inp.rank_map,
            ranks_logging=evidence.ranks_logging,
            gpu_events=gpu_faults_since(inp.gpu_events, since),
            gpu_verdicts=inp.gpu_verdicts,
            unresponsive_nodes=persistence.confirmed(),
            hang=inp.hang,
            odd_ranks=inp.odd_ranks,
            processes=inp.processes,
            stack_summary=inp.stack_summary,
        )
        return attribute(facts)


def gpu_faults_since(events: Sequence[GpuEvent], since: datetime) -> list[GpuEvent]:
    """The GPU events that can explain this failure: seen since ``since`` and faults at all (``is_gpu_fault``). An
    informational XID, an NVLink5 XID the driver labels Nonfatal or XID 154 back to None is evidence of the GPU's
    history, not of a hardware failure of the job. NVML's event and the kernel's line of one XID count once, judged
    by the copy with the driver's label (``one_copy_per_fault``). Without the catalogue every recent event counts."""
    recent = list(one_copy_per_fault([e for e in events if e.observed_at is None or e.observed_at >= since]))
    try:
        catalog = default_xid_catalog()
    except ReboundError:
        return recent
    return [e for e in recent if is_gpu_fault(e, catalog)]


def _weak(verdict: Attribution, evidence: LogEvidence) -> bool:
    """Worth waiting for the scheduler's word on the nodes: only silence points at a node, or peers lost their
    connections and nothing points anywhere (the silent ranks' node is not known from facts: a dead host's ranks
    may have vanished before the node agents could place them)."""
    if verdict.cause in _WEAK_CAUSES:
        return True
    return verdict.cause == Cause.UNKNOWN and any(not f.culprit for f in evidence.findings)


class _Persistence:
    """Which nodes stay unresponsive: DOWN at once, NOT_RESPONDING only when seen so for MIN_S seconds."""

    MIN_S = 2.0

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._down: set[str] = set()

    def see(self, snap: ClusterSnapshot, nodes: tuple[str, ...]) -> None:
        now = time.monotonic()
        bad = set(unresponsive(snap, nodes))
        self._down = {n for n in bad if (node := snap.node(n)) is not None and node.state.value == "down"}
        self._since = {n: self._since.get(n, now) for n in bad}

    @property
    def pending(self) -> bool:
        """Some node is unresponsive but not yet for long enough to count."""
        return any(n not in self._down and time.monotonic() - t < self.MIN_S for n, t in self._since.items())

    def confirmed(self) -> list[str]:
        now = time.monotonic()
        return sorted(n for n, t in self._since.items() if n in self._down or now - t >= self.MIN_S)
