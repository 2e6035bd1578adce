"""The per-job detector and the resume check: heartbeating activities that poll the shared snapshot and tail
every rank's output incrementally (byte offsets travel in heartbeat details, so a restarted attempt neither
re-reads nor misses a line)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from temporalio import activity

from activities.errors import classified_errors
from activities.logs.crash import scan, to_findings
from activities.logs.heartbeat import heartbeat_times
from activities.logs.job_logs import LogPolicy, log_patterns
from activities.logs.line import LogLine
from activities.logs.progress import find_progress, parse_step
from activities.slurm.snapshots import SnapshotCache
from workflows.domain.loop import (
    JobWatchInput,
    JobWatchResult,
    LogAnchorInput,
    ResumeOutcome,
    WaitResumeInput,
    WaitResumeResult,
)
from workflows.domain.progress import ProgressSample, ProgressState, note_activity, observe
from workflows.domain.slurm import ClusterSnapshot, SlurmJob
from workflows.policy.attribution import block_rank_layout
from workflows.policy.watch import ResumeFacts, StepLine, WatchAction, WatchFacts, decide_poll, decide_resume

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

    @activity.defn(name="job_log_anchor")
    async def anchor(self, inp: LogAnchorInput) -> dict[str, int]:
        """The job's log offsets anchored to its current attempt, no line read (``LogTail.anchor``).

        JobRecovery records them before its first watch: a watch cancelled before it returns (a node agent's GPU
        signal) hands back nothing, and its successor, or the attribution, would anchor afresh at the files'
        sizes then, skipping what the job wrote meanwhile.
        """
        tail = self._logs.tail(log_patterns(inp.log_patterns, inp.job, inp.job_id), inp.job, inp.job_id)
        return await asyncio.to_thread(tail.anchor, {})  # what it could not read, the watch reports

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
            facts = WatchFacts(
                now=now,
                job=job,
                findings=tuple(to_findings(scan(lines))),
                unresponsive_nodes=tuple(unresponsive(snap, nodes_seen)),
                progress=progress,
                last_state=inp.last_state,
                last_restart_count=inp.last_restart_count,
                hang=inp.hang,
                stragglers=inp.stragglers,
                straggler_action=inp.straggler_action,
                reported_straggler_nodes=inp.reported_straggler_nodes,
            )
            decision = decide_poll(facts)
            if decision.action is WatchAction.REFRESH_SCHEDULER:
                # Only victims' lines ("Terminated", lost peers): the shared snapshot may be a second behind the
                # logs, so ask Slurm now whether someone requeued or cancelled the job.
                with classified_errors():
                    snap = await self._snapshots.get(max_age_s=0)
                job = snap.job(inp.job_id)
                facts = facts.model_copy(
                    update={
                        "job": job,
                        "scheduler_fresh": True,
                        "unresponsive_nodes": tuple(unresponsive(snap, nodes_seen)),
                    }
                )
                decision = decide_poll(facts)
            if decision.action is WatchAction.RETURN and decision.outcome is not None:
                return JobWatchResult(
                    outcome=decision.outcome,
                    observed_at=now,
                    job=job,
                    anomaly=decision.anomaly,
                    findings=decision.findings,
                    offsets=offsets,
                    polls=polls,
                    progress=decision.progress,
                    hang=decision.hang,
                    stragglers=decision.stragglers,
                )
            progress = decision.progress or progress
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
            for rank, at in heartbeat_times(inp.heartbeat_patterns, inp.job_id, self._logs.access(job), job).items():
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
            facts = ResumeFacts(job=job, expected_restart_count=inp.expected_restart_count, not_before=inp.not_before)
            decision = decide_resume(facts)
            if decision.read_logs and job is not None:
                tail = self._logs.tail(log_patterns(inp.log_patterns, job, inp.job_id), job, inp.job_id)
                lines, offsets = await asyncio.to_thread(tail.read_new, offsets)
                activity.heartbeat({"offsets": offsets, "polls": 0, "nodes": list(job.nodes)})
                progress = find_progress(lines)
                if progress is not None and progress.checkpoint is not None:
                    loaded = progress.checkpoint.loaded
                    checkpoint = "none: started from scratch" if loaded is None else (loaded or "an unnamed checkpoint")
                    loaded_at_step = progress.checkpoint.step
                steps = (StepLine(step=m.step, at=m.at) for m in map(parse_step, lines) if m is not None)
                findings = tuple(to_findings(scan(lines)))
                decision = decide_resume(
                    facts.model_copy(update={"logs_read": True, "steps": tuple(steps), "findings": findings})
                )
            first = decision.first_step
            if decision.outcome is ResumeOutcome.RESUMED and first is not None:
                return WaitResumeResult(
                    outcome=ResumeOutcome.RESUMED,
                    observed_at=first.at or now,
                    step=first.step,
                    checkpoint=checkpoint,
                    checkpoint_step=loaded_at_step,
                    offsets=offsets,
                    job=job,
                )
            if decision.outcome is not None:
                return WaitResumeResult(outcome=decision.outcome, observed_at=now, offsets=offsets, job=job)
            await asyncio.sleep(inp.poll_interval_s)


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
