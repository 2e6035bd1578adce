"""``rebound bench recovery``: break the lab's demo job for real and measure how Rebound recovers it.

Each run of a scenario: bring the lab up, submit the demo job with the opt-in comment (ClusterWatch starts its
JobRecovery workflow), wait until it trains past ``warmup_steps`` with a checkpoint saved, inject the fault with
a known ground truth, poll the workflow's ``status`` query until the incident resumed (or the workflow ended),
score it, then clean the lab for the next run.

Scenarios and their ground truth (the node to blame, and whether a restart is the right answer):

==============  =====================================================  ==========================  =======
scenario        fault                                                  blame                       restart
==============  =====================================================  ==========================  =======
``rank-crash``  ``crash`` (exit 13) of the first rank on the 2nd node  that rank's node            yes
``node-crash``  ``node-crash`` (kill) of the job's 2nd node            that node                   yes
``xid``         ``gpu-fault`` XID 79 on that rank's GPU                that node                   yes
``user-bug``    ``user-bug`` on every rank                             no node (the user's code)   no
==============  =====================================================  ==========================  =======

Measures (docs/architecture.md §5), from the workflow's first incident after the fault and the injector's
record: ``detection_s`` = detected_at - t0; ``action_s`` = restarted_at - detected_at (the last recovery action
verified); ``resume_s`` = resumed_at (the restarted job's first step line) - t0; ``lost_steps`` = the furthest
step rank 0 logged before the resuming attempt - the checkpoint step that attempt resumed from (rank 0's
``resumed from checkpoint ... (step N)`` line); ``false_actions`` = drains of any node but the blamed one (the
incidents' actions and ``sinfo``'s ``rebound: <job>-`` reasons), restarts when none is expected, and each
wrongly implicated node.

Everything above the orchestration section is pure, so scoring is unit-tested against hand-built objects.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from workers.bench.stats import summarize
from workflows.domain.incident import ActionKind, Incident
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState

if TYPE_CHECKING:
    from temporalio.client import Client

    from deploy.demo.common import RankInfo
    from deploy.demo.injections import InjectionRecord
    from deploy.local.lab import Lab
    from workers.settings import Settings

Scenario = Literal["rank-crash", "node-crash", "xid", "user-bug"]
SCENARIOS: tuple[Scenario, ...] = get_args(Scenario)
STAT_FIELDS = ("detection_s", "action_s", "resume_s", "lost_steps")
XID = 79


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ----- ground truth and scoring (pure) ----------------------------------------------------------------------------


class GroundTruth(_Model):
    """What a perfect Rebound does about an injected fault."""

    node: str | None
    """The node to blame (and drain); None: the user's code, no node is at fault."""
    restart: bool
    """Whether restarting the job is the right response."""


def ground_truth(scenario: Scenario, record: InjectionRecord) -> GroundTruth:
    """The truth of one injection.

    Raises:
        ValueError: a node fault whose record names no node.
    """
    if scenario == "user-bug":
        return GroundTruth(node=None, restart=False)
    if record.node is None:
        raise ValueError(f"{scenario} injection {record.id} recorded no node")
    return GroundTruth(node=record.node, restart=True)


def _drained_nodes(incidents: Iterable[Incident]) -> set[str]:
    return {a.target for i in incidents for a in i.actions if a.kind is ActionKind.DRAIN}


def _requeues(incidents: Iterable[Incident]) -> int:
    return sum(1 for i in incidents for a in i.actions if a.kind is ActionKind.REQUEUE)


def false_actions(
    truth: GroundTruth,
    incidents: Sequence[Incident],
    *,
    rebound_drains: Iterable[str] = (),
    restarts_observed: int = 0,
) -> list[str]:
    """Every false action, one description each.

    Counted: each drained node other than ``truth.node`` (from the incidents' drain actions and from
    ``rebound_drains``, the nodes ``sinfo`` shows drained with this job's ``rebound:`` reason, counted once per
    node); each restart when ``truth.restart`` is False (the larger of the requeue actions recorded and
    ``restarts_observed``, the job's own restart count since the fault); each node an attribution implicated that
    is not ``truth.node`` (once per node).
    """
    out = [
        f"drained healthy node {n}" for n in sorted((_drained_nodes(incidents) | set(rebound_drains)) - {truth.node})
    ]
    if not truth.restart:
        restarts = max(_requeues(incidents), restarts_observed)
        out += [f"restart {k} of a job no restart can help" for k in range(1, restarts + 1)]
    implicated = {n for i in incidents if i.attribution is not None for n in i.attribution.implicated_nodes}
    out += [f"implicated healthy node {n}" for n in sorted(implicated - {truth.node})]
    return out


def attribution_correct(truth: GroundTruth, incident: Incident | None) -> bool:
    """Whether the incident blamed exactly the truth: the node, or (user bug) no node and not retryable."""
    if incident is None or incident.attribution is None:
        return False
    att = incident.attribution
    if truth.node is None:
        return not att.implicated_nodes and not att.retryable
    return set(att.implicated_nodes) == {truth.node}


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    """``end - start`` in seconds (naive times are taken as UTC); None if either is missing."""
    if start is None or end is None:
        return None
    return round((_aware(end) - _aware(start)).total_seconds(), 3)


class Latencies(_Model):
    detection_s: float | None = None
    action_s: float | None = None
    resume_s: float | None = None


def latencies(t0: datetime, incidents: Sequence[Incident]) -> Latencies:
    """The §5 latencies of the incidents recorded after the fault (oldest first)."""
    if not incidents:
        return Latencies()
    first = incidents[0]
    resumed = next((i for i in incidents if i.resumed_at is not None), None)
    return Latencies(
        detection_s=seconds_between(t0, first.detected_at),
        action_s=seconds_between(first.detected_at, first.restarted_at),
        resume_s=seconds_between(t0, resumed.resumed_at) if resumed is not None else None,
    )


def detection_recorded_s(t0: datetime, status: JobRecoveryStatus, incident: Incident | None) -> float | None:
    """When the workflow itself recorded the incident (its DETECTED timeline entry) - t0.

    ``detected_at`` is the first observation (the log tailer's read, the node agent's NVML event); this is the
    durable record of it in the workflow, after the watch returned or the agent's signal arrived.
    """
    if incident is None:
        return None
    entry = next((e for e in status.timeline if e.event == "DETECTED" and e.incident == incident.number), None)
    return seconds_between(t0, entry.at) if entry is not None else None


def incidents_after(status: JobRecoveryStatus, before: Iterable[int]) -> list[Incident]:
    """The status's incidents whose numbers are not in ``before`` (those recorded before the fault)."""
    seen = set(before)
    return sorted((i for i in status.incidents if i.number not in seen), key=lambda i: i.number)


def is_done(truth: GroundTruth, status: JobRecoveryStatus, before: Iterable[int]) -> bool:
    """Whether a run has an outcome: an incident after the fault resumed, or the workflow ended."""
    return status.state.is_terminal() or any(i.resumed_at is not None for i in incidents_after(status, before))


def failure_reason(truth: GroundTruth, status: JobRecoveryStatus | None, before: Iterable[int]) -> str:
    """Why the run failed, or ``""``: a restartable fault must resume; a user bug must end the workflow GAVE_UP
    (or, wrongly, resume: that run completes and its restarts count as false actions)."""
    if status is None:
        return "no status from the workflow"
    after = incidents_after(status, before)
    if not after:
        return f"no incident recorded after the fault (state {status.state.value})"
    if any(i.resumed_at is not None for i in after):
        return ""
    if not truth.restart and status.state is RecoveryState.GAVE_UP:
        return ""
    outcome = "; ".join(f"{i.id}: {i.outcome or 'open'}" for i in after)
    if status.state.is_terminal():
        return f"workflow ended {status.state.value} without resuming ({outcome})"
    return f"not resumed in time: state {status.state.value} ({outcome})"


# ----- rank logs (pure) -------------------------------------------------------------------------------------------

_LINE = re.compile(r"^(?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) \[\w+\] rank=\d+/\d+ node=\S+ (?P<msg>.*)$")
_START = re.compile(r"^starting: job_id=\S+ restart=(?P<restart>\d+)")
_STEP = re.compile(r"^step=(?P<step>\d+) ")
_RESUMED = re.compile(r"^resumed from checkpoint \S+ \(step (?P<step>\d+)\)")
_NO_CHECKPOINT = "no checkpoint found"
_SAVED = re.compile(r"^saved checkpoint \S+ \(step (?P<step>\d+)")
_BATCH = re.compile(r"^(?P<at>\S+Z) \[INFO\] batch job_id=\S+ restart=(?P<restart>\d+) ")


class Attempt(_Model):
    """One attempt (Slurm restart) of a rank, as its log tells it."""

    restart: int
    started_at: datetime
    resumed_step: int | None = None
    """Checkpoint step loaded (0: started from scratch); None: no resume line (yet)."""
    first_step: int | None = None
    first_step_at: datetime | None = None
    last_step: int | None = None
    saved_steps: tuple[int, ...] = ()


@dataclass
class _Building:
    restart: int
    started_at: datetime
    resumed_step: int | None = None
    steps: list[tuple[int, datetime]] = field(default_factory=list)
    saved: list[int] = field(default_factory=list)

    def freeze(self) -> Attempt:
        first = self.steps[0] if self.steps else None
        return Attempt(
            restart=self.restart,
            started_at=self.started_at,
            resumed_step=self.resumed_step,
            first_step=first[0] if first else None,
            first_step_at=first[1] if first else None,
            last_step=max(s for s, _ in self.steps) if self.steps else None,
            saved_steps=tuple(self.saved),
        )


def parse_rank_log(lines: Iterable[str]) -> list[Attempt]:
    """The attempts in a demo rank log (every attempt appends to the same file), oldest first.

    Lines before the first ``starting:`` line, and lines that are not the trainer's (tracebacks, srun), are
    skipped.
    """
    attempts: list[_Building] = []
    for line in lines:
        m = _LINE.match(line.strip())
        if m is None:
            continue
        at, msg = datetime.fromisoformat(m["at"]), m["msg"]
        if start := _START.match(msg):
            attempts.append(_Building(restart=int(start["restart"]), started_at=at))
            continue
        if not attempts:
            continue
        current = attempts[-1]
        if step := _STEP.match(msg):
            current.steps.append((int(step["step"]), at))
        elif resumed := _RESUMED.match(msg):
            current.resumed_step = int(resumed["step"])
        elif msg.startswith(_NO_CHECKPOINT):
            current.resumed_step = 0
        elif saved := _SAVED.match(msg):
            current.saved.append(int(saved["step"]))
    return [a.freeze() for a in attempts]


def batch_starts(lines: Iterable[str]) -> dict[int, datetime]:
    """When the batch script of each attempt (restart count) started, from ``job-<id>-batch.log``."""
    out: dict[int, datetime] = {}
    for line in lines:
        m = _BATCH.match(line.strip())
        if m is not None:
            out.setdefault(int(m["restart"]), datetime.fromisoformat(m["at"]))
    return out


def resuming_attempt(attempts: Sequence[Attempt], failed_restart: int) -> Attempt | None:
    """The first attempt after ``failed_restart`` that trained a step."""
    return next((a for a in attempts if a.restart > failed_restart and a.first_step is not None), None)


class LostWork(_Model):
    last_step: int | None = None
    """The furthest step logged from the failed attempt up to the resuming one."""
    resumed_step: int | None = None
    lost_steps: int | None = None


def lost_work(attempts: Sequence[Attempt], failed_restart: int) -> LostWork:
    """Steps redone: the furthest step logged before the resuming attempt minus the checkpoint step it loaded."""
    resumed = resuming_attempt(attempts, failed_restart)
    upto = resumed.restart if resumed is not None else None
    before = [
        a.last_step
        for a in attempts
        if a.last_step is not None and a.restart >= failed_restart and (upto is None or a.restart < upto)
    ]
    last = max(before) if before else None
    start = resumed.resumed_step if resumed is not None else None
    lost = max(0, last - start) if last is not None and start is not None else None
    return LostWork(last_step=last, resumed_step=start, lost_steps=lost)


def resume_phases(
    t0: datetime, requeued_at: datetime | None, batch_started_at: datetime | None, resumed: Attempt | None
) -> dict[str, float | None]:
    """Where time to resume goes: fault to verified requeue, requeue to the batch script's start (Slurm's hold
    and scheduling), batch start to the ranks' start (srun, Python and torch imports), rank start to first step
    (rendezvous, checkpoint load, the step itself)."""
    started = resumed.started_at if resumed is not None else None
    first = resumed.first_step_at if resumed is not None else None
    return {
        "fault_to_requeued_s": seconds_between(t0, requeued_at),
        "requeued_to_batch_start_s": seconds_between(requeued_at, batch_started_at),
        "batch_start_to_ranks_start_s": seconds_between(batch_started_at, started),
        "ranks_start_to_first_step_s": seconds_between(started, first),
    }


# ----- Slurm output and targets (pure) ----------------------------------------------------------------------------


class NodeRow(_Model):
    node: str
    state: str
    reason: str = ""


def parse_sinfo_nodes(text: str) -> list[NodeRow]:
    """``sinfo -h -N -o '%N|%T|%E'``: one row per node (a node in several partitions appears once)."""
    rows: dict[str, NodeRow] = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) == 3 and parts[0]:
            reason = "" if parts[2] == "none" else parts[2]
            rows.setdefault(parts[0], NodeRow(node=parts[0], state=parts[1], reason=reason))
    return list(rows.values())


def rebound_drained(rows: Iterable[NodeRow], job_id: int) -> list[str]:
    """Nodes whose reason is Rebound's for one of this job's incidents (``rebound: <job>-<n> <cause>``)."""
    return sorted(r.node for r in rows if r.reason.startswith(f"rebound: {job_id}-"))


def pick_target(ranks: Sequence[RankInfo]) -> RankInfo:
    """The lowest rank on a node other than rank 0's (the batch host): rank 2 of a 2x2 job.

    Raises:
        ValueError: every rank runs on rank 0's node, or there is no rank 0.
    """
    by_rank = sorted(ranks, key=lambda r: r.rank)
    if not by_rank or by_rank[0].rank != 0:
        raise ValueError("no rank 0 among the live ranks")
    other = [r for r in by_rank if r.node != by_rank[0].node]
    if not other:
        raise ValueError(f"every rank runs on {by_rank[0].node}: the job needs two nodes")
    return other[0]


# ----- results (pure) ---------------------------------------------------------------------------------------------


class RunResult(_Model):
    """One run of one scenario: what was injected, what Rebound did, the measures."""

    scenario: Scenario
    index: int
    run: str
    job_id: int | None = None
    failed: bool
    error: str = ""
    injection_id: str = ""
    t0: datetime | None = None
    target_rank: int | None = None
    truth_node: str | None = None
    final_state: str = ""
    incidents: int = 0
    cause: str = ""
    implicated_nodes: tuple[str, ...] = ()
    attribution_correct: bool | None = None
    detection_s: float | None = None
    detection_recorded_s: float | None = None
    """The workflow's DETECTED entry - t0 (``detection_s`` uses the first observation)."""
    action_s: float | None = None
    resume_s: float | None = None
    last_step: int | None = None
    resumed_step: int | None = None
    lost_steps: int | None = None
    resumed_from: str = ""
    false_actions: int = 0
    false_action_details: tuple[str, ...] = ()
    phases: dict[str, float | None] = Field(default_factory=dict)
    wall_s: float = 0.0


def score_run(
    *,
    scenario: Scenario,
    index: int,
    run: str,
    record: InjectionRecord,
    status: JobRecoveryStatus | None,
    before: Iterable[int],
    rebound_drains: Iterable[str],
    rank0_log: Sequence[str],
    batch_log: Sequence[str],
    timed_out: bool,
    wall_s: float,
) -> RunResult:
    """Score one run from the injection record, the workflow's last status and what Slurm and the logs show."""
    before = set(before)
    truth = ground_truth(scenario, record)
    failed_restart = record.restart or 0
    incidents = incidents_after(status, before) if status is not None else []
    first = incidents[0] if incidents else None
    restarts = max(0, status.restart_count - failed_restart) if status is not None else 0
    wrong = false_actions(truth, incidents, rebound_drains=rebound_drains, restarts_observed=restarts)
    if status is not None:
        # Anything done before the fault was done to a healthy job.
        healthy = GroundTruth(node=None, restart=False)
        wrong += [f"before the fault: {w}" for w in false_actions(healthy, incidents_before(status, before))]
    reason = failure_reason(truth, status, before)
    if timed_out and reason:
        reason = f"timeout: {reason}"
    lat = latencies(record.t0, incidents)
    attempts = parse_rank_log(rank0_log)
    lost = lost_work(attempts, failed_restart) if truth.restart else LostWork()
    resumed = resuming_attempt(attempts, failed_restart) if truth.restart else None
    started = batch_starts(batch_log).get(resumed.restart) if resumed is not None else None
    resumed_inc = next((i for i in incidents if i.resumed_at is not None), None)
    att = first.attribution if first is not None else None
    return RunResult(
        scenario=scenario,
        index=index,
        run=run,
        job_id=record.job_id,
        failed=bool(reason),
        error=reason,
        injection_id=record.id,
        t0=record.t0,
        target_rank=record.rank,
        truth_node=truth.node,
        final_state=status.state.value if status is not None else "",
        incidents=len(incidents),
        cause=att.cause if att is not None else "",
        implicated_nodes=att.implicated_nodes if att is not None else (),
        attribution_correct=attribution_correct(truth, first),
        detection_s=lat.detection_s,
        detection_recorded_s=detection_recorded_s(record.t0, status, first) if status is not None else None,
        action_s=lat.action_s,
        resume_s=lat.resume_s,
        last_step=lost.last_step,
        resumed_step=lost.resumed_step,
        lost_steps=lost.lost_steps if resumed_inc is not None else None,
        resumed_from=resumed_inc.resumed_from if resumed_inc is not None else "",
        false_actions=len(wrong),
        false_action_details=tuple(wrong),
        phases=resume_phases(record.t0, first.restarted_at if first else None, started, resumed) if resumed else {},
        wall_s=round(wall_s, 1),
    )


def incidents_before(status: JobRecoveryStatus, before: Iterable[int]) -> list[Incident]:
    seen = set(before)
    return [i for i in status.incidents if i.number in seen]


def scenario_summary(runs: Sequence[RunResult]) -> dict[str, Any]:
    """The JSON of one scenario: statistics over successful runs; false actions over every run."""
    ok = [r for r in runs if not r.failed]
    out: dict[str, Any] = {"runs": len(runs)}
    for name in STAT_FIELDS:
        stats = summarize(getattr(r, name) for r in ok)
        out[name] = stats.model_dump() if stats is not None else None
    out["false_actions"] = sum(r.false_actions for r in runs)
    out["failed_runs"] = len(runs) - len(ok)
    return out


def bench_report(runs: Sequence[RunResult], scenarios: Sequence[Scenario]) -> dict[str, Any]:
    """``{"scenarios": {name: summary}, "runs": [raw results]}``, scenarios in the order asked."""
    return {
        "scenarios": {s: scenario_summary([r for r in runs if r.scenario == s]) for s in scenarios},
        "runs": [r.model_dump(mode="json") for r in runs],
    }


def _cell(stats: dict[str, float] | None, digits: int) -> str:
    if stats is None:
        return "-"
    return "/".join(f"{stats[k]:.{digits}f}" for k in ("mean", "p50", "p95"))


def format_table(report: dict[str, Any]) -> str:
    """A plain aligned text table, one row per scenario; latency cells are ``mean/p50/p95``."""
    header = [
        "scenario",
        "runs",
        "failed",
        "attributed",
        "detection s",
        "action s",
        "resume s",
        "lost steps",
        "false actions",
    ]
    rows = [header, ["", "", "", "", "mean/p50/p95", "mean/p50/p95", "mean/p50/p95", "mean/p50/p95", ""]]
    runs = report.get("runs", [])
    for name, s in report["scenarios"].items():
        mine = [r for r in runs if r["scenario"] == name]
        right = sum(1 for r in mine if r.get("attribution_correct"))
        rows.append(
            [
                name,
                str(s["runs"]),
                str(s["failed_runs"]),
                f"{right}/{len(mine)}",
                _cell(s["detection_s"], 2),
                _cell(s["action_s"], 2),
                _cell(s["resume_s"], 1),
                _cell(s["lost_steps"], 1),
                str(s["false_actions"]),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def parse_scenarios(text: str | None) -> tuple[Scenario, ...]:
    """``"xid,user-bug"`` -> those scenarios in that order; None or ``"all"``: every scenario.

    Raises:
        ValueError: an unknown name.
    """
    if text is None or text.strip().lower() == "all":
        return SCENARIOS
    out: list[Scenario] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = next((s for s in SCENARIOS if s == part), None)
        if match is None:
            raise ValueError(f"unknown scenario {part!r}: choose from {', '.join(SCENARIOS)}")
        if match not in out:
            out.append(match)
    if not out:
        raise ValueError("no scenario given")
    return tuple(out)


# ----- orchestration (I/O) ----------------------------------------------------------------------------------------


class BenchOptions(_Model):
    scenarios: tuple[Scenario, ...] = SCENARIOS
    repeat: int = Field(3, ge=1, le=100)
    run_timeout_s: float = Field(180.0, gt=0)
    """From the injection to the outcome (resumed, or the workflow ended)."""
    warmup_steps: int = Field(30, ge=1)
    """Inject only once rank 0 logged this step and saved a checkpoint."""
    setup_timeout_s: float = Field(120.0, gt=0)
    """For each wait before the fault: monitored, training, and the lab clean again after a run."""
    poll_s: float = Field(1.0, gt=0)


class BenchError(RuntimeError):
    """A run could not be set up or measured; the message says which step and why."""


@dataclass
class _Ctx:
    lab: Lab
    client: Client
    settings: Settings
    opts: BenchOptions


def _say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _slurm(ctx: _Ctx, *argv: str, timeout: float = 15.0) -> str:
    from deploy.local.processes import run

    return run(list(argv), env=ctx.lab.slurm.env(), timeout=timeout)


def _nodes(ctx: _Ctx) -> list[NodeRow]:
    return parse_sinfo_nodes(_slurm(ctx, "sinfo", "-h", "-N", "-o", "%N|%T|%E"))


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def _job_state(ctx: _Ctx, job_id: int) -> str:
    """squeue's state of the job; ``""`` once Slurm no longer lists it."""
    from deploy.local.processes import LabError

    try:
        out = _slurm(ctx, "squeue", "-h", "-j", str(job_id), "-o", "%T").strip()
    except LabError:
        return ""  # "Invalid job id specified": gone
    return out.split()[0] if out else ""


async def _status(ctx: _Ctx, job_id: int) -> JobRecoveryStatus | None:
    """The workflow's status; None while it does not exist yet or does not answer (polling tries again)."""
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError

    from workers.jobs_cli import query_status
    from workflows.domain.errors import ReboundError

    try:
        return await query_status(ctx.client, ctx.settings, job_id)
    except (ReboundError, RPCError, WorkflowQueryFailedError) as e:
        if not isinstance(e, ReboundError):
            _say(f"status query of job {job_id} failed: {e}")
        return None


async def _until(what: str, timeout_s: float, poll_s: float, check: Callable[[], Awaitable[object]]) -> None:
    """Poll the async ``check`` until it returns something truthy.

    Raises:
        BenchError: not within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if await check():
            return
        if time.monotonic() >= deadline:
            raise BenchError(f"{what}: not within {timeout_s:.0f} s")
        await asyncio.sleep(poll_s)


async def prepare_lab(ctx: _Ctx, *, crashed_node: str | None = None) -> None:
    """Lab up (restarts a crashed node's slurmd), Rebound's drains resumed, every node idle."""
    await asyncio.to_thread(ctx.lab.up, log=False)
    _resume_nodes(ctx, crashed_node)

    async def idle() -> bool:
        rows = _nodes(ctx)
        return {r.node for r in rows if r.state == "idle"} >= set(ctx.lab.cfg.node_names)

    try:
        await _until("every lab node idle", ctx.opts.setup_timeout_s, ctx.opts.poll_s, idle)
    except BenchError as e:
        states = ", ".join(f"{r.node}={r.state}{' (' + r.reason + ')' if r.reason else ''}" for r in _nodes(ctx))
        raise BenchError(f"{e}: {states}") from None


def _resume_nodes(ctx: _Ctx, crashed_node: str | None) -> None:
    from deploy.local.processes import LabError

    for row in _nodes(ctx):
        if row.reason.startswith("rebound:") or (row.node == crashed_node and row.state != "idle"):
            try:
                _slurm(ctx, "scontrol", "update", f"nodename={row.node}", "state=resume")
                _say(f"resumed {row.node} (was {row.state}: {row.reason or '-'})")
            except LabError as e:
                _say(f"could not resume {row.node}: {e}")


async def _wait_training(ctx: _Ctx, run_dir: Path, job_id: int) -> None:
    log = run_dir / "logs" / f"job-{job_id}-rank-0.log"

    async def trained() -> bool:
        state = _job_state(ctx, job_id)
        if state not in ("PENDING", "CONFIGURING", "RUNNING"):
            raise BenchError(f"job {job_id} is {state or 'gone'} before the fault; see {run_dir}/logs")
        attempts = parse_rank_log(_read_lines(log))
        first = attempts[0] if attempts else None
        return bool(first and first.saved_steps and (first.last_step or 0) >= ctx.opts.warmup_steps)

    await _until(f"job {job_id} trained {ctx.opts.warmup_steps} steps", ctx.opts.setup_timeout_s, 0.5, trained)


def _inject(ctx: _Ctx, scenario: Scenario, run: str) -> InjectionRecord:
    from deploy.demo.inject import inject
    from deploy.demo.injections import live_ranks

    layout = ctx.lab.cfg.layout
    target = pick_target(live_ranks(layout, run))
    if scenario == "rank-crash":
        return inject(layout, "crash", run=run, rank=target.rank)
    if scenario == "xid":
        return inject(layout, "gpu-fault", run=run, rank=target.rank, xid=XID)
    if scenario == "node-crash":
        return inject(layout, "node-crash", run=run, node=target.node)
    return inject(layout, "user-bug", run=run, rank="all")


async def _wait_outcome(
    ctx: _Ctx, job_id: int, truth: GroundTruth, before: set[int]
) -> tuple[JobRecoveryStatus | None, bool]:
    """Poll the workflow until the run has an outcome; returns the last status and whether time ran out."""
    deadline = time.monotonic() + ctx.opts.run_timeout_s
    last: JobRecoveryStatus | None = None
    while time.monotonic() < deadline:
        status = await _status(ctx, job_id)
        if status is not None:
            last = status
            if is_done(truth, status, before):
                return status, False
        await asyncio.sleep(ctx.opts.poll_s)
    return last, True


async def _cleanup(ctx: _Ctx, job_id: int | None, scenario: Scenario, record: InjectionRecord | None) -> None:
    """Stop the workflow (so it does not treat the cancel as a failure), cancel the job, repair what the
    fault broke (the GPU state), and leave every node idle."""
    from temporalio.service import RPCError

    from deploy.local.processes import LabError
    from workflows.constants import job_workflow_id

    if job_id is not None:
        handle = ctx.client.get_workflow_handle(job_workflow_id(ctx.settings.cluster_name, job_id))
        with contextlib.suppress(RPCError):  # already closed: user-bug ends GAVE_UP
            await handle.terminate(reason="rebound bench: run measured")
        try:
            _slurm(ctx, "scancel", str(job_id))
        except LabError as e:
            _say(f"scancel {job_id}: {e}")

        async def gone() -> bool:
            return _job_state(ctx, job_id) in ("", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL")

        await _until(f"job {job_id} gone", 60.0, 0.5, gone)
    node = record.node if record is not None else None
    if scenario == "xid" and node is not None:
        ctx.lab.rebound.reset_gpus(node)
    await prepare_lab(ctx, crashed_node=node if scenario == "node-crash" else None)


async def run_one(ctx: _Ctx, scenario: Scenario, index: int, stamp: str) -> RunResult:
    """One measured run, the lab cleaned after it whatever happened."""
    from deploy.demo.injections import InjectionError
    from deploy.demo.submit import SubmitError, submit_demo
    from deploy.local.processes import LabError

    run = f"bench-{scenario}-{stamp}-{index}"
    layout = ctx.lab.cfg.layout
    started = time.monotonic()
    job_id: int | None = None
    record: InjectionRecord | None = None
    try:
        await prepare_lab(ctx)
        job_id = jid = submit_demo(layout, run, steps=100_000, env=ctx.lab.slurm.env(), opt_in=True)
        _say(f"{scenario} #{index}: submitted job {jid} (run {run})")

        async def monitored() -> bool:
            return await _status(ctx, jid) is not None

        await _until(f"job {jid}'s JobRecovery workflow", ctx.opts.setup_timeout_s, 0.5, monitored)
        await _wait_training(ctx, layout.run_dir(run), jid)
        pre = await _status(ctx, jid)
        before = {i.number for i in pre.incidents} if pre is not None else set()
        record = await asyncio.to_thread(_inject, ctx, scenario, run)
        truth = ground_truth(scenario, record)
        where = f"rank {record.rank} " if record.rank is not None else ""
        _say(
            f"{scenario} #{index}: injected {record.kind} {where}on {record.node or 'every node'} at {record.t0:%T.%f}"
        )
        status, timed_out = await _wait_outcome(ctx, jid, truth, before)
        logs = layout.run_dir(run) / "logs"
        result = score_run(
            scenario=scenario,
            index=index,
            run=run,
            record=record,
            status=status,
            before=before,
            rebound_drains=rebound_drained(_nodes(ctx), jid),
            rank0_log=_read_lines(logs / f"job-{jid}-rank-0.log"),
            batch_log=_read_lines(logs / f"job-{jid}-batch.log"),
            timed_out=timed_out,
            wall_s=time.monotonic() - started,
        )
    except (BenchError, InjectionError, SubmitError, LabError, ValueError) as e:
        result = RunResult(
            scenario=scenario,
            index=index,
            run=run,
            job_id=job_id,
            failed=True,
            error=f"{type(e).__name__}: {e}",
            wall_s=round(time.monotonic() - started, 1),
        )
    _say(_describe(result))
    try:
        await _cleanup(ctx, job_id, scenario, record)
    except (BenchError, LabError) as e:
        _say(f"{scenario} #{index}: cleaning the lab failed: {e}")
    return result


def _describe(r: RunResult) -> str:
    head = f"{r.scenario} #{r.index}: job {r.job_id}"
    if r.failed and r.t0 is None:
        return f"{head} FAILED before the fault: {r.error}"
    verdict = f"FAILED ({r.error})" if r.failed else "ok"
    return (
        f"{head} {verdict}: {r.cause or '-'} nodes={','.join(r.implicated_nodes) or '-'} (truth {r.truth_node or '-'}) "
        f"detection={r.detection_s}s action={r.action_s}s resume={r.resume_s}s lost={r.lost_steps} "
        f"false={r.false_actions}{' ' + '; '.join(r.false_action_details) if r.false_action_details else ''}"
    )


async def run_benchmark(lab: Lab, settings: Settings, opts: BenchOptions) -> list[RunResult]:
    """Every scenario ``opts.repeat`` times, scenario after scenario."""
    from workers.client import connect

    ctx = _Ctx(lab=lab, client=await connect(settings.temporal), settings=settings, opts=opts)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: list[RunResult] = []
    for scenario in opts.scenarios:
        for index in range(1, opts.repeat + 1):
            results.append(await run_one(ctx, scenario, index, stamp))
    return results


def run_bench_command(args: argparse.Namespace) -> int:
    """``rebound bench recovery``: run, print the table, write the JSON; exit 1 when a run failed."""
    from deploy.local.config import LabConfig
    from deploy.local.demo_cmd import lab_settings
    from deploy.local.lab import Lab

    try:
        opts = BenchOptions(
            scenarios=parse_scenarios(args.scenarios),
            repeat=args.repeat,
            run_timeout_s=args.timeout,
            warmup_steps=args.warmup_steps,
        )
    except ValueError as e:  # pydantic's ValidationError is one
        print(f"rebound bench recovery: {e}", file=sys.stderr)
        return 2
    lab = Lab(LabConfig())
    started = time.monotonic()
    runs = asyncio.run(run_benchmark(lab, lab_settings(lab), opts))
    report = bench_report(runs, opts.scenarios)
    print(format_table(report))
    print(f"\n{len(runs)} runs in {time.monotonic() - started:.0f} s")
    if args.json is not None:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}")
    return 1 if any(r.failed for r in runs) else 0
