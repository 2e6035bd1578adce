"""Scoring of one ``rebound bench recovery`` run (pure), from the workflow's status and the injector's record.

Measures (docs/architecture.md §5), from the workflow's first incident after the fault and the injector's
record: ``detection_s`` = detected_at - t0; ``action_s`` = restarted_at - detected_at (the last recovery action
verified); ``resume_s`` = resumed_at (the restarted job's first step line) - t0; ``lost_steps`` = the furthest
step rank 0 logged before the resuming attempt - the checkpoint step that attempt resumed from (rank 0's
``resumed from checkpoint ... (step N)`` line); ``false_actions`` = drains of any node but the blamed one (the
incidents' actions and ``sinfo``'s ``rebound: <job>-`` reasons), restarts when none is expected, and each
wrongly implicated node.

Everything here is pure, so scoring is unit-tested against hand-built objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import Field

from deploy.bench.labparse import Attempt, batch_starts, parse_rank_log, resuming_attempt
from deploy.bench.scenarios import GroundTruth, Scenario, ground_truth
from workflows.domain.base import Frozen
from workflows.domain.incident import ActionKind, Incident
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState

if TYPE_CHECKING:
    from deploy.demo.injections import InjectionRecord

# ----- incidents against the ground truth -------------------------------------------------------------------------


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

    Counted: each drained node other than ``truth.node``, and ``truth.node`` itself when ``truth.drain`` is False
    (from the incidents' drain actions and from
    ``rebound_drains``, the nodes ``sinfo`` shows drained with this job's ``rebound:`` reason, counted once per
    node); each restart when ``truth.restart`` is False (the larger of the requeue actions recorded and
    ``restarts_observed``, the job's own restart count since the fault); each node an attribution implicated that
    is not ``truth.node`` (once per node).
    """
    drained = _drained_nodes(incidents) | set(rebound_drains)
    out = [f"drained healthy node {n}" for n in sorted(drained - {truth.node})]
    if truth.node in drained and not truth.drain:
        out.append(f"drained {truth.node} for everyone on the job's word alone (no node-level evidence)")
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


class Latencies(Frozen):
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


def incidents_before(status: JobRecoveryStatus, before: Iterable[int]) -> list[Incident]:
    """The status's incidents whose numbers are in ``before`` (those recorded before the fault)."""
    seen = set(before)
    return [i for i in status.incidents if i.number in seen]


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


# ----- lost work and where time to resume goes --------------------------------------------------------------------


class LostWork(Frozen):
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


# ----- one run ----------------------------------------------------------------------------------------------------


class RunResult(Frozen):
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
