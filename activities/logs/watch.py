"""The per-job detector and the resume check: heartbeating activities that poll the shared snapshot and tail
every rank's output incrementally (byte offsets travel in heartbeat details, so a restarted attempt neither
re-reads nor misses a line)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from temporalio import activity

from activities.errors import classified_errors
from activities.logs.crash import scan, to_findings
from activities.logs.heartbeat import heartbeat_times
from activities.logs.job_logs import LogPolicy, log_patterns
from activities.logs.job_watcher import JobWatcher, WatchState
from activities.logs.progress import find_progress, parse_step
from activities.logs.successor import previous_attempt_over, successor_lines
from activities.logs.tail import positions
from activities.slurm.snapshots import SnapshotCache
from workflows.domain.checkpoints import CheckpointRef, CheckpointReport
from workflows.domain.incident import LogFinding
from workflows.domain.loop import (
    JobWatchInput,
    JobWatchResult,
    LogAnchorInput,
    ResumeOutcome,
    WaitResumeInput,
    WaitResumeResult,
)
from workflows.domain.progress import ProgressSignal
from workflows.domain.slurm import ClusterSnapshot, SlurmJob
from workflows.policy.watch import ResumeFacts, StepLine, decide_resume

#: Reads a checkpoint directory owned by the given uid under the worker's access policy
#: (``activities.checkpoints.activities.CheckpointActivities.scan``); never raises for a bad directory.
CheckpointScanner = Callable[[Path, int | None], CheckpointReport]


class WatchActivities:
    """Job watching and resume verification, sharing the worker's scheduler snapshot."""

    def __init__(
        self,
        snapshots: SnapshotCache,
        logs: LogPolicy | None = None,
        checkpoints: CheckpointScanner | None = None,
        checkpoint_scan_every_s: float = 10.0,
    ) -> None:
        self._snapshots = snapshots
        self._logs = logs or LogPolicy()
        # The checkpoint scanner (``activities.checkpoints``), for the resume check of jobs with a ``ckpt=``
        # directory; None: a new checkpoint is not looked for.
        self._checkpoints = checkpoints
        # A scan reads every save's metadata (over a shared file system): not at every 0.5 s poll.
        self._scan_every_s = checkpoint_scan_every_s

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
        """Return at the first sign of trouble, or when the job changes; heartbeat every poll.

        The per-job watch of histories recorded before the watch hub (ADR 015); both run ``JobWatcher``.
        """
        details = activity.info().heartbeat_details
        state = WatchState.restore(details[-1] if details else None, inp.offsets)
        watcher = JobWatcher(inp, self._logs, state, started=datetime.now(UTC))

        async def fresh() -> ClusterSnapshot:
            with classified_errors():
                return await self._snapshots.get(max_age_s=0)

        while True:
            snap = await self._fresh_since(watcher.started)
            result = await watcher.poll(snap, fresh)
            activity.heartbeat(state.details())
            if result is not None:
                return result
            await asyncio.sleep(inp.poll_interval_s)

    @activity.defn(name="job_wait_resume")
    async def wait_resume(self, inp: WaitResumeInput) -> WaitResumeResult:
        """Return once the restarted job trains again (a step line, a new checkpoint), fails again, or goes away.

        The new attempt's findings and signs of life are kept across polls (and attempts of this activity, in the
        heartbeat details): a job that fails again is judged on its own lines, and "failed before it trained" is
        said only when it showed no sign of progress at all.
        """
        offsets = _resume_offsets(inp.offsets)
        kept = _kept_resume_evidence()
        findings: list[LogFinding] = kept[0]
        signs: list[ProgressSignal] = kept[1]
        # Where the old attempt's output ends in each file (``activities.logs.successor``): its last words there
        # are never the new attempt's failure. None until Slurm shows the old attempt over.
        boundary: dict[str, int] | None = kept[2]
        checkpoint = ""
        from_scratch = False
        loaded_at_step: int | None = None
        latest: CheckpointRef | None = None
        scanned_at: datetime | None = None
        started = datetime.now(UTC)
        while True:
            snap = await self._fresh_since(started)
            job = snap.job(inp.job_id)
            now = datetime.now(UTC)
            facts = ResumeFacts(
                job=job,
                expected_restart_count=inp.expected_restart_count,
                not_before=inp.not_before,
                restart_checkpoint=inp.restart_checkpoint,
            )
            decision = decide_resume(facts)
            if decision.read_logs and job is not None:
                tail = self._logs.tail(log_patterns(inp.log_patterns, job, inp.job_id), job, inp.job_id)
                if boundary is None and previous_attempt_over(job, inp.expected_restart_count):
                    # Every byte the old attempt wrote is in the files now: their sizes (a file the new attempt
                    # began counts from 0) are where its output ends.
                    boundary = positions(await asyncio.to_thread(tail.anchor, {}))
                read_from = positions(offsets)
                lines, offsets = await asyncio.to_thread(tail.read_new, offsets)
                lines, boundary = successor_lines(lines, read_from=read_from, boundary=boundary, since=inp.not_before)
                progress = find_progress(lines)
                loads: tuple[datetime | None, ...] = ()
                if progress is not None and progress.checkpoint is not None:
                    loaded = progress.checkpoint.loaded
                    checkpoint = "none: started from scratch" if loaded is None else (loaded or "an unnamed checkpoint")
                    from_scratch = loaded is None
                    loaded_at_step = progress.checkpoint.step
                    loads = (progress.checkpoint.at,)
                steps = (StepLine(step=m.step, at=m.at) for m in map(parse_step, lines) if m is not None)
                every = self._scan_every_s
                if inp.checkpoint_dir and (scanned_at is None or (now - scanned_at).total_seconds() >= every):
                    latest = await asyncio.to_thread(self._latest_checkpoint, inp.checkpoint_dir, job.user_id)
                    scanned_at = now
                heartbeats = await asyncio.to_thread(self._heartbeats, inp, job)
                decision = decide_resume(
                    facts.model_copy(
                        update={
                            "logs_read": True,
                            "steps": tuple(steps),
                            "findings": tuple(to_findings(scan(lines))),
                            "checkpoint_loads": loads,
                            "heartbeats": heartbeats,
                            "latest_checkpoint": latest,
                        }
                    )
                )
                findings = (findings + list(decision.findings))[:MAX_SUCCESSOR_FINDINGS]
                signs += [s for s in decision.signs_of_life if s not in signs]
                activity.heartbeat(
                    {
                        "offsets": offsets,
                        "polls": 0,
                        "nodes": list(job.nodes),
                        "findings": [f.model_dump(mode="json") for f in findings],
                        "signs": [s.value for s in signs],
                        "boundary": boundary,
                    }
                )
            first = decision.first_step
            if decision.outcome is ResumeOutcome.RESUMED:
                return WaitResumeResult(
                    outcome=ResumeOutcome.RESUMED,
                    observed_at=(first.at if first is not None else None) or now,
                    step=first.step if first is not None else None,
                    checkpoint=checkpoint,
                    from_scratch=from_scratch,
                    checkpoint_step=loaded_at_step,
                    offsets=offsets,
                    job=job,
                    signal=decision.signal,
                    signs_of_life=tuple(signs),
                    new_checkpoint=decision.new_checkpoint,
                )
            if decision.outcome is ResumeOutcome.FAILED_AGAIN:
                return WaitResumeResult(
                    outcome=decision.outcome,
                    observed_at=now,
                    offsets=offsets,
                    job=job,
                    checkpoint=checkpoint,
                    checkpoint_step=loaded_at_step,
                    signs_of_life=tuple(signs),
                    findings=tuple(findings),
                )
            if decision.outcome is not None:
                return WaitResumeResult(outcome=decision.outcome, observed_at=now, offsets=offsets, job=job)
            await asyncio.sleep(inp.poll_interval_s)

    def _latest_checkpoint(self, directory: str, owner_uid: int | None) -> CheckpointRef | None:
        """The newest valid checkpoint in ``directory``; None without a directory, a scanner, or a valid one."""
        if not directory or self._checkpoints is None:
            return None
        report = self._checkpoints(Path(directory), owner_uid)
        return None if report.error else report.latest_valid

    def _heartbeats(self, inp: WaitResumeInput, job: SlurmJob) -> tuple[datetime, ...]:
        if not inp.heartbeat_patterns:
            return ()
        return tuple(heartbeat_times(inp.heartbeat_patterns, inp.job_id, self._logs.access(job)).values())


#: The new attempt's findings kept for a ``FAILED_AGAIN`` answer: the first ones (the culprit's line comes early).
MAX_SUCCESSOR_FINDINGS = 32


def _kept_resume_evidence() -> tuple[list[LogFinding], list[ProgressSignal], dict[str, int] | None]:
    """The new attempt's findings and signs of life, and where the old attempt's output ends, that a previous
    attempt of ``job_wait_resume`` heartbeated."""
    details = activity.info().heartbeat_details
    if not details or not isinstance(details[-1], dict):
        return [], [], None
    last = details[-1]
    findings: list[LogFinding] = []
    signs: list[ProgressSignal] = []
    boundary: dict[str, int] | None = None
    with contextlib.suppress(ValueError, TypeError):  # an older worker's shape: start afresh
        findings = [LogFinding.model_validate(f) for f in last.get("findings", [])]
        signs = [ProgressSignal(s) for s in last.get("signs", [])]
        raw = last.get("boundary")
        if isinstance(raw, dict):
            boundary = {str(path): int(offset) for path, offset in raw.items()}
    return findings[:MAX_SUCCESSOR_FINDINGS], signs, boundary


def _resume_offsets(initial_offsets: dict[str, int]) -> dict[str, int]:
    """Where the previous attempt of this activity stopped reading (its last heartbeat), or the input's offsets."""
    details = activity.info().heartbeat_details
    return WatchState.restore(details[-1] if details else None, initial_offsets).offsets
