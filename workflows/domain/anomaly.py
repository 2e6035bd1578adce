"""The one place an ``Anomaly`` is built: from what detection saw, its evidence and its one-line summary. Pure.

Every detector hands its facts here (the watch's crash findings, unresponsive nodes, the job's failed state, a
hang or straggler verdict; the recovery workflow's GPU events and a restart that failed again), so an anomaly
reads the same whichever path found it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from workflows.domain.gpu import GpuEvent
from workflows.domain.hang import HangVerdict
from workflows.domain.incident import Anomaly, AnomalyKind, Evidence, EvidenceSource, LogFinding
from workflows.domain.slurm import SlurmJob
from workflows.domain.straggler import StragglerVerdict

__all__ = ["build_anomaly"]

#: Evidence items of one kind kept on an anomaly (the full findings travel beside it).
MAX_EVIDENCE = 8


def build_anomaly(
    kind: AnomalyKind,
    observed_at: datetime,
    *,
    job: SlurmJob | None = None,
    findings: Sequence[LogFinding] = (),
    down_nodes: Sequence[str] = (),
    verdict: HangVerdict | StragglerVerdict | None = None,
    gpu_events: Sequence[GpuEvent] = (),
    summary: str = "",
) -> Anomaly:
    """The anomaly ``kind``, first observed at ``observed_at``, with the evidence of the facts given.

    Args:
        kind: What detection saw.
        observed_at: When; for a GPU fault, the first event's own time wins when it has one.
        job: The job as the scheduler showed it: a terminal job adds its state, exit code and reason.
        findings: Crash findings from the ranks' logs (the first culprit, else the first finding, is the summary).
        down_nodes: Job nodes the scheduler shows DOWN or NOT_RESPONDING.
        verdict: The hang or straggler verdict behind a ``HANG`` or ``STRAGGLER`` anomaly.
        gpu_events: GPU faults a node agent reported on the job's nodes.
        summary: Overrides the summary derived from the facts.
    """
    evidence = [
        Evidence(source=EvidenceSource.LOGS, text=f.text, node=f.node, rank=f.rank, at=f.at)
        for f in findings[:MAX_EVIDENCE]
    ]
    evidence += [Evidence(source=EvidenceSource.SCHEDULER, text=f"node {n} not responding", node=n) for n in down_nodes]
    if job is not None and job.state.is_terminal():
        evidence.append(
            Evidence(
                source=EvidenceSource.SCHEDULER,
                text=f"job {job.job_id} {job.state.value} exit={job.exit_code} reason={job.state_reason}",
            )
        )
    if isinstance(verdict, HangVerdict):
        evidence += _hang_evidence(verdict)
    elif isinstance(verdict, StragglerVerdict):
        evidence += _straggler_evidence(verdict)
    if gpu_events and gpu_events[0].observed_at is not None:
        observed_at = gpu_events[0].observed_at
    return Anomaly(
        kind=kind,
        observed_at=observed_at,
        summary=summary or _summary(job, findings, down_nodes, verdict, gpu_events),
        evidence=tuple(evidence),
        gpu_events=tuple(gpu_events),
    )


def _summary(
    job: SlurmJob | None,
    findings: Sequence[LogFinding],
    down_nodes: Sequence[str],
    verdict: HangVerdict | StragglerVerdict | None,
    gpu_events: Sequence[GpuEvent],
) -> str:
    """The most specific fact, in the order the watch checks them."""
    if verdict is not None:
        return verdict.summary
    if gpu_events:
        first = gpu_events[0]
        return f"{first.kind.value} on {first.host} GPU {first.index}" + (f" (XID {first.xid})" if first.xid else "")
    if findings:
        culprits = [f for f in findings if f.culprit]
        earliest = min(culprits or findings, key=lambda f: (f.at.timestamp() if f.at else float("inf"), f.order))
        who = f"rank {earliest.rank}" if earliest.rank is not None else "a rank"
        return f"{who}: {earliest.kind}: {earliest.text[:160]}"
    if down_nodes:
        return f"node(s) {', '.join(down_nodes)} of the job stopped responding"
    if job is not None and job.state.is_failure():
        return f"job ended {job.state.value} (exit {job.exit_code}, {job.state_reason})"
    return "the job failed"


def _hang_evidence(verdict: HangVerdict) -> list[Evidence]:
    """The silence of each rank, the longest first."""
    return [
        Evidence(
            source=EvidenceSource.LOGS,
            text=f"rank {r.rank}: last step {r.last_step if r.last_step is not None else '-'}, silent "
            + (f"{r.silent_for_s:.1f}s" if r.silent_for_s is not None else "since watching began"),
            node=r.node,
            rank=r.rank,
        )
        for r in sorted(verdict.ranks, key=lambda r: -(r.silent_for_s or 0.0))[:MAX_EVIDENCE]
    ]


def _straggler_evidence(verdict: StragglerVerdict) -> list[Evidence]:
    return [
        Evidence(source=EvidenceSource.LOGS, text=r.evidence, node=r.node, rank=r.rank)
        for r in verdict.stragglers[:MAX_EVIDENCE]
    ]
