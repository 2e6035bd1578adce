"""JobRecovery's state transitions that are not the ledger's: signals taken, a new attempt, continue-as-new. Pure.

The workflow holds one ``JobRecoveryState`` (``workflows.domain.recovery``) and replaces it through these
functions and the ledger's; ``carry`` is what crosses continue-as-new, whole, with everything that grows bounded.
"""

from __future__ import annotations

from datetime import datetime

import workflows.job_recovery.ledger as ledger
from workflows.constants import incident_number_of_request
from workflows.domain.fleet import IsolationDecision
from workflows.domain.gpu import GpuEvent
from workflows.domain.progress import note_restart
from workflows.domain.recovery import (
    MAX_CARRIED_INCIDENTS,
    MAX_PENDING_GPU_EVENTS,
    MAX_SEEN_GPU_EVENTS,
    GpuEventKey,
    JobRecoveryState,
)
from workflows.policy.gpu_claims import event_key

__all__ = [
    "carry",
    "confirm_decision",
    "decision_for",
    "gpu_event_key",
    "incident_of_request",
    "new_attempt",
    "restart_hang_clock",
    "take_decision",
    "take_gpu_event",
    "take_gpu_events",
]


def gpu_event_key(event: GpuEvent) -> GpuEventKey:
    return event_key(event)  # one identity for an event: dedup here, the agent's confirmation (gpu_claims)


def take_gpu_event(state: JobRecoveryState, event: GpuEvent) -> JobRecoveryState:
    """A GPU fault a node agent signalled: kept for attribution unless it was taken before (an agent's re-send)."""
    key = gpu_event_key(event)
    if key in state.seen_gpu_events:
        return state
    pending = state.gpu_events if len(state.gpu_events) >= MAX_PENDING_GPU_EVENTS else (*state.gpu_events, event)
    seen = (*state.seen_gpu_events, key)[-MAX_SEEN_GPU_EVENTS:]
    return state.model_copy(update={"gpu_events": pending, "seen_gpu_events": seen})


def take_gpu_events(state: JobRecoveryState) -> tuple[JobRecoveryState, tuple[GpuEvent, ...]]:
    """The signalled GPU events, handed to attribution (and no longer pending)."""
    return state.model_copy(update={"gpu_events": ()}), state.gpu_events


def decision_for(state: JobRecoveryState, request_id: str) -> IsolationDecision | None:
    """The Fleet's latest word on one request, if it answered."""
    return next((d for d in state.decisions if d.request_id == request_id), None)


def take_decision(state: JobRecoveryState, decision: IsolationDecision) -> JobRecoveryState:
    """The Fleet's answer (or a later word) on one request; the newest ``MAX_CARRIED_INCIDENTS`` are kept."""
    others = tuple(d for d in state.decisions if d.request_id != decision.request_id)
    return state.model_copy(update={"decisions": (*others, decision)[-MAX_CARRIED_INCIDENTS:]})


def confirm_decision(
    state: JobRecoveryState, record: IsolationDecision | None, signalled: IsolationDecision
) -> JobRecoveryState:
    """The Fleet's own record of a decision replaces what a signal said; a signal for a decision the Fleet never
    made (forged) is dropped."""
    others = tuple(d for d in state.decisions if d.request_id != signalled.request_id)
    kept = others if record is None else (*others, record)
    return state.model_copy(update={"decisions": kept[-MAX_CARRIED_INCIDENTS:]})


def incident_of_request(state: JobRecoveryState, request_id: str) -> int | None:
    """The number of the incident an isolation request was made for, if the ledger still holds it."""
    number = incident_number_of_request(request_id)
    return next((i.number for i in state.status.incidents if i.number == number), None)


def restart_hang_clock(state: JobRecoveryState, now: datetime) -> JobRecoveryState:
    """Silence is counted from ``now``: after a requeue, or an observed hang that is not reported again at once."""
    if state.progress is None:
        return state
    return state.model_copy(update={"progress": note_restart(state.progress, now)})


def new_attempt(state: JobRecoveryState, now: datetime) -> JobRecoveryState:
    """The job was requeued: its start-up (scheduling, model and checkpoint load) is not a hang, its
    stragglers are reported afresh, and its ranks are placed afresh (they may run elsewhere now)."""
    return restart_hang_clock(state, now).model_copy(update={"reported_stragglers": (), "rank_map": None})


def carry(state: JobRecoveryState) -> JobRecoveryState:
    """The whole state the next run starts with (continue-as-new); the ledger keeps its newest incidents."""
    return state.model_copy(update={"status": ledger.carry(state.status)})
