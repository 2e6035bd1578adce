"""Fleet: the cluster's single writer of node quarantine (id ``rebound/{cluster}/fleet``).

Every JobRecovery asks the Fleet (signal ``request_isolation``, checked against the scheduler's fresh read) before
anything touches a node or restarts a job, and waits for its answer (signal ``isolation_decided``). The Fleet
applies, in order: the mode (observe, canary, act), drains by others (evidence, never touched), cross-job
correlation (jobs of several users failing together: an operator decides), the approval policy, and the breaker.
An ``exclude``-rung request (the job's word alone) records a suspicion and keeps the nodes out of that job's next
placement; the same node implicated again by a job of another user is drained, by the same user's jobs it waits
for an operator (``workflows.policy.fleet.suspicion``). Operators act through the signed update
``operator_request`` (``rebound approve|reject|mode|breaker``). Drained nodes get a health check and return to
service, or are held for repair. Decisions live in ``workflows.policy.fleet``; this class sequences and records.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import workflows.policy.fleet as policy
    from activities.slurm.actions import SlurmActionActivities
    from workflows import fleet_check, fleet_io, metrics, operator_gate
    from workflows.constants import (
        ANSWER_APPROVAL_UPDATE,
        FLEET_DECISION_QUERY,
        FLEET_WORKFLOW,
        NODE_GPU_FAULT_SIGNAL,
        OPERATOR_REQUEST_UPDATE,
        PENDING_APPROVAL,
        REQUEST_ISOLATION_SIGNAL,
        RESET_BREAKER_UPDATE,
        SET_MODE_UPDATE,
        STATUS_QUERY,
        drain_reason,
    )
    from workflows.domain.auth_state import AuthState
    from workflows.domain.fleet import (
        Approval,
        ApprovalAnswer,
        ApprovalKind,
        ApprovalOutcome,
        BreakerStatus,
        FleetInput,
        FleetState,
        FleetStatus,
        IsolationDecision,
        IsolationRequest,
        ModeChange,
        NodeGpuFault,
        NodeLifecycle,
        NodeRecord,
    )
    from workflows.domain.fleet_view import FleetView
    from workflows.domain.incident import ActionRung
    from workflows.domain.loop import DrainInput
    from workflows.domain.operators import OperatorRequest
    from workflows.domain.slurm import ClusterSnapshot
    from workflows.history import continue_as_new_due
    from workflows.notify import notify
    from workflows.options import CLUSTER_ACTION

#: Requests on the ``exclude`` rung record suspicions instead of drains (histories from before read every request
#: as a drain request, as they were decided).
FLEET_SUSPICIONS_PATCH = "fleet-suspicions"
#: A node-level GPU fault on a suspected node escalates the suspicion to a drain request (no history before had one).
FLEET_LATE_GPU_FAULT_PATCH = "fleet-late-gpu-fault"
#: Continue as new once the history passes Rebound's own bound, not only when the server suggests it.
FLEET_HISTORY_BOUND_PATCH = "12-fleet-history-bound"

#: The unsigned updates (before operators were authenticated) refuse every new call; recorded histories replay.
_UNSIGNED = (
    "unsigned operator updates are refused: operators act through `rebound` (approve, reject, mode, breaker), "
    "which signs each action with MUNGE (update operator_request)"
)

#: A JobRecovery's request is checked against the scheduler's fresh read before it is decided (its owner and
#: nodes: ``workflows.policy.fleet.request_check``); histories from before decided requests as they came.
FLEET_REQUEST_CHECK_PATCH = "13-fleet-request-check"
#: Patch id: a drain the breaker holds while another breaker approval is pending is not announced again.
FLEET_ONE_STORM_PAGE = "13-fleet-one-storm-page"
#: A node's GPU fault signal escalates a suspicion only once the node's own agent lists the fault in a fresh read.
FLEET_CONFIRM_GPU_FAULT_PATCH = "13-fleet-confirm-gpu-fault"

#: Wake up at least this often to expire approvals and run health checks.
_MAX_SLEEP_S = 60.0


@workflow.defn(name=FLEET_WORKFLOW)
class FleetWorkflow:
    """Node quarantine for one cluster, with the breaker, the modes and the approvals in its state."""

    @workflow.init
    def __init__(self, inp: FleetInput) -> None:
        self._inp = inp
        self._policy = inp.policy
        self._state = inp.carried or FleetState(
            cluster=inp.cluster, mode=inp.policy.mode, canary_partition=inp.policy.canary_partition
        )
        self._queue: list[IsolationRequest] = []
        self._faults: list[NodeGpuFault] = []
        self._answered = 0  # bumps on every operator answer, so the loop wakes up
        self._cluster_nodes = 0
        self._published: list[str] | None = None

    # ----- messages --------------------------------------------------------------------------------------------
    @workflow.signal(
        name=REQUEST_ISOLATION_SIGNAL,
        description="A JobRecovery asks whether it may drain these nodes and restart its job.",
    )
    def request_isolation(self, req: IsolationRequest) -> None:
        if all(r.request_id != req.request_id for r in self._queue):
            self._queue.append(req)

    @workflow.signal(
        name=NODE_GPU_FAULT_SIGNAL,
        description="A node agent saw a GPU fault the XID catalogue puts on its node: a suspected node is drained.",
    )
    def node_gpu_fault_reported(self, fault: NodeGpuFault) -> None:
        self._faults.append(fault)

    @workflow.query(
        name=STATUS_QUERY, description="Nodes, breaker, mode, pending and recent approvals, recent decisions."
    )
    def status(self) -> FleetStatus:
        return FleetStatus(state=self._state, breaker=self._breaker(), policy=self._policy)

    @workflow.query(
        name=FLEET_DECISION_QUERY,
        description="The Fleet's own record of its decision on one request id (JobRecovery confirms every answer).",
    )
    def decision(self, request_id: str) -> IsolationDecision | None:
        return policy.find_decision(self._state, request_id)

    @workflow.update(
        name=ANSWER_APPROVAL_UPDATE,
        description="An operator approves or rejects a pending action (rebound approve|reject).",
    )
    def answer_approval(self, answer: ApprovalAnswer) -> Approval:
        self._state = policy.answer_approval(self._state, answer, workflow.now())
        self._answered += 1
        found = next(a for a in self._state.approvals if a.id == answer.approval_id)
        return found

    @answer_approval.validator
    def _validate_answer(self, answer: ApprovalAnswer) -> None:
        raise ValueError(_UNSIGNED)

    @workflow.update(
        name=SET_MODE_UPDATE, description="Switch between observe, canary (one partition) and act (rebound mode)."
    )
    def set_mode(self, change: ModeChange) -> FleetStatus:
        self._state = self._state.model_copy(
            update={"mode": change.mode, "canary_partition": change.canary_partition or self._state.canary_partition}
        )
        self._answered += 1
        return self.status()

    @set_mode.validator
    def _validate_mode(self, change: ModeChange) -> None:
        raise ValueError(_UNSIGNED)

    @workflow.update(
        name=RESET_BREAKER_UPDATE, description="Reset the drain breaker: earlier drains no longer count toward the cap."
    )
    def reset_breaker(self, operator: str) -> BreakerStatus:
        self._state = self._state.model_copy(update={"breaker_reset_at": workflow.now()})
        self._answered += 1
        return self._breaker()

    @reset_breaker.validator
    def _validate_reset(self, operator: str) -> None:
        raise ValueError(_UNSIGNED)

    @workflow.update(
        name=OPERATOR_REQUEST_UPDATE,
        description="An operator's action signed with MUNGE (rebound approve|reject|mode|breaker reset): verified "
        "once, then applied as the verified Unix user.",
    )
    async def operator_request(self, req: OperatorRequest) -> FleetStatus:
        verified = await operator_gate.admit(
            lambda: self._state.auth, self._set_auth, req, lambda: policy.operator_refusal(self._state, req.action)
        )
        self._state = policy.apply_operator_action(self._state, req.action, verified.user, workflow.now())
        self._answered += 1
        return self.status()

    @operator_request.validator
    def _validate_operator_request(self, req: OperatorRequest) -> None:
        operator_gate.precheck(self._state.auth, req, policy.operator_refusal(self._state, req.action))

    def _set_auth(self, auth: AuthState) -> None:
        self._state = self._state.model_copy(update={"auth": auth})

    # ----- the loop ----------------------------------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: FleetInput) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # a timeout is the periodic look at deadlines and checks
                await workflow.wait_condition(
                    self._woken(self._answered),
                    timeout=self._sleep_s(),
                    timeout_summary="next look at approval deadlines and health checks",
                )
            await self._apply_answers()
            await self._expire_approvals()
            while self._queue:
                await self._handle(self._queue.pop(0))
            while self._faults:
                await self._late_fault(self._faults.pop(0))
            await self._health_checks()
            self._publish_pending()
            if not self._queue and not self._faults and continue_as_new_due(FLEET_HISTORY_BOUND_PATCH):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._inp.model_copy(update={"carried": self._state}))

    async def _late_fault(self, fault: NodeGpuFault) -> None:
        """A node-level GPU fault: a node that holds a suspicion gets a drain request naming both (normal rules)."""
        if not workflow.patched(FLEET_LATE_GPU_FAULT_PATCH):
            return
        now, fleet_id = workflow.now(), workflow.info().workflow_id
        escalated = policy.late_fault_escalation(self._state, fault, self._policy, now, fleet_id)
        if escalated is None:
            workflow.logger.info("GPU fault on %s: no suspicion to escalate (%s)", fault.node, fault.finding)
            return
        req, why = escalated
        if policy.find_decision(self._state, req.request_id) is not None:  # one escalation per suspicion
            return
        if workflow.patched(FLEET_CONFIRM_GPU_FAULT_PATCH) and not await fleet_io.agent_confirms(fault):
            return
        await self._handle(req, why=why)

    async def _handle(self, req: IsolationRequest, *, why: str = "") -> None:
        """Decide one request and carry it out; ``why`` leads the reasons (an escalation says what it joins)."""
        done = policy.find_decision(self._state, req.request_id)
        if done is not None:
            await self._reply(req, done)  # a retried request: the same answer again
            return
        if not workflow.patched(FLEET_SUSPICIONS_PATCH):
            # Recorded before suspicions existed: every request was a drain request.
            req = req.model_copy(update={"rung": ActionRung.DRAIN})
        view = await self._view(req)
        if req.reply_to and isinstance(view, FleetView) and workflow.patched(FLEET_REQUEST_CHECK_PATCH):
            # Believe only what the scheduler confirms: the job's owner, its nodes (docs/security.md); a completing
            # job lists only the nodes still completing, so its whole allocation is waited for (bounded).
            if workflow.patched(fleet_io.SETTLE_PATCH):
                view = await fleet_io.settled_view(self._state, req, view)
            req, checked = policy.checked_request(req, view)
            why = "; ".join(x for x in (why, *checked) if x)
        now = workflow.now()
        self._state = policy.sync_with_view(self._state, view, now)
        self._state = policy.clear_stale_suspects(self._state, self._policy, now)
        self._state = policy.note_incident(self._state, req, now, self._policy)
        # Again after noting: a node Rebound had no record of (sync follows only recorded nodes) that someone else
        # already drained is EXTERNAL from its first request, not a SUSPECT (pure: no command changes).
        self._state = policy.sync_with_view(self._state, view, now)
        # A job's output is a claim (issue 13): one user's jobs no longer drain a node or freeze drains; histories
        # recorded before decided by the rule of then (their drains and approvals are commands).
        claims = workflow.patched("13-fleet-job-output-is-a-claim")
        verdict = policy.decide_isolation(self._state, req, self._policy, view, now, claims=claims)
        reasons = [why, *verdict.reasons] if why else list(verdict.reasons)
        drained: list[str] = []
        approvals: list[str] = []
        if verdict.act:
            for node in verdict.drain:
                if await self._drain(node, req, view):
                    drained.append(node)
            if verdict.hold:
                self._state, approval = policy.open_approval(
                    self._state, ApprovalKind.DRAIN, req, verdict.hold, tuple(reasons), self._policy, now
                )
                approvals.append(approval.id)
                self._publish_pending()  # findable in the UI at once, not after this round's health checks
                # A drain storm pages once: a later held drain joins the pending one's announcement (issue 13).
                if not (policy.storm_announced(self._state, approval) and workflow.patched(FLEET_ONE_STORM_PAGE)):
                    await self._announce(approval)
        decision = IsolationDecision(
            request_id=req.request_id,
            mode=self._state.mode,
            act=verdict.act,
            drained=tuple(drained),
            exclude=verdict.exclude if verdict.act else (),
            approvals=tuple(approvals),
            reasons=tuple(reasons),
            decided_at=workflow.now(),
            suspected=verdict.suspected,
            job_exclusion=verdict.job_exclusion if verdict.act else None,
        )
        if verdict.act and verdict.restart_needs_approval:
            self._state, approval = policy.open_approval(
                self._state, ApprovalKind.RESTART, req, (), (f"restart {req.restart_number} of job {req.job_id}",),
                self._policy, now,
            )  # fmt: skip
            self._state = policy.remember_decision(
                self._state, decision.model_copy(update={"approvals": (*decision.approvals, approval.id)})
            )
            self._publish_pending()
            await self._announce(approval)
            return  # answered once an operator decides (or the deadline applies the default)
        self._state = policy.remember_decision(self._state, decision)
        await self._reply(req, decision)

    async def _drain(self, node: str, req: IsolationRequest, view: FleetView | ClusterSnapshot) -> bool:
        """Drain one node for ``req`` (recorded first, verified by a fresh read); False if someone else holds it."""
        reason = drain_reason(req.incident, req.cause)
        key = f"{workflow.info().workflow_id}/{req.request_id}/drain-{node}"
        record = self._state.nodes.get(node)
        self._state = self._state.model_copy(
            update={
                "nodes": {
                    **self._state.nodes,
                    node: (record or NodeRecord(node=node, since=workflow.now())).model_copy(
                        update={"state": NodeLifecycle.DRAINING, "since": workflow.now(), "reason": reason}
                    ),
                }
            }
        )
        done = await workflow.execute_activity_method(
            SlurmActionActivities.drain_node,
            DrainInput(node=node, reason=reason, key=key),
            summary=f"Drain {node}: {req.cause} (job {req.job_id})",
            **CLUSTER_ACTION,
        )
        slurm_node = view.node(node)
        partitions = slurm_node.partitions if slurm_node is not None else ()
        if not done.drained_by_us:
            self._state = policy.sync_with_view(self._state, await self._view(), workflow.now())
            return False
        self._state = policy.after_drain(self._state, node, reason, req, partitions, workflow.now(), self._policy)
        metrics.record_drain(node, req.cause)
        return True

    async def _apply_answers(self) -> None:
        """Carry out what operators (or deadlines) decided since the last look, each answer exactly once."""
        for approval in list(self._state.approvals):
            if approval.applied is None or approval.outcome is ApprovalOutcome.PENDING or approval.carried_out:
                continue
            self._mark_carried_out(approval.id)
            if approval.kind is ApprovalKind.RESTART:
                await self._answer_restart(approval.request, approval)
            elif approval.applied is ApprovalOutcome.APPROVED:
                view = await self._view(approval.request, approval.nodes)
                drained = [node for node in approval.nodes if await self._drain(node, approval.request, view)]
                earlier = policy.find_decision(self._state, approval.request.request_id)
                if earlier is not None and drained:
                    # Tell the job: its incident's record (timeline, audit) then shows the drains.
                    update = earlier.model_copy(
                        update={
                            "drained": (*earlier.drained, *drained),
                            "reasons": (f"drained {', '.join(drained)} after approval {approval.id} by "
                                        f"{approval.decided_by or 'the policy default'}",),
                            "decided_at": workflow.now(),
                        }
                    )  # fmt: skip
                    self._state = policy.remember_decision(self._state, update)
                    await self._reply(approval.request, update)

    def _mark_carried_out(self, approval_id: str) -> None:
        self._state = self._state.model_copy(
            update={
                "approvals": tuple(
                    a.model_copy(update={"carried_out": True}) if a.id == approval_id else a
                    for a in self._state.approvals
                )
            }
        )

    async def _answer_restart(self, req: IsolationRequest, approval: Approval) -> None:
        allowed = approval.applied is ApprovalOutcome.APPROVED
        earlier = policy.find_decision(self._state, req.request_id)
        base = earlier or IsolationDecision(request_id=req.request_id, mode=self._state.mode, act=True)
        decision = base.model_copy(
            update={
                "restart_allowed": allowed,
                "reasons": (
                    *base.reasons,
                    f"restart {'approved' if allowed else 'rejected'} by {approval.decided_by or 'the policy default'}",
                ),
                "decided_at": workflow.now(),
            }
        )
        self._state = policy.remember_decision(self._state, decision)
        await self._reply(req, decision)

    async def _expire_approvals(self) -> None:
        self._state, expired = policy.expire_approvals(self._state, self._policy, workflow.now())
        if expired:
            self._answered += 1
            await self._apply_answers()

    async def _health_checks(self) -> None:
        await fleet_check.run_health_checks(lambda: self._state, self._set_state, self._policy, self._view)

    def _set_state(self, state: FleetState) -> None:
        self._state = state

    # ----- helpers -------------------------------------------------------------------------------------------------
    def _woken(self, seen: int) -> Callable[[], bool]:
        return lambda: bool(self._queue) or bool(self._faults) or self._answered != seen

    async def _view(
        self, req: IsolationRequest | None = None, nodes: tuple[str, ...] = ()
    ) -> FleetView | ClusterSnapshot:
        view = await fleet_io.read_view(self._state, req, nodes)
        self._cluster_nodes = view.node_count if isinstance(view, FleetView) else len(view.nodes)
        return view

    async def _reply(self, req: IsolationRequest, decision: IsolationDecision) -> None:
        await fleet_io.reply(req, decision)

    def _breaker(self) -> BreakerStatus:
        return policy.breaker_status(self._state, self._policy, self._cluster_nodes, workflow.now())

    def _sleep_s(self) -> float:
        return policy.next_wake_s(self._state, self._policy, workflow.now(), _MAX_SLEEP_S)

    async def _announce(self, approval: Approval) -> None:
        """Tell people an action waits for them (never blocks: ``workflows.notify``)."""
        fleet_id = workflow.info().workflow_id
        await notify(policy.approval_notification(approval, self._inp.cluster, self._policy, fleet_id))

    def _publish_pending(self) -> None:
        """Pending approval ids in the UI's search attribute (``ReboundPendingApproval = "a-3"``; unset when none)."""
        pending = [a.id for a in self._state.approvals if a.outcome is ApprovalOutcome.PENDING]
        metrics.set_approvals_pending(len(pending))
        metrics.set_breaker_open(self._breaker().open)
        if pending == self._published:
            return
        self._published = pending
        update = PENDING_APPROVAL.value_set(",".join(pending)) if pending else PENDING_APPROVAL.value_unset()
        workflow.upsert_search_attributes([update])


__all__ = ["FleetWorkflow"]
