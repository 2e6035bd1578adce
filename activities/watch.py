"""The per-job detector and the resume check: heartbeating activities that poll the shared snapshot and tail
every rank's output incrementally (byte offsets travel in heartbeat details, so a restarted attempt neither
re-reads nor misses a line)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from temporalio import activity

from activities.errors import classified_errors
from activities.logs.crash import CrashFinding, Role, scan
from activities.logs.progress import find_progress, parse_step
from activities.logs.tail import LogTail, expand_patterns
from activities.slurm.snapshots import SnapshotCache
from workflows.domain.incident import Anomaly, AnomalyKind, Evidence, EvidenceSource, LogFinding
from workflows.domain.loop import (
    JobWatchInput,
    JobWatchResult,
    ResumeOutcome,
    WaitResumeInput,
    WaitResumeResult,
    WatchOutcome,
)
from workflows.domain.slurm import ClusterSnapshot, JobState, SlurmJob


def log_patterns(patterns: Sequence[str], job: SlurmJob | None, job_id: int) -> list[str]:
    """The files to tail: the spec's patterns with ``%j`` expanded, else the job's own stdout/stderr."""
    if patterns:
        return expand_patterns(patterns, job_id)
    if job is None:
        return []
    return sorted({p for p in (job.standard_output, job.standard_error) if p})


def to_findings(found: Sequence[CrashFinding], start_order: int = 0) -> list[LogFinding]:
    """Crash findings reduced to what attribution needs, numbered in reading order.

    Informational findings (a task stopped by a requeue, a cancellation) are not crashes and are dropped.
    """
    return [
        LogFinding(
            kind=f.kind.value,
            rank=f.rank,
            node=f.node or "",
            exception=f.exception or "",
            at=f.at,
            order=start_order + i,
            text=f.text,
            culprit=f.culprit,
            failure_class=f.failure_class.value,
        )
        for i, f in enumerate(f for f in found if f.role is not Role.INFO)
    ]


def unresponsive(snapshot: ClusterSnapshot, nodes: Sequence[str]) -> list[str]:
    """The given nodes the scheduler shows DOWN or NOT_RESPONDING."""
    bad = []
    for name in nodes:
        node = snapshot.node(name)
        if node is not None and (not node.is_responding or node.state.value == "down"):
            bad.append(name)
    return bad


class WatchActivities:
    """Job watching and resume verification, sharing the worker's scheduler snapshot."""

    def __init__(self, snapshots: SnapshotCache) -> None:
        self._snapshots = snapshots

    async def _fresh_since(self, started: datetime) -> ClusterSnapshot:
        """The shared snapshot, unless it predates ``started`` (e.g. the requeue being verified): then a new one."""
        with classified_errors():
            snap = await self._snapshots.get()
            if snap.observed_at < started:
                snap = await self._snapshots.get(max_age_s=0)
        return snap

    @activity.defn(name="job_watch")
    async def watch(self, inp: JobWatchInput) -> JobWatchResult:
        """Return at the first sign of trouble, or when the job changes; heartbeat every poll."""
        state = _resume_details(inp.offsets)
        offsets: dict[str, int] = state["offsets"]
        polls: int = state["polls"]
        nodes_seen: list[str] = state["nodes"]
        started = datetime.now(UTC)
        while True:
            snap = await self._fresh_since(started)
            job = snap.job(inp.job_id)
            if job is not None and job.nodes:
                nodes_seen = list(job.nodes)
            tail = LogTail(log_patterns(inp.log_patterns, job, inp.job_id))
            lines, offsets = await asyncio.to_thread(tail.read_new, offsets)
            polls += 1
            activity.heartbeat({"offsets": offsets, "polls": polls, "nodes": nodes_seen})
            now = datetime.now(UTC)
            findings = to_findings(scan(lines))
            if findings and not any(f.culprit for f in findings):
                # Only victims' lines ("Terminated", lost peers): the shared snapshot may be a second behind the
                # logs, so ask Slurm now whether someone requeued or cancelled the job.
                with classified_errors():
                    snap = await self._snapshots.get(max_age_s=0)
                job = snap.job(inp.job_id)
            # Requeued (its restart count may lag), cancelled, or being torn down: with no culprit in the logs,
            # the scheduler's own next state tells what happened (a failed job ends FAILED and is caught then).
            stopped_from_outside = job is not None and (
                job.restart_count > inp.last_restart_count
                or job.state in (JobState.CANCELLED, JobState.PENDING, JobState.COMPLETING)
            )
            if stopped_from_outside and not any(f.culprit for f in findings):
                # An operator's requeue or an owner's scancel: the ranks' "Terminated" lines are not a failure.
                findings = []
            if findings:
                return _anomaly(AnomalyKind.RANK_CRASH, now, job, findings, offsets, polls)
            down = unresponsive(snap, nodes_seen) if job is None or not job.state.is_terminal() else []
            if down:
                summary = f"node(s) {', '.join(down)} of the job stopped responding"
                return _anomaly(AnomalyKind.NODE_FAILURE, now, job, [], offsets, polls, summary, down)
            if job is None:
                return JobWatchResult(outcome=WatchOutcome.GONE, observed_at=now, offsets=offsets, polls=polls)
            if job.restart_count != inp.last_restart_count or job.state is not inp.last_state:
                if job.state.is_failure():
                    summary = f"job ended {job.state.value} (exit {job.exit_code}, {job.state_reason})"
                    return _anomaly(AnomalyKind.JOB_FAILED, now, job, [], offsets, polls, summary)
                return JobWatchResult(
                    outcome=WatchOutcome.CHANGED, observed_at=now, job=job, offsets=offsets, polls=polls
                )
            await asyncio.sleep(inp.poll_interval_s)

    @activity.defn(name="job_wait_resume")
    async def wait_resume(self, inp: WaitResumeInput) -> WaitResumeResult:
        """Return once the restarted job logs a training step (after its checkpoint line, if it prints one)."""
        state = _resume_details(inp.offsets)
        offsets: dict[str, int] = state["offsets"]
        checkpoint = ""
        loaded_at_step: int | None = None
        started = datetime.now(UTC)
        while True:
            snap = await self._fresh_since(started)
            job = snap.job(inp.job_id)
            now = datetime.now(UTC)
            if job is None:
                return WaitResumeResult(outcome=ResumeOutcome.GONE, observed_at=now, offsets=offsets)
            if job.state is JobState.CANCELLED:
                return WaitResumeResult(outcome=ResumeOutcome.CANCELLED, observed_at=now, offsets=offsets, job=job)
            tail = LogTail(log_patterns(inp.log_patterns, job, inp.job_id))
            lines, offsets = await asyncio.to_thread(tail.read_new, offsets)
            activity.heartbeat({"offsets": offsets, "polls": 0, "nodes": list(job.nodes)})
            progress = find_progress(lines)
            if progress is not None and progress.checkpoint is not None:
                loaded = progress.checkpoint.loaded
                checkpoint = "none: started from scratch" if loaded is None else (loaded or "an unnamed checkpoint")
                loaded_at_step = progress.checkpoint.step
            # Any step line after the restart is the new attempt's: after a failure no data-parallel rank can
            # complete a step (it needs every peer), so the old attempt cannot print one.
            steps = [m for m in (parse_step(line) for line in lines) if m is not None]
            first_step = min(steps, key=lambda m: (m.at.timestamp() if m.at else float("inf"), m.step), default=None)
            if first_step is not None:
                return WaitResumeResult(
                    outcome=ResumeOutcome.RESUMED,
                    observed_at=first_step.at or now,
                    step=first_step.step,
                    checkpoint=checkpoint,
                    checkpoint_step=loaded_at_step,
                    offsets=offsets,
                    job=job,
                )
            # Until the successor runs, new lines are the previous attempt's last words (its peers' tracebacks,
            # srun's summary): they belong to the incident being recovered, not to a new one.
            current = job.restart_count >= inp.expected_restart_count
            restarted = current and job.state is not JobState.PENDING
            if (current and job.state.is_failure()) or (restarted and to_findings(scan(lines))):
                return WaitResumeResult(outcome=ResumeOutcome.FAILED_AGAIN, observed_at=now, offsets=offsets, job=job)
            await asyncio.sleep(inp.poll_interval_s)


def _resume_details(initial_offsets: dict[str, int]) -> dict[str, Any]:
    """Where the previous attempt of this activity stopped (its last heartbeat), or the input's offsets."""
    details = activity.info().heartbeat_details
    if details:
        last = details[-1]
        if isinstance(last, dict) and isinstance(last.get("offsets"), dict):
            return {
                "offsets": {str(k): int(v) for k, v in last["offsets"].items()},
                "polls": int(last.get("polls", 0)),
                "nodes": [str(n) for n in last.get("nodes", [])],
            }
    return {"offsets": dict(initial_offsets), "polls": 0, "nodes": []}


def _anomaly(
    kind: AnomalyKind,
    now: datetime,
    job: SlurmJob | None,
    findings: list[LogFinding],
    offsets: dict[str, int],
    polls: int,
    summary: str = "",
    nodes: Sequence[str] = (),
) -> JobWatchResult:
    evidence = [
        Evidence(source=EvidenceSource.LOGS, text=f.text, node=f.node, rank=f.rank, at=f.at) for f in findings[:8]
    ]
    evidence += [Evidence(source=EvidenceSource.SCHEDULER, text=f"node {n} not responding", node=n) for n in nodes]
    if job is not None and job.state.is_terminal():
        evidence.append(
            Evidence(
                source=EvidenceSource.SCHEDULER,
                text=f"job {job.job_id} {job.state.value} exit={job.exit_code} reason={job.state_reason}",
            )
        )
    if not summary:
        culprits = [f for f in findings if f.culprit]
        first = min(culprits or findings, key=lambda f: (f.at.timestamp() if f.at else float("inf"), f.order))
        who = f"rank {first.rank}" if first.rank is not None else "a rank"
        summary = f"{who}: {first.kind}: {first.text[:160]}"
    return JobWatchResult(
        outcome=WatchOutcome.ANOMALY,
        observed_at=now,
        job=job,
        anomaly=Anomaly(kind=kind, observed_at=now, summary=summary, evidence=tuple(evidence)),
        findings=tuple(findings),
        offsets=offsets,
        polls=polls,
    )
