"""The attribution activity: gathers evidence around an anomaly, then applies the pure rules."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from temporalio import activity

from activities.errors import classified_errors
from activities.logs.crash import scan
from activities.slurm.port import SchedulerReads
from activities.watch import LogPolicy, log_patterns, to_findings, unresponsive
from workflows.domain.findings import Cause, FindingKind
from workflows.domain.incident import Attribution, LogFinding
from workflows.domain.loop import AttributeInput, AttributeResult
from workflows.domain.slurm import ClusterSnapshot
from workflows.policy.attribution import AttributionFacts, attribute, rank_layout

#: Attributions that rest on silence alone: worth waiting for the scheduler's word on the nodes.
_WEAK_CAUSES = frozenset({Cause.RANKS_VANISHED})


class AttributionActivities:
    """Bound to the scheduler port: attribution reads a fresh cluster state, not the shared snapshot."""

    def __init__(self, scheduler: SchedulerReads, logs: LogPolicy | None = None) -> None:
        self._scheduler = scheduler
        self._logs = logs or LogPolicy()

    @activity.defn(name="attribute_failure")
    async def attribute_failure(self, inp: AttributeInput) -> AttributeResult:
        """Collect late log lines for ``settle_s``, read node states, attribute; corroborate weak verdicts."""
        findings = list(inp.findings)
        offsets = dict(inp.offsets)
        ranks_logging: set[int] = {f.rank for f in findings if f.rank is not None}
        with classified_errors():
            snap = await self._scheduler.snapshot()
        job = snap.job(inp.job_id)
        tail = self._logs.tail(log_patterns(inp.log_patterns, job, inp.job_id), job, inp.job_id)
        deadline = time.monotonic() + inp.settle_s
        while True:
            lines, offsets = await asyncio.to_thread(tail.read_new, offsets)
            ranks_logging |= {line.rank for line in lines if line.rank is not None}
            findings += to_findings(scan(lines), start_order=len(findings))
            activity.heartbeat()
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.2)

        persistence = _Persistence()
        persistence.see(snap, inp.job_nodes)
        verdict = self._attribute(inp, persistence, findings, ranks_logging)
        deadline = time.monotonic() + inp.corroborate_s
        while (verdict.cause in _WEAK_CAUSES or persistence.pending) and time.monotonic() < deadline:
            # Only silence points at a node, or a node has just stopped answering: a dead host stays
            # NOT_RESPONDING (then DOWN); a blip clears within a ping or two.
            await asyncio.sleep(0.5)
            activity.heartbeat()
            with classified_errors():
                snap = await self._scheduler.snapshot()
            persistence.see(snap, inp.job_nodes)
            verdict = self._attribute(inp, persistence, findings, ranks_logging)
        with classified_errors():
            final = await self._scheduler.get_job(inp.job_id)
        return AttributeResult(
            attribution=verdict,
            offsets=offsets,
            findings=tuple(findings),
            job_state=final.state if final is not None else None,
        )

    def _attribute(
        self, inp: AttributeInput, persistence: _Persistence, findings: list[LogFinding], ranks_logging: set[int]
    ) -> Attribution:
        nodes = inp.job_nodes
        since = inp.anomaly.observed_at - timedelta(minutes=5)
        facts = AttributionFacts(
            job_nodes=nodes,
            rank_nodes=rank_layout(nodes, inp.task_count, findings),
            findings=findings,
            gpu_events=[e for e in inp.gpu_events if e.observed_at is None or e.observed_at >= since],
            unresponsive_nodes=persistence.confirmed(),
            node_failure_nodes=[f.node for f in findings if f.kind is FindingKind.NODE_FAILURE and f.node],
            ranks_logging=sorted(ranks_logging),
            hang=inp.hang,
            odd_ranks=inp.odd_ranks,
            processes=inp.processes,
            stack_summary=inp.stack_summary,
        )
        return attribute(facts)


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
