"""The per-job detector and the resume check: heartbeating activities that poll the shared snapshot and tail
every rank's output incrementally (byte offsets travel in heartbeat details, so a restarted attempt neither
re-reads nor misses a line)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.errors import classified_errors
from activities.logs.access import LogAccess
from activities.logs.crash import scan, to_findings
from activities.logs.heartbeat import heartbeat_times
from activities.logs.line import LogLine
from activities.logs.patterns import expand_patterns
from activities.logs.progress import find_progress, parse_step
from activities.logs.tail import LogTail
from activities.slurm.snapshots import SnapshotCache
from workflows.domain.anomaly import build_anomaly
from workflows.domain.hang import HangVerdict
from workflows.domain.incident import Anomaly, AnomalyKind, LogFinding
from workflows.domain.loop import (
    JobWatchInput,
    JobWatchResult,
    ResumeOutcome,
    WaitResumeInput,
    WaitResumeResult,
    WatchOutcome,
)
from workflows.domain.progress import ProgressSample, ProgressState, note_activity, observe
from workflows.domain.recovery import StragglerAction
from workflows.domain.slurm import ClusterSnapshot, JobState, SlurmJob
from workflows.domain.straggler import StragglerVerdict
from workflows.policy.attribution import block_rank_layout
from workflows.policy.hang import assess_hang
from workflows.policy.straggler import assess_stragglers


def log_patterns(patterns: Sequence[str], job: SlurmJob | None, job_id: int) -> list[str]:
    """The files to tail: the spec's patterns with ``%j`` expanded, else the job's own stdout/stderr."""
    if patterns:
        return expand_patterns(patterns, job_id)
    if job is None:
        return []
    return sorted({p for p in (job.standard_output, job.standard_error) if p})


_NODE_TOKEN = re.compile(r"(?<![\w.])node=([A-Za-z0-9][\w.-]{0,63})")


def progress_samples(lines: Sequence[LogLine], read_at: datetime, layout: dict[int, str]) -> list[ProgressSample]:
    """The step lines among ``lines``, as progress samples: rank from the file or line, node from the file name's
    ``%N``, a ``node=`` token, or the job's block layout; lines without their own time are stamped ``read_at``.

    Lines that name no rank count as rank 0's: a job whose only log is rank 0's stdout still shows progress
    (its hang window is then rank 0's; stragglers need per-rank lines).
    """
    samples = []
    for line in lines:
        mark = parse_step(line)
        if mark is None:
            continue
        rank = mark.rank if mark.rank is not None else 0
        token = _NODE_TOKEN.search(line.text)
        node = line.node or (token.group(1) if token else "") or layout.get(rank, "")
        samples.append(
            ProgressSample(
                rank=rank,
                node=node,
                step=mark.step,
                at=mark.at or read_at,
                step_time_s=mark.step_time_s,
                compute_time_s=mark.compute_time_s,
                epoch=mark.epoch,
            )
        )
    return samples


def unresponsive(snapshot: ClusterSnapshot, nodes: Sequence[str]) -> list[str]:
    """The given nodes the scheduler shows DOWN or NOT_RESPONDING."""
    bad = []
    for name in nodes:
        node = snapshot.node(name)
        if node is not None and (not node.is_responding or node.state.value == "down"):
            bad.append(name)
    return bad


class LogPolicy:
    """Which log files of a job the worker may read (``watch.log_roots``, ``watch.log_require_owner``).

    A job's owner chooses the log patterns (in its comment), and the worker often runs as root: without this,
    a job could make Rebound read, and show as evidence, any file on the host.
    """

    def __init__(self, roots: Sequence[Path | str] = (), *, require_owner: bool = False) -> None:
        self._roots = tuple(roots)
        self._require_owner = require_owner
        self._reported: dict[int, dict[str, str]] = {}

    def access(self, job: SlurmJob | None) -> LogAccess | None:
        """The job's access policy (every file refused when the job is unknown); None when nothing is restricted."""
        if not self._roots and not self._require_owner:
            return None
        return LogAccess.for_job(
            self._roots, job.user_id if job is not None else None, require_owner=self._require_owner
        )

    def tail(self, patterns: Sequence[str], job: SlurmJob | None, job_id: int) -> LogTail:
        """A tail over the job's log files, bound to this policy."""
        return LogTail(patterns, access=self.access(job))

    def report(self, job_id: int, tail: LogTail) -> None:
        """Log refused patterns and files once per job and change: an operator must see why evidence is missing."""
        refused = tail.refused
        if refused and refused != self._reported.get(job_id):
            activity.logger.warning("job %s: log files not read: %s", job_id, refused)
        self._reported[job_id] = refused


class WatchActivities:
    """Job watching and resume verification, sharing the worker's scheduler snapshot."""

    def __init__(self, snapshots: SnapshotCache, logs: LogPolicy | None = None) -> None:
        self._snapshots = snapshots
        self._logs = logs or LogPolicy()

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
        progress: ProgressState = state.get("progress") or inp.progress or ProgressState()
        started = datetime.now(UTC)
        while True:
            snap = await self._fresh_since(started)
            job = snap.job(inp.job_id)
            if job is not None and job.nodes:
                nodes_seen = list(job.nodes)
            tail = self._logs.tail(log_patterns(inp.log_patterns, job, inp.job_id), job, inp.job_id)
            lines, offsets = await asyncio.to_thread(tail.read_new, offsets)
            self._logs.report(inp.job_id, tail)
            now = datetime.now(UTC)
            progress = await asyncio.to_thread(self._track, inp, job, nodes_seen, progress, lines, now)
            polls += 1
            activity.heartbeat(
                {"offsets": offsets, "polls": polls, "nodes": nodes_seen, "progress": progress.model_dump(mode="json")}
            )
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
                anomaly = build_anomaly(AnomalyKind.RANK_CRASH, now, job=job, findings=findings)
                return _anomaly(now, anomaly, offsets, polls, job=job, findings=findings)
            down = unresponsive(snap, nodes_seen) if job is None or not job.state.is_terminal() else []
            if down:
                anomaly = build_anomaly(AnomalyKind.NODE_FAILURE, now, job=job, down_nodes=down)
                return _anomaly(now, anomaly, offsets, polls, job=job)
            if job is None:
                return JobWatchResult(
                    outcome=WatchOutcome.GONE, observed_at=now, offsets=offsets, polls=polls, progress=progress
                )
            if job.restart_count != inp.last_restart_count or job.state is not inp.last_state:
                if job.state.is_failure():
                    anomaly = build_anomaly(AnomalyKind.JOB_FAILED, now, job=job)
                    return _anomaly(now, anomaly, offsets, polls, job=job, progress=progress)
                return JobWatchResult(
                    outcome=WatchOutcome.CHANGED, observed_at=now, job=job, offsets=offsets, polls=polls,
                    progress=progress,
                )  # fmt: skip
            if job.state is JobState.RUNNING:
                silent = assess_hang(progress, now, inp.hang, expected_ranks=range(job.task_count))
                if silent.hung:
                    anomaly = build_anomaly(AnomalyKind.HANG, now, job=job, verdict=silent)
                    return _anomaly(now, anomaly, offsets, polls, job=job, progress=progress, verdict=silent)
                if inp.straggler_action is not StragglerAction.OFF:
                    progress, slow = assess_stragglers(progress, inp.stragglers)
                    new_nodes = {n.node for n in slow.nodes} - set(inp.reported_straggler_nodes)
                    if slow.flagged and new_nodes:
                        anomaly = build_anomaly(AnomalyKind.STRAGGLER, now, job=job, verdict=slow)
                        return _anomaly(now, anomaly, offsets, polls, job=job, progress=progress, verdict=slow)
            await asyncio.sleep(inp.poll_interval_s)

    def _track(
        self,
        inp: JobWatchInput,
        job: SlurmJob | None,
        nodes: Sequence[str],
        progress: ProgressState,
        lines: Sequence[LogLine],
        now: datetime,
    ) -> ProgressState:
        """Fold this poll's step lines and heartbeat files into the job's progress state."""
        task_count = job.task_count if job is not None else 0
        progress = observe(progress, progress_samples(lines, now, block_rank_layout(nodes, task_count)), now)
        if inp.heartbeat_patterns:
            for rank, at in heartbeat_times(inp.heartbeat_patterns, inp.job_id, self._logs.access(job)).items():
                progress = note_activity(progress, rank, at)
        return progress

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
            tail = self._logs.tail(log_patterns(inp.log_patterns, job, inp.job_id), job, inp.job_id)
            lines, offsets = await asyncio.to_thread(tail.read_new, offsets)
            activity.heartbeat({"offsets": offsets, "polls": 0, "nodes": list(job.nodes)})
            progress = find_progress(lines)
            if progress is not None and progress.checkpoint is not None:
                loaded = progress.checkpoint.loaded
                checkpoint = "none: started from scratch" if loaded is None else (loaded or "an unnamed checkpoint")
                loaded_at_step = progress.checkpoint.step
            # Any step line after the restart is the new attempt's: after a failure no data-parallel rank can
            # complete a step (it needs every peer), so the old attempt cannot print one.
            current = job.restart_count >= inp.expected_restart_count
            restarted = current and job.state is not JobState.PENDING
            steps = [m for m in (parse_step(line) for line in lines) if m is not None and _is_new(m.at, restarted, inp)]
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
            # Only a culprit's line proves the successor failed: "Terminated" victims' lines are the old attempt
            # being stopped (they can arrive after a successor that started at once is already running).
            fresh = [f for f in to_findings(scan(lines)) if f.culprit and _is_new(f.at, restarted, inp)]
            if (current and job.state.is_failure()) or (restarted and fresh):
                return WaitResumeResult(outcome=ResumeOutcome.FAILED_AGAIN, observed_at=now, offsets=offsets, job=job)
            await asyncio.sleep(inp.poll_interval_s)


def _is_new(at: datetime | None, restarted: bool, inp: WaitResumeInput) -> bool:
    """Whether a step line can be the restarted attempt's (see ``WaitResumeInput.not_before``)."""
    if inp.not_before is None:
        return True
    if at is not None:
        return at >= inp.not_before
    return restarted


def _resume_details(initial_offsets: dict[str, int]) -> dict[str, Any]:
    """Where the previous attempt of this activity stopped (its last heartbeat), or the input's offsets."""
    details = activity.info().heartbeat_details
    if details:
        last = details[-1]
        if isinstance(last, dict) and isinstance(last.get("offsets"), dict):
            progress = None
            if isinstance(last.get("progress"), dict):
                with contextlib.suppress(ValueError):  # an older worker's shape: learn the timing afresh
                    progress = ProgressState.model_validate(last["progress"])
            return {
                "offsets": {str(k): int(v) for k, v in last["offsets"].items()},
                "polls": int(last.get("polls", 0)),
                "nodes": [str(n) for n in last.get("nodes", [])],
                "progress": progress,
            }
    return {"offsets": dict(initial_offsets), "polls": 0, "nodes": [], "progress": None}


def _anomaly(
    now: datetime,
    anomaly: Anomaly,
    offsets: dict[str, int],
    polls: int,
    *,
    job: SlurmJob | None,
    findings: Sequence[LogFinding] = (),
    progress: ProgressState | None = None,
    verdict: HangVerdict | StragglerVerdict | None = None,
) -> JobWatchResult:
    """The watch's answer for an anomaly, with the findings and the verdict behind it."""
    return JobWatchResult(
        outcome=WatchOutcome.ANOMALY,
        observed_at=now,
        job=job,
        anomaly=anomaly,
        findings=tuple(findings),
        offsets=offsets,
        polls=polls,
        progress=progress,
        hang=verdict if isinstance(verdict, HangVerdict) else None,
        stragglers=verdict if isinstance(verdict, StragglerVerdict) else None,
    )
