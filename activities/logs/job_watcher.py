"""One job's watch between polls: the body of the per-job ``job_watch`` activity and of the shard hub's members.

A ``JobWatcher`` holds what one watch learns (log offsets, polls, the nodes seen, the ranks' progress) and, given a
scheduler snapshot, polls the job once: read the rank logs' new lines, fold the step lines into the progress
state, and ask ``workflows.policy.watch.decide_poll`` whether to return. Both the long per-job activity
(``activities.logs.watch``, kept for recorded histories) and the watch hub (``activities.logs.watch_hub``) drive
this one class, so the two paths cannot drift apart.

The state it heartbeats (``details``) is taken at one instant: the offsets and the progress agree, so a watcher
restored from it re-reads exactly the lines the progress has not folded yet; a line is never counted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from activities.logs.crash import scan, to_findings
from activities.logs.heartbeat import heartbeat_times
from activities.logs.job_logs import LogPolicy, log_patterns
from activities.logs.line import Line, LogLine
from activities.logs.peek import Peek, directory_times, watched_directories
from activities.logs.signatures import lines_may_match
from activities.logs.step_line import line_body, step_fields
from activities.logs.tail import WAIT_PREFIX, LogTail, positions
from workflows.domain.bounds import DEFAULT_MAX_BYTES_PER_FILE
from workflows.domain.loop import JobWatchInput, JobWatchResult
from workflows.domain.progress import ProgressState, Sample, aware, note_activity, observe
from workflows.domain.slurm import ClusterSnapshot, SlurmJob
from workflows.policy.attribution import block_rank_layout
from workflows.policy.watch import WatchAction, WatchDecision, WatchFacts, decide_poll

__all__ = ["QUIET", "JobWatcher", "PollStep", "WatchState", "progress_samples", "suspect_lines", "unresponsive"]

#: A job's log patterns are globbed again at most this often (and whenever its attempt, nodes or state change):
#: a file that appears meanwhile is read from its start a poll or two later, no line lost.
GLOB_EVERY_S = 2.0

_NODE_TOKEN = re.compile(r"(?<![\w.])node=([A-Za-z0-9][\w.-]{0,63})")

#: A fresh scheduler snapshot, taken now (the shared cache's ``get(max_age_s=0)``).
FreshSnapshot = Callable[[], Awaitable[ClusterSnapshot]]


def progress_samples(
    lines: Sequence[LogLine | Line],
    read_at: datetime,
    layout: dict[int, str],
    seen_at: Callable[[str, int], datetime | None] | None = None,
) -> list[Sample]:
    """The step lines among ``lines``, as progress samples: rank from the file or line, node from the file name's
    ``%N``, a ``node=`` token, or the job's block layout; lines without their own time are stamped when they were
    first seen (``seen_at(path, offset)``: a quiet poll's look, ``activities.logs.peek``), else ``read_at``.

    Lines that name no rank count as rank 0's: a job whose only log is rank 0's stdout still shows progress
    (its hang window is then rank 0's; stragglers need per-rank lines). The values hold what ``ProgressSample``
    checks (``step_line`` reads digits, and times within bounds), so they go to ``observe`` as plain ``Sample`` s.
    """
    read_at = aware(read_at)
    samples = []
    for line in lines:
        mark = step_fields(line.prefix.body if isinstance(line, Line) else line_body(line.text))
        if mark is None:
            continue
        rank = line.rank if line.rank is not None else 0
        token = _NODE_TOKEN.search(line.text) if not line.node else None
        node = line.node or (token.group(1) if token else "") or layout.get(rank, "")
        at = line.at or (seen_at(line.path, line.offset) if seen_at is not None else None) or read_at
        samples.append(Sample(rank, node, mark.step, at, mark.step_time_s, mark.compute_time_s, mark.epoch))
    return samples


def suspect_lines(lines: Sequence[Line]) -> list[Line]:
    """The lines of every file whose new lines could hold a failure (``signatures.lines_may_match``), in order: the
    crash reader's context (a traceback's code line, an ignored exception, the checkpoint a rank loaded) is kept per
    file, so a file none of whose lines can match gives it nothing to find and nothing to carry to another file.
    Most polls of a training job hold only progress: the scan is skipped for them."""
    kept: list[Line] = []
    start = 0
    for end in range(1, len(lines) + 1):
        if end == len(lines) or lines[end].path != lines[start].path:
            group = lines[start:end]
            if lines_may_match("\n".join(line.text for line in group)):
                kept.extend(group)
            start = end
    return kept


def unresponsive(snapshot: ClusterSnapshot, nodes: Sequence[str]) -> list[str]:
    """The given nodes the scheduler shows DOWN or NOT_RESPONDING."""
    bad = []
    for name in nodes:
        node = snapshot.node(name)
        if node is not None and (not node.is_responding or node.state.value == "down"):
            bad.append(name)
    return bad


@dataclass
class WatchState:
    """What a watch learned so far: where each file was read to, how many polls, the nodes, the progress."""

    offsets: dict[str, int]
    polls: int = 0
    nodes: list[str] = field(default_factory=list)
    progress: ProgressState | None = None

    def details(self) -> dict[str, Any]:
        """The heartbeat shape (``restore`` reads it back; the old activity's recorded details have it too)."""
        out: dict[str, Any] = {"offsets": self.offsets, "polls": self.polls, "nodes": self.nodes}
        if self.progress is not None:
            out["progress"] = self.progress.model_dump(mode="json")
        return out

    @classmethod
    def restore(cls, last: object, initial_offsets: dict[str, int]) -> WatchState:
        """The state a previous attempt heartbeated (``details``), or a fresh one at ``initial_offsets``."""
        if isinstance(last, dict) and isinstance(last.get("offsets"), dict):
            progress = None
            if isinstance(last.get("progress"), dict):
                with contextlib.suppress(ValueError):  # an older worker's shape: learn the timing afresh
                    progress = ProgressState.model_validate(last["progress"])
            return cls(
                offsets={str(k): int(v) for k, v in last["offsets"].items()},
                polls=int(last.get("polls", 0)),
                nodes=[str(n) for n in last.get("nodes", [])],
                progress=progress,
            )
        return cls(offsets=dict(initial_offsets))


@dataclass(frozen=True)
class PollStep:
    """One poll's reading before any further scheduler call: the facts and the policy's decision on them; a quiet
    poll (``QUIET``: nothing that cannot wait until the next full poll) has no facts."""

    facts: WatchFacts | None
    decision: WatchDecision


#: A quiet poll's step: keep watching, nothing read into the job's state (``activities.logs.peek``).
QUIET = PollStep(facts=None, decision=WatchDecision(action=WatchAction.KEEP_WATCHING))


class JobWatcher:
    """Polls one job: its scheduler entry, its rank logs, its progress (see the module docstring)."""

    def __init__(
        self,
        inp: JobWatchInput,
        logs: LogPolicy,
        state: WatchState,
        started: datetime,
        clock: Callable[[], float] = time.monotonic,
        full_poll_every_s: float = 0.0,
    ) -> None:
        """``full_poll_every_s``: between full polls this far apart, a poll is quiet unless the job's scheduler
        record changed or its files gained something that cannot wait (``activities.logs.peek``); 0: every poll
        is a full one (the per-job ``job_watch`` activity)."""
        self.inp = inp
        self.state = state
        self.started = started
        """When this watch began: ``sample_after_s`` counts from here."""
        self._logs = logs
        if state.progress is None:
            state.progress = inp.progress or ProgressState()
        # The tail kept across polls while the job's files stay the same set (its attempt, nodes, owner): its
        # patterns are globbed only every ``GLOB_EVERY_S``; the known files are looked at every poll.
        self._tail: LogTail | None = None
        self._tail_key: tuple[object, ...] = ()
        self._globbed_at = 0.0
        self._clock = clock
        self._kept: ProgressState | None = None
        self._heartbeat_overran: dict[str, str] = {}
        """Heartbeat patterns whose walk ran out of entries: globbed every poll, so remembered here, never again."""
        self._full_every_s = full_poll_every_s
        self._peek: Peek | None = None
        """Armed by a full poll that may be followed by quiet ones; None: the next poll is a full one."""
        self._peek_key: tuple[object, ...] = ()
        self._full_at = 0.0

    def read(self, snap: ClusterSnapshot, now: datetime | None = None) -> PollStep:
        """Read the job's new log lines against ``snap`` and decide (blocking file I/O: run it off the loop); or,
        between full polls, only look for what cannot wait (``QUIET`` when nothing did)."""
        inp, st = self.inp, self.state
        job = snap.job(inp.job_id)
        if job is not None and job.nodes:
            st.nodes = list(job.nodes)
        down = tuple(unresponsive(snap, st.nodes))
        if self._quiet(job, down, now):
            st.polls += 1
            return QUIET
        # A quiet poll's look that found a file added or removed asks for this glob at once.
        tail, rescan = self._tail_for(job, glob_now=self._peek is not None and self._peek.directory_changed)
        seen = self._peek.seen_at if self._peek is not None else None
        # Taken before the glob: a file created while this poll reads changes them after, so the next look sees it.
        directories = (
            directory_times(watched_directories(tail.patterns, tail.read_identities)) if self._full_every_s > 0 else {}
        )
        lines, st.offsets = tail.read_lines(st.offsets, rescan=rescan)
        self._logs.report(inp.job_id, tail)
        now = now or datetime.now(UTC)
        progress = self._track(job, st.progress or ProgressState(), lines, now, seen)
        st.polls += 1
        st.progress = progress
        self._arm(tail, job, down, directories)
        facts = WatchFacts(
            now=now,
            job=job,
            findings=tuple(to_findings(scan(suspect_lines(lines)))),
            unresponsive_nodes=down,
            progress=progress,
            last_state=inp.last_state,
            last_restart_count=inp.last_restart_count,
            hang=inp.hang,
            stragglers=inp.stragglers,
            straggler_action=inp.straggler_action,
            reported_straggler_nodes=inp.reported_straggler_nodes,
            sample_due=inp.sample_after_s is not None and (now - self.started).total_seconds() >= inp.sample_after_s,
            progress_unchanged=progress is self._kept,
        )
        return PollStep(facts=facts, decision=decide_poll(facts))

    def _quiet(self, job: SlurmJob | None, down: tuple[str, ...], now: datetime | None) -> bool:
        """Whether this poll may be a quiet one: a peek is armed, its full poll is recent, the scheduler record and
        the unresponsive nodes are as then, and the files gained nothing that cannot wait."""
        peek = self._peek
        if (
            peek is None
            or self._clock() - self._full_at >= self._full_every_s
            or self._key(job, down) != self._peek_key
        ):
            return False
        return peek.look(now or datetime.now(UTC)) is None

    def _arm(
        self, tail: LogTail, job: SlurmJob | None, down: tuple[str, ...], directories: dict[str, int | None]
    ) -> None:
        """After a full poll: quiet polls may follow, unless some file's data waits for a later call's budget.
        ``directories``: their mtimes before the poll globbed; a directory only this poll's files are in is
        looked at now."""
        offsets = self.state.offsets
        if self._full_every_s <= 0 or any(k.startswith(WAIT_PREFIX) for k in offsets):
            self._peek = None
            return
        new = watched_directories(tail.patterns, tail.read_identities) - directories.keys()
        directories = {**directories, **directory_times(new)}
        self._peek = Peek(positions(offsets), tail.read_identities, DEFAULT_MAX_BYTES_PER_FILE, directories)
        self._peek_key = self._key(job, down)
        self._full_at = self._clock()

    @staticmethod
    def _key(job: SlurmJob | None, down: tuple[str, ...]) -> tuple[object, ...]:
        """What of the scheduler's record makes a poll a full one when it changes (it changes the tail's files, or
        it is what the policy decides on)."""
        if job is None:
            return (None, down)
        return (job.state, job.restart_count, job.start_time, job.nodes, job.user_id, job.standard_output, down)

    def _tail_for(self, job: SlurmJob | None, glob_now: bool = False) -> tuple[LogTail, bool]:
        """The job's tail, and whether to glob its patterns again: a new attempt, node set, state or owner makes a
        new tail (new files appear then), else every ``GLOB_EVERY_S`` or when ``glob_now``."""
        key = (
            (job.state, job.restart_count, job.start_time, job.nodes, job.user_id, job.standard_output)
            if job is not None
            else None,
        )
        clock = self._clock()
        if self._tail is None or key != self._tail_key:
            patterns = log_patterns(self.inp.log_patterns, job, self.inp.job_id)
            self._tail, self._tail_key, self._globbed_at = self._logs.tail(patterns, job, self.inp.job_id), key, clock
            return self._tail, True
        if glob_now or clock - self._globbed_at >= GLOB_EVERY_S:
            self._globbed_at = clock
            return self._tail, True
        return self._tail, False

    def settle(self, step: PollStep, fresh: ClusterSnapshot | None = None) -> JobWatchResult | None:
        """The poll's answer: a result to hand back, or None to poll again. ``fresh`` is the snapshot asked for
        when the decision was ``REFRESH_SCHEDULER`` (only victims' lines: did someone requeue or cancel it?)."""
        facts, decision = step.facts, step.decision
        if facts is None:  # a quiet poll: nothing was read into the state
            return None
        if decision.action is WatchAction.REFRESH_SCHEDULER and fresh is not None:
            facts = facts.model_copy(
                update={
                    "job": fresh.job(self.inp.job_id),
                    "scheduler_fresh": True,
                    "unresponsive_nodes": tuple(unresponsive(fresh, self.state.nodes)),
                }
            )
            decision = decide_poll(facts)
        if decision.action is WatchAction.RETURN and decision.outcome is not None:
            return JobWatchResult(
                outcome=decision.outcome,
                observed_at=facts.now,
                job=facts.job,
                anomaly=decision.anomaly,
                findings=decision.findings,
                offsets=self.state.offsets,
                polls=self.state.polls,
                progress=decision.progress,
                hang=decision.hang,
                stragglers=decision.stragglers,
            )
        self.state.progress = decision.progress or self.state.progress
        self._kept = decision.progress if decision.action is WatchAction.KEEP_WATCHING else None
        return None

    async def poll(self, snap: ClusterSnapshot, fresh: FreshSnapshot) -> JobWatchResult | None:
        """One whole poll: ``read`` off the event loop, a fresh snapshot when the policy asks for one, ``settle``."""
        step = await asyncio.to_thread(self.read, snap)
        again = await fresh() if step.decision.action is WatchAction.REFRESH_SCHEDULER else None
        return self.settle(step, again)

    def _track(
        self,
        job: SlurmJob | None,
        progress: ProgressState,
        lines: Sequence[Line],
        now: datetime,
        seen: Callable[[str, int], datetime | None] | None = None,
    ) -> ProgressState:
        """Fold this poll's step lines and heartbeat files into the job's progress state."""
        inp = self.inp
        task_count = job.task_count if job is not None else 0
        layout = block_rank_layout(self.state.nodes, task_count)
        progress = observe(progress, progress_samples(lines, now, layout, seen), now)
        if inp.heartbeat_patterns:
            beats = heartbeat_times(
                inp.heartbeat_patterns,
                inp.job_id,
                self._logs.access(job),
                job,
                glob_entries=self._logs.glob_entries,
                max_files=self._logs.max_files,
                overran=self._heartbeat_overran,
            )
            for rank, at in beats.items():
                progress = note_activity(progress, rank, at)
        return progress
