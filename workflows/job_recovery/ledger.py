"""The incident ledger: a job's incidents, their actions and its timeline, as pure functions over its status.

Each function returns a new ``JobRecoveryStatus``; the workflow keeps the latest and never edits one in place.
Incidents are addressed by number and always read back from the status, so an update made by a signal handler
meanwhile (a late drain an operator approved) is never overwritten by an older copy. Times are passed in
(``workflow.now()`` in the workflow), so everything here is deterministic and testable without Temporal.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from workflows.constants import incident_id
from workflows.domain.fleet import IsolationDecision
from workflows.domain.hang import HangVerdict
from workflows.domain.incident import ActionKind, ActionRecord, Anomaly, Attribution, Incident, TimelineEntry
from workflows.domain.procs import RankProcess, RankStack
from workflows.domain.recovery import MAX_CARRIED_INCIDENTS, MAX_TIMELINE, JobRecoveryStatus, RecoveryState
from workflows.domain.resume_point import RestartCheckpoint, ResumePoint
from workflows.domain.slurm import JobState, SlurmJob
from workflows.domain.straggler import StragglerVerdict

__all__ = [
    "add_action",
    "add_hang_evidence",
    "carry",
    "details_markdown",
    "incident",
    "mark_restarted",
    "mark_resumed",
    "next_number",
    "observe_job",
    "open_incident",
    "record",
    "record_decision",
    "replace_action",
    "set_attribution",
    "set_checkpoint",
    "set_outcome",
    "set_state",
]

#: Timeline rows the Temporal UI's current details show (the newest).
DETAILS_ROWS = 25


def incident(status: JobRecoveryStatus, number: int) -> Incident:
    """The ledger's current copy of incident ``number``."""
    return next(i for i in status.incidents if i.number == number)


def next_number(status: JobRecoveryStatus) -> int:
    """The next incident's number: numbers go on across continue-as-new, which carries only the newest ones."""
    done = status.incidents
    carried_offset = (done[0].number - 1) if done else 0
    return len(done) + 1 + carried_offset


def open_incident(
    status: JobRecoveryStatus,
    *,
    anomaly: Anomaly,
    hang: HangVerdict | None = None,
    stragglers: StragglerVerdict | None = None,
    attribution: Attribution | None = None,
    outcome: str = "",
) -> tuple[JobRecoveryStatus, int]:
    """A new incident for ``anomaly``, detected when it was observed; returns the status and its number."""
    number = next_number(status)
    new = Incident(
        number=number,
        id=incident_id(status.job_id, number),
        detected_at=anomaly.observed_at,
        anomaly=anomaly,
        attribution=attribution,
        hang=hang,
        stragglers=stragglers,
        outcome=outcome,
    )
    return _put(status, new), number


def set_attribution(status: JobRecoveryStatus, number: int, attribution: Attribution) -> JobRecoveryStatus:
    return _update(status, number, attribution=attribution)


def set_checkpoint(
    status: JobRecoveryStatus,
    number: int,
    checkpoint: RestartCheckpoint | None,
    resume_point: ResumePoint | None = None,
) -> JobRecoveryStatus:
    """The job's checkpoints before the restart, and (after it) where the restarted job started."""
    return _update(status, number, checkpoint=checkpoint, resume_point=resume_point)


def set_outcome(status: JobRecoveryStatus, number: int, outcome: str) -> JobRecoveryStatus:
    """How the incident ended (``resumed``, ``budget spent``, ``observed only (observe mode)``...)."""
    return _update(status, number, outcome=outcome)


def add_hang_evidence(
    status: JobRecoveryStatus,
    number: int,
    *,
    stacks: tuple[RankStack, ...],
    processes: tuple[RankProcess, ...],
    odd_ranks: tuple[int, ...],
) -> JobRecoveryStatus:
    """The ranks' stacks and processes taken before a hung job was killed, and the ranks whose stack is odd."""
    return _update(status, number, stacks=stacks, processes=processes, odd_ranks=odd_ranks)


def add_action(status: JobRecoveryStatus, number: int, action: ActionRecord) -> JobRecoveryStatus:
    """An action decided (recorded with its idempotency key before it is taken)."""
    return _update(status, number, actions=(*incident(status, number).actions, action))


def replace_action(status: JobRecoveryStatus, number: int, action: ActionRecord) -> JobRecoveryStatus:
    """The action with ``action.key``, verified: its result replaces the decision."""
    actions = tuple(action if a.key == action.key else a for a in incident(status, number).actions)
    return _update(status, number, actions=actions)


def mark_restarted(status: JobRecoveryStatus, number: int, at: datetime) -> JobRecoveryStatus:
    """When the recovery action was verified (the requeue seen by the scheduler)."""
    return _update(status, number, restarted_at=at)


def mark_resumed(status: JobRecoveryStatus, number: int, at: datetime, checkpoint: str) -> JobRecoveryStatus:
    """The job logged a training step again, from ``checkpoint`` when it said."""
    return _update(status, number, resumed_at=at, resumed_from=checkpoint, outcome="resumed")


def record_decision(
    status: JobRecoveryStatus, number: int, decision: IsolationDecision, *, fleet_id: str, now: datetime
) -> JobRecoveryStatus:
    """The Fleet's drains as the incident's actions (verified by the Fleet), and its reasons in the timeline.

    A node already recorded as drained for this incident is not added twice (a later word repeats earlier drains).
    """
    at = decision.decided_at or now
    current = incident(status, number)
    drains = [
        ActionRecord(
            key=f"{fleet_id}/{decision.request_id}/drain-{node}",
            kind=ActionKind.DRAIN,
            target=node,
            decided_at=at,
            verified_at=at,
            result="drained by the Fleet",
        )
        for node in decision.drained
        if all(a.target != node or a.kind is not ActionKind.DRAIN for a in current.actions)
    ]
    status = _update(status, number, actions=(*current.actions, *drains))
    for node in decision.drained:
        status = record(status, now, "DRAINED", f"{node}: drained by the Fleet", number)
    detail = f"mode {decision.mode.value}; " + "; ".join(decision.reasons[:4])
    if decision.approvals:
        detail += f"; awaiting approval {', '.join(decision.approvals)} (rebound approve ID)"
    return record(status, now, "FLEET", detail, number)


def record(
    status: JobRecoveryStatus, at: datetime, event: str, detail: str, number: int | None = None
) -> JobRecoveryStatus:
    """A timeline entry (the newest ``MAX_TIMELINE`` are kept); its detail becomes the status's note."""
    entry = TimelineEntry(at=at, event=event, detail=detail, incident=number)
    return status.model_copy(update={"note": detail, "timeline": (*status.timeline, entry)[-MAX_TIMELINE:]})


def set_state(
    status: JobRecoveryStatus, at: datetime, state: RecoveryState, detail: str, number: int | None = None
) -> JobRecoveryStatus:
    """The loop's new state, with its timeline entry (the event is the state's name)."""
    return record(status.model_copy(update={"state": state}), at, state.value, detail, number)


def observe_job(
    status: JobRecoveryStatus, job: SlurmJob, now: datetime, *, keep_nodes: bool = False
) -> JobRecoveryStatus:
    """A fresh observation of the job.

    ``keep_nodes``: the observation that came with an anomaly. A failed job may no longer list its nodes, and
    its restart count is the one the recovery checks against, so neither is taken from it.
    """
    update: dict[str, Any] = {"job_state": job.state, "job_name": job.name, "last_observed_at": now}
    if job.nodes or not keep_nodes:
        update["nodes"] = job.nodes or status.nodes
    if job.state is JobState.RUNNING and job.start_time is not None:
        update["running_since"] = job.start_time
    if not keep_nodes:
        update["restart_count"] = job.restart_count
    return status.model_copy(update=update)


def carry(status: JobRecoveryStatus) -> JobRecoveryStatus:
    """The status the next run starts with: the newest incidents (older ones stay in earlier histories)."""
    return status.model_copy(update={"incidents": status.incidents[-MAX_CARRIED_INCIDENTS:], "runs": status.runs + 1})


def details_markdown(status: JobRecoveryStatus) -> str:
    """The workflow's current details in the Temporal UI: state, nodes, restarts, the recent timeline."""
    st = status
    rows = "\n".join(f"| {e.at:%H:%M:%S} | {e.event} | {e.detail[:160]} |" for e in st.timeline[-DETAILS_ROWS:])
    return (
        f"## Job {st.job_id} ({st.job_name or 'unnamed'}): **{st.state.value}**\n\n"
        f"- Slurm state: {st.job_state.value if st.job_state else 'unknown'}\n"
        f"- nodes: {', '.join(st.nodes) or '-'}; restarts used: {st.restarts_used}/{st.restart_budget}\n\n"
        f"| time (UTC) | event | detail |\n|---|---|---|\n{rows}\n"
    )


def _update(status: JobRecoveryStatus, number: int, **fields: object) -> JobRecoveryStatus:
    return _put(status, incident(status, number).model_copy(update=fields))


def _put(status: JobRecoveryStatus, new: Incident) -> JobRecoveryStatus:
    others = tuple(i for i in status.incidents if i.number != new.number)
    return status.model_copy(update={"incidents": tuple(sorted((*others, new), key=lambda i: i.number))})
