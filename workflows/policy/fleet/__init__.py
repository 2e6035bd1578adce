"""The Fleet's policy: which implicated nodes Rebound drains, which wait for an operator, and each node's lifecycle.

Pure and deterministic: ``now`` is passed in, nothing is read or written, and every function returns a new
``FleetState`` (the Fleet workflow is the only caller and the single writer of node quarantine).

``decide_isolation`` applies these rules to one ``IsolationRequest``, in order, each adding a reason for people:

1. Mode: act in ``act`` mode, or in ``canary`` mode for a job of the canary partition; otherwise the verdict is
   computed in full (what WOULD be drained or held) but ``act`` is False.
2. Ownership: a node someone else drained is evidence, excluded and never touched (``external``); a node Rebound
   already drained is excluded, not drained again; a node the scheduler does not list is excluded.
   A request on the ``exclude`` rung (only the job's word against its nodes: ``workflows.policy.action_ladder``)
   records a suspicion of each node and drains none. A job's output is a claim (its owner controls it and can
   submit many jobs): a node implicated before within ``suspicion_window_s`` by a job of another user
   (``IsolationRequest.user``) goes on to the rules below as a strong suspect, the incidents and users named; one
   implicated again only by jobs of the same user (or of unknown owners) stays a suspicion and its drain waits for
   an operator (``suspicion``).
3. Cross-job correlation: when this request and other jobs' incidents within ``correlation_window_s`` implicate
   ``correlation_min_nodes`` distinct nodes, and those jobs belong to at least two distinct known users, the cause
   is more likely shared (a switch, a file system): every candidate waits for an operator. One user's jobs never
   make it (they could freeze every drain on purpose). A node another user's job implicated in that window is a
   strong suspect.
4. Low confidence (unless a strong suspect) and protected partitions wait for an operator. Each drain's reason
   names its evidence (the node-level evidence, or the users whose jobs implicated the node).
5. Breaker: at most ``cap`` drains per sliding window for the cluster and for each partition; the rest wait.
6. The job's Nth restart (``approve_restart_from``) waits for an operator.
7. Everything drained, waiting, or drained by others is kept out of the job's next placement; so are the
   suspects, unless the job's partition would keep too few placeable nodes without them (then the restart goes
   ahead without that exclusion, and the reasons say so). The job's standing exclusion (``job_exclusion``, bounded)
   carries its suspects to its later restarts.

Windows are closed: an event exactly ``window_s`` old still counts (the safe side of every limit).

The parts: ``decision`` (the rules above, and the memory of decisions), ``suspicion`` (rules 2 and 7 for the
``exclude`` rung), ``view`` (what the Fleet reads of the cluster: the nodes it names, counts for the rest),
``late_fault`` (a node-level GPU fault on a suspected node: a drain request through the rules
above, naming both), ``breaker`` (rule 5), ``lifecycle`` (each
node's incidents, drains, health checks and sync with the scheduler), ``approvals``, ``common``. This package's
names below are its public surface, the one the Fleet workflow uses.
"""

from __future__ import annotations

from workflows.policy.fleet.approvals import (
    MAX_DECIDED_APPROVALS,
    answer_approval,
    approval_notification,
    approval_refusal,
    expire_approvals,
    held_by_breaker,
    open_approval,
    storm_announced,
)
from workflows.policy.fleet.breaker import breaker_status
from workflows.policy.fleet.decision import MAX_DECISIONS, decide_isolation, find_decision, remember_decision
from workflows.policy.fleet.late_fault import late_fault_escalation
from workflows.policy.fleet.lifecycle import (
    MAX_CHECKS_PER_NODE,
    MAX_DRAIN_EVENTS,
    MAX_INCIDENTS_PER_NODE,
    after_drain,
    after_health_check,
    clear_stale_suspects,
    health_checks_due,
    is_lemon,
    next_wake_s,
    note_incident,
    sync_with_view,
)
from workflows.policy.fleet.operator_actions import apply_operator_action, operator_refusal
from workflows.policy.fleet.request_check import allocation_partial, checked_request
from workflows.policy.fleet.suspicion import MAX_JOB_EXCLUSIONS, active_suspicions
from workflows.policy.fleet.view import as_fleet_view, build_fleet_view, view_input

__all__ = [
    "MAX_CHECKS_PER_NODE",
    "MAX_DECIDED_APPROVALS",
    "MAX_DECISIONS",
    "MAX_DRAIN_EVENTS",
    "MAX_INCIDENTS_PER_NODE",
    "MAX_JOB_EXCLUSIONS",
    "active_suspicions",
    "allocation_partial",
    "apply_operator_action",
    "as_fleet_view",
    "checked_request",
    "build_fleet_view",
    "after_drain",
    "after_health_check",
    "answer_approval",
    "approval_notification",
    "breaker_status",
    "clear_stale_suspects",
    "decide_isolation",
    "expire_approvals",
    "held_by_breaker",
    "find_decision",
    "health_checks_due",
    "is_lemon",
    "late_fault_escalation",
    "note_incident",
    "next_wake_s",
    "open_approval",
    "operator_refusal",
    "storm_announced",
    "remember_decision",
    "sync_with_view",
    "approval_refusal",
    "view_input",
]
