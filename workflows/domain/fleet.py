"""The Fleet workflow's state, policy, requests and decisions: cluster-wide node quarantine with safety limits.

Fleet (one per cluster, id ``rebound/{cluster}/fleet``) is the single writer of node quarantine: every
JobRecovery asks it (``IsolationRequest``) before a node is drained or a job restarted, and it answers
(``IsolationDecision``) after applying the mode, the breaker, cross-job correlation and the approval policy.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from workflows.domain.auth_state import AuthState
from workflows.domain.base import Frozen
from workflows.domain.gpu import GpuAction, GpuEvent
from workflows.domain.incident import ActionRung
from workflows.domain.node_check import NodeCheckPolicy


class FleetMode(StrEnum):
    """How much Rebound may do (the staged rollout: observe -> canary -> act)."""

    OBSERVE = "observe"
    """Decide and record; act on nothing (no drain, no requeue)."""
    CANARY = "canary"
    """Act only for jobs in the canary partition; observe everywhere else."""
    ACT = "act"


class ApprovalOutcome(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    """Nobody answered in time; the policy's default was applied (``applied``)."""


class FleetPolicy(Frozen):
    """The operator's safety limits (settings ``fleet.*``)."""

    mode: FleetMode = FleetMode.OBSERVE
    """The mode Fleet starts in; operators change it at run time (``rebound mode``)."""
    canary_partition: str = ""
    """The one partition Rebound acts on in ``canary`` mode."""
    breaker_max_fraction: float = Field(0.10, gt=0, le=1)
    """At most this share of the cluster's nodes (and of each partition's) drained by Rebound per window."""
    breaker_max_nodes: int = Field(4, ge=1)
    """And at most this many nodes per window, whatever the share allows; at least one is always allowed."""
    breaker_window_s: float = Field(3600.0, gt=0)
    operators: tuple[str, ...] = ()
    """Who may approve or reject (``rebound approve --as NAME``); empty: nobody, so approvals only time out."""
    approval_timeout_s: float = Field(900.0, gt=0)
    """How long an approval waits for an operator before the default applies."""
    approval_default: ApprovalOutcome = ApprovalOutcome.REJECTED
    """What a timed-out approval becomes: ``rejected`` (the safe default: no drain) or ``approved``."""
    approve_below_confidence: float = Field(0.5, ge=0, le=1)
    """Drains of an attribution less confident than this wait for an operator."""
    protected_partitions: tuple[str, ...] = ()
    """Drains of nodes in these partitions always wait for an operator."""
    approve_restart_from: int = Field(0, ge=0)
    """The Nth restart of a job (and later ones) waits for an operator; 0: restarts never wait."""
    correlation_window_s: float = Field(300.0, gt=0)
    """Failures of different jobs within this window are compared."""
    correlation_min_nodes: int = Field(3, ge=2)
    """This many distinct nodes implicated by jobs of at least two different users within the window point at
    shared infrastructure (a switch, a file system): nothing more is drained until an operator decides. Jobs of
    one user never count as shared: one user could otherwise freeze every drain on purpose."""
    suspicion_window_s: float = Field(24 * 3600.0, gt=0)
    """A suspicion (a node excluded from one job's placement on the job's word alone) is remembered this long: the
    same node implicated again within it by a job of another user is drained; again only by jobs of the same user
    (a job's output is a claim), the drain waits for an operator."""
    lemon_incidents: int = Field(3, ge=2)
    """A node implicated in this many incidents within ``lemon_window_s`` is held for repair, never returned."""
    lemon_window_s: float = Field(7 * 24 * 3600.0, gt=0)
    health_check_after_s: float = Field(60.0, ge=0)
    """How long a node stays drained before its health check runs (0: at once)."""
    return_healthy_nodes: bool = True
    """Resume a drained node whose health check passed (never a lemon, never a node someone else drained)."""
    node_check: NodeCheckPolicy = Field(default_factory=NodeCheckPolicy)
    """The diagnostic job run on a drained node before it is resumed (ADR 018)."""


class NodeLifecycle(StrEnum):
    """Where a node is in Rebound's quarantine (independent of Slurm's own state)."""

    HEALTHY = "healthy"
    SUSPECT = "suspect"
    """Implicated, not drained (observe mode, breaker, awaiting approval)."""
    DRAINING = "draining"
    DRAINED = "drained"
    CHECKING = "checking"
    """Its health check is running."""
    HELD = "held"
    """Held for repair: failed its health check, or a lemon. Only an operator returns it."""
    EXTERNAL = "external"
    """Drained by someone else (a health-check script, an administrator): evidence, never touched."""


class NodeIncident(Frozen):
    at: datetime
    job_id: int
    incident: str
    cause: str
    confidence: float = 0.0
    request_id: str = ""
    """The ``IsolationRequest`` that reported it: a repeated request is noted once per node."""
    suspicion: bool = False
    """Only the job's word against the node (``ActionRung.EXCLUDE``): excluded for that job, not drained."""
    evidence: str = ""
    """What the evidence was, in the action ladder's words, for people."""
    user: str = ""
    """The job's owner (``IsolationRequest.user``); empty: unknown (recorded before owners were, or not known)."""


class NodeRecord(Frozen):
    node: str
    state: NodeLifecycle = NodeLifecycle.HEALTHY
    since: datetime | None = None
    reason: str = ""
    """Why it is in this state, for people."""
    partitions: tuple[str, ...] = ()
    incidents: tuple[NodeIncident, ...] = ()
    """Recent incidents that implicated it, across all jobs (bounded)."""
    drained_at: datetime | None = None
    drain_reason: str = ""
    """The Slurm reason Rebound set (``rebound: ...``): resumed only if the node still carries exactly it."""
    checks: tuple[str, ...] = ()
    """Health-check results, newest last (bounded)."""
    returned_at: datetime | None = None
    """When a node Rebound drained last came back to service (its health check passed, or an operator resumed
    it): implications before then were dealt with, so they no longer make a new one a repeat (the lemon count,
    which reads ``incidents``, still sees them)."""


class DrainEvent(Frozen):
    at: datetime
    node: str
    partitions: tuple[str, ...] = ()
    incident: str = ""


class IsolationRequest(Frozen):
    """JobRecovery to Fleet: these nodes are implicated in this incident; may Rebound drain them and restart?"""

    request_id: str
    """``<JobRecovery workflow id>/incident-<n>``: a repeated request gets the same decision."""
    reply_to: str
    """The JobRecovery workflow id that waits for the decision (signal ``isolation_decided``); empty when nobody
    waits (the Fleet's own escalation of a suspicion, ``NodeGpuFault``)."""
    job_id: int
    partition: str = ""
    incident: str
    cause: str
    failure_class: str = ""
    confidence: float = Field(0.0, ge=0, le=1)
    nodes: tuple[str, ...] = ()
    restart_number: int = Field(1, ge=1)
    """The restart this incident would be for the job (1 = its first)."""
    restart: bool = True
    """False for a drain request that restarts nothing (a late hardware fault on a suspected node)."""
    requested_at: datetime
    rung: ActionRung = ActionRung.DRAIN
    """What the evidence allows (``workflows.policy.action_ladder``): ``drain`` asks to drain the nodes (a request
    from before the ladder reads so); ``exclude`` asks only to keep them out of the job's next placement and to
    record a suspicion (escalated to a drain when a node was implicated before within the suspicion window)."""
    evidence: str = ""
    """What the evidence is, in the ladder's words (``a rank died with no hardware evidence``): the Fleet's record
    and reasons."""
    node_count: int = Field(0, ge=0)
    """Nodes the job needs (0: unknown): an exclusion that would leave too few in its partition is not made."""
    excluded_before: tuple[str, ...] = ()
    """Rebound's standing exclusion of the job (its suspects from earlier incidents; before the owner's exclusion
    was recorded apart, Slurm's whole ``ExcNodeList`` too)."""
    gpus_per_node: int | None = None
    """GPUs the job needs on each node (0: none; None: unknown): a node with fewer cannot take the job."""
    cpus_per_node: int = Field(0, ge=0)
    """CPUs the job needs on each node (0: unknown)."""
    owner_excluded: tuple[str, ...] = ()
    """Nodes the job's owner excludes (``--exclude``): out of its placement, never part of Rebound's standing
    exclusion or its bound."""
    user: str = ""
    """The job's owner, the Unix user of the scheduler's job record (Slurm authenticated it; the job's output
    cannot change it). A job's output is a claim, so only jobs of different users implicating the same node make a
    drain without node-level evidence, and only they count toward cross-job correlation. Empty: unknown (a request
    from before owners were sent), never "a different user"."""


class NodeGpuFault(Frozen):
    """A node agent to the Fleet: a GPU fault on its node that the XID catalogue reads as the node's (``action``
    ``reset_gpu`` or ``drain_node``). A node that holds a suspicion then gets a drain request naming both."""

    node: str
    event: GpuEvent
    action: GpuAction
    finding: str
    """What the fault means, in the catalogue's words (``XID 79 (GPU has fallen off the bus): ...``)."""


class ApprovalKind(StrEnum):
    DRAIN = "drain"
    RESTART = "restart"


class Approval(Frozen):
    """An action waiting for an operator (findable in the UI: search attribute ``ReboundPendingApproval``)."""

    id: str
    """Short and typeable: ``a-<n>``."""
    kind: ApprovalKind
    request: IsolationRequest
    nodes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    requested_at: datetime
    deadline: datetime
    outcome: ApprovalOutcome = ApprovalOutcome.PENDING
    decided_by: str = ""
    decided_at: datetime | None = None
    note: str = ""
    applied: ApprovalOutcome | None = None
    """What was carried out: the operator's answer, or the policy's default after the deadline."""
    carried_out: bool = False
    """The Fleet acted on ``applied`` (drained the nodes, answered the job): never twice, even across
    continue-as-new."""


class IsolationDecision(Frozen):
    """Fleet's answer to one request."""

    request_id: str
    mode: FleetMode
    act: bool
    """False in observe mode (or outside the canary partition): record only; the job is not requeued."""
    drained: tuple[str, ...] = ()
    """Nodes Rebound drained for this request (verified by a fresh read)."""
    exclude: tuple[str, ...] = ()
    """Nodes to keep out of the job's next placement: drained ones, ones drained by others, ones awaiting approval."""
    approvals: tuple[str, ...] = ()
    """Approval ids opened for this request."""
    restart_allowed: bool = True
    """False when a restart approval was rejected (or expired to rejection)."""
    reasons: tuple[str, ...] = ()
    decided_at: datetime | None = None
    suspected: tuple[str, ...] = ()
    """Nodes recorded as suspicions: excluded for this job only, not drained."""
    job_exclusion: tuple[str, ...] | None = None
    """The job's own standing exclusion after this decision (kept across its later restarts, bounded); None: a
    decision made before suspicions (the job keeps its own)."""


class FleetVerdict(Frozen):
    """What the pure policy says about one request, before anything is done."""

    act: bool
    drain: tuple[str, ...] = ()
    """Drain now."""
    hold: tuple[str, ...] = ()
    """Drain only after an operator approves (breaker, low confidence, protected partition, correlation)."""
    exclude: tuple[str, ...] = ()
    external: tuple[str, ...] = ()
    """Implicated nodes someone else already drained: excluded, never touched."""
    restart_needs_approval: bool = False
    reasons: tuple[str, ...] = ()
    suspected: tuple[str, ...] = ()
    """Suspicions recorded: excluded for this job, not drained."""
    job_exclusion: tuple[str, ...] = ()
    """The job's standing exclusion after this request (see ``IsolationDecision.job_exclusion``)."""


class BreakerStatus(Frozen):
    drained_in_window: int
    cap: int
    open: bool
    """At the cap: further drains wait for an operator."""
    reset_at: datetime | None = None
    """When an operator last reset it (drains before that no longer count)."""


class FleetState(Frozen):
    """Everything Fleet carries across continue-as-new."""

    cluster: str
    mode: FleetMode = FleetMode.OBSERVE
    canary_partition: str = ""
    nodes: dict[str, NodeRecord] = {}
    drains: tuple[DrainEvent, ...] = ()
    """Drains by Rebound (the breaker's window reads these)."""
    breaker_reset_at: datetime | None = None
    approvals: tuple[Approval, ...] = ()
    """Pending ones and the most recent decided ones (bounded)."""
    decisions: tuple[IsolationDecision, ...] = ()
    """The most recent decisions by request id (bounded): a repeated request is answered the same way."""
    next_approval: int = 1
    auth: AuthState = AuthState()
    """Operators' authentication: used credentials, refusals, the audit of operator actions."""


class FleetInput(Frozen):
    cluster: str
    policy: FleetPolicy = FleetPolicy()
    carried: FleetState | None = None


class FleetStatus(Frozen):
    """What ``rebound nodes`` and ``rebound mode`` show."""

    state: FleetState
    breaker: BreakerStatus
    policy: FleetPolicy


class ApprovalAnswer(Frozen):
    """``rebound approve|reject``: an operator's answer (validated: the id is pending, the operator is allowed)."""

    approval_id: str
    operator: str
    approve: bool
    note: str = ""


class ModeChange(Frozen):
    mode: FleetMode
    canary_partition: str = ""
    operator: str = ""
