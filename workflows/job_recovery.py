"""JobRecovery: one durable workflow per monitored job (id ``rebound/{cluster}/job/{job_id}``).

WATCHING -> DETECTED -> ATTRIBUTED -> ISOLATING -> RESTARTING -> VERIFYING -> WATCHING, ending FINISHED or GAVE_UP.
The workflow sequences and records; activities do the I/O and ``workflows.policy`` decides. Every action is
recorded (with its idempotency key) before it is taken, and every activity is idempotent, so a crash of the
worker or of the Temporal server at any point leads to the action being done exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.attribution import AttributionActivities
    from activities.fleet import FleetActivities
    from activities.gpu.activities import GpuActivities
    from activities.procs.activities import ProcsActivities
    from activities.slurm.actions import SlurmActionActivities
    from activities.slurm.activities import SlurmActivities
    from activities.watch import WatchActivities
    from workflows import metrics
    from workflows.constants import (
        CAUSE,
        IMPLICATED_NODES,
        JOB_ID,
        RECOVERY_STATE,
        RESTART_COUNT,
        fleet_workflow_id,
        node_task_queue,
    )
    from workflows.domain.anomaly import build_anomaly
    from workflows.domain.fleet import FleetMode, IsolationDecision, IsolationRequest
    from workflows.domain.gpu import GpuEvent, GpuHealthReport, NvmlReadGpuHealthInput
    from workflows.domain.hang import HangPolicy, HangVerdict
    from workflows.domain.incident import (
        ActionKind,
        ActionRecord,
        Anomaly,
        AnomalyKind,
        Attribution,
        Incident,
        LogFinding,
        TimelineEntry,
    )
    from workflows.domain.loop import (
        AttributeInput,
        AttributeResult,
        JobWatchInput,
        RequeueInput,
        ResumeOutcome,
        WaitResumeInput,
        WatchOutcome,
    )
    from workflows.domain.notify import Notification, NotificationKind, NotifyField, Severity
    from workflows.domain.procs import (
        NodeProcessesInput,
        NodeProcessesResult,
        RankProcess,
        RankStack,
        StackDumpInput,
        StackDumpResult,
    )
    from workflows.domain.progress import ProgressState, note_restart
    from workflows.domain.recovery import (
        JobRecoveryInput,
        JobRecoveryResult,
        JobRecoveryStatus,
        ObserveJobInput,
        ObserveJobResult,
        PauseRequest,
        RecoveryState,
        StragglerAction,
    )
    from workflows.domain.slurm import JobState, SlurmJob
    from workflows.domain.straggler import StragglerVerdict
    from workflows.notify import notify
    from workflows.options import (
        ATTRIBUTE,
        CLUSTER_ACTION,
        FLEET_REQUEST,
        JOB_WATCH,
        NODE_AGENT_EVIDENCE,
        NODE_AGENT_QUICK_READ,
        SCHEDULER_READ,
        WAIT_RESUME,
    )
    from workflows.policy.budget import backoff_s
    from workflows.policy.implicit import attribute_straggler, slowdown_reasons
    from workflows.policy.stacks import describe_stacks, odd_ranks
    from workflows.policy.straggler import restart_pays_off

#: Incidents kept in state across continue-as-new (older ones stay in the previous runs' histories).
MAX_CARRIED_INCIDENTS = 20
#: Stacks and processes kept with a hang incident (the rest are summarised in its timeline).
MAX_STACKS = 64


@workflow.defn(name="JobRecovery")
class JobRecoveryWorkflow:
    """Keeps one training job making progress."""

    @workflow.init
    def __init__(self, inp: JobRecoveryInput) -> None:
        self._inp = inp
        self._status = inp.carried or JobRecoveryStatus(
            cluster=inp.cluster, job_id=inp.job_id, state=RecoveryState.STARTING, restart_budget=inp.spec.restart_budget
        )
        self._gpu_events: list[GpuEvent] = []
        self._seen_gpu_events: set[tuple[str, int | None, int | None, int]] = set()
        # Hand-over from one incident to the next (a restarted job that fails again before training).
        self._next_anomaly: Anomaly | None = None
        self._next_findings: tuple[LogFinding, ...] = ()
        self._last_job: SlurmJob | None = None
        # What the watch learned about the ranks' progress, and the verdict behind the anomaly it returned.
        self._progress: ProgressState | None = inp.carried_progress
        self._hang: HangVerdict | None = None
        self._stragglers: StragglerVerdict | None = None
        self._reported_stragglers: tuple[str, ...] = ()
        # The Fleet's answers to this job's isolation requests, by request id.
        self._decisions: dict[str, IsolationDecision] = {}
        # Notifications decided in synchronous code (the end of the run), sent before the run returns.
        self._pending_notes: list[Notification] = []

    # ----- messages --------------------------------------------------------------------------------------------
    @workflow.signal(description="A node agent saw a GPU fault (XID, lost GPU, DBE) on a node this job runs on.")
    def gpu_fault_reported(self, event: GpuEvent) -> None:
        key = (event.host, event.index, event.xid, event.sequence)
        if key not in self._seen_gpu_events:
            self._seen_gpu_events.add(key)
            self._gpu_events.append(event)

    @workflow.signal(description="The Fleet's answer: nodes it drained, nodes to exclude, whether to act at all.")
    def isolation_decided(self, decision: IsolationDecision) -> None:
        if decision.request_id in self._decisions:
            self._late_drains(decision)  # a later word on an answered request: drains an operator approved
        self._decisions[decision.request_id] = decision

    def _late_drains(self, decision: IsolationDecision) -> None:
        """Record, in the incident they belong to, drains the Fleet did after its first answer (an approval)."""
        number = decision.request_id.rsplit("/incident-", 1)[-1]
        incident = next((i for i in self._status.incidents if str(i.number) == number), None)
        if incident is None:
            return  # carried out of this run's state by continue-as-new: the Fleet's state keeps the record
        self._record_decision(incident, decision)

    @workflow.update(description="Pause monitoring: no watch, no action until resumed (rebound pause JOB).")
    def pause(self, req: PauseRequest) -> JobRecoveryStatus:
        self._status = self._status.model_copy(update={"paused_by": req.operator})
        self._record("PAUSED", f"by {req.operator}" + (f": {req.note}" if req.note else ""))
        return self._status

    @workflow.update(description="Resume monitoring after a pause (rebound resume JOB).")
    def resume(self, req: PauseRequest) -> JobRecoveryStatus:
        self._status = self._status.model_copy(update={"paused_by": ""})
        self._record("RESUMED", f"monitoring resumed by {req.operator}" + (f": {req.note}" if req.note else ""))
        return self._status

    @workflow.query(description="Where the job is in the recovery loop, with incidents and their timeline.")
    def status(self) -> JobRecoveryStatus:
        return self._status

    # ----- the loop ----------------------------------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: JobRecoveryInput) -> JobRecoveryResult:
        result = await self._loop(inp)
        for note in self._pending_notes:
            # A bounded head start: an activity still pending when the run completes would be dropped.
            await notify(note, wait=timedelta(seconds=5))
        return result

    async def _loop(self, inp: JobRecoveryInput) -> JobRecoveryResult:
        job = await self._observe_job()
        if job is None:
            return self._end(RecoveryState.GAVE_UP, f"Slurm does not know job {inp.job_id}")
        if inp.carried is None:
            self._set_state(RecoveryState.WATCHING, f"watching job {inp.job_id} ({job.state.value})")
        pending: Anomaly | None = None
        findings: tuple[LogFinding, ...] = ()
        while True:
            if pending is None:
                if workflow.info().is_continue_as_new_suggested():
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    workflow.continue_as_new(self._carry())
                if job.state is JobState.COMPLETED:
                    return self._end(RecoveryState.FINISHED, "the job completed")
                if job.state is JobState.CANCELLED:
                    return self._end(RecoveryState.FINISHED, "the job was cancelled by its owner")
                if self._status.paused_by:
                    await workflow.wait_condition(lambda: not self._status.paused_by)
                    refreshed = await self._observe_job()
                    if refreshed is None:
                        return self._end(RecoveryState.GAVE_UP, "the scheduler no longer lists the job")
                    job = refreshed
                    continue
                watched = await self._watch(job)
                if watched is None:
                    return self._end(RecoveryState.GAVE_UP, "the scheduler no longer lists the job")
                job, pending, findings = watched
                continue
            if pending.kind is AnomalyKind.STRAGGLER:
                preset = await self._judge_straggler(job, pending)
                if preset is None:
                    pending = None
                    continue
                outcome = await self._recover(job, pending, findings, preset=preset)
            else:
                outcome = await self._recover(job, pending, findings)
            if outcome is not None:
                return outcome
            pending, findings = self._next_anomaly, self._next_findings
            job = self._last_job or job

    async def _watch(self, job: SlurmJob) -> tuple[SlurmJob, Anomaly | None, tuple[LogFinding, ...]] | None:
        """Wait for a change or an anomaly: the heartbeating watch, or a GPU fault signalled by a node agent."""
        handle = workflow.start_activity_method(
            WatchActivities.watch,
            JobWatchInput(
                job_id=self._inp.job_id,
                log_patterns=self._inp.spec.logs,
                offsets=self._status.log_offsets,
                poll_interval_s=self._inp.poll_interval_s,
                last_state=job.state,
                last_restart_count=job.restart_count,
                heartbeat_patterns=self._inp.spec.heartbeat,
                progress=self._progress,
                hang=self._hang_policy(),
                stragglers=self._inp.detection.stragglers,
                straggler_action=self._inp.spec.stragglers,
                reported_straggler_nodes=self._reported_stragglers,
            ),
            summary=f"Watch job {self._inp.job_id} ({job.state.value}): scheduler, rank logs, progress",
            **JOB_WATCH,
        )
        await workflow.wait_condition(lambda: handle.done() or bool(self._gpu_events) or bool(self._status.paused_by))
        if not handle.done() and self._status.paused_by:
            handle.cancel()
            with contextlib.suppress(ActivityError):
                await handle
            return job, None, ()
        if not handle.done():
            handle.cancel()
            with contextlib.suppress(ActivityError):  # TRY_CANCEL: resolves at once as cancelled
                await handle
            anomaly = build_anomaly(AnomalyKind.GPU_FAULT, workflow.now(), gpu_events=self._gpu_events)
            return job, anomaly, ()
        result = await handle
        self._status = self._status.model_copy(update={"log_offsets": result.offsets})
        if result.progress is not None:
            self._progress = result.progress
        self._hang, self._stragglers = result.hang, result.stragglers
        if result.outcome is WatchOutcome.GONE or result.job is None:
            return None
        self._observe(result.job, keep_nodes=result.outcome is WatchOutcome.ANOMALY)
        if result.outcome is WatchOutcome.CHANGED:
            if result.job.restart_count > job.restart_count:
                self._record("REQUEUED", f"requeued outside Rebound (restart {result.job.restart_count})")
                # A new attempt: its start-up (scheduling, model and checkpoint load) is not a hang.
                if self._progress is not None:
                    self._progress = note_restart(self._progress, workflow.now())
                self._reported_stragglers = ()
            self._record("CHANGED", f"job is {result.job.state.value} on {','.join(result.job.nodes) or '-'}")
            return result.job, None, ()
        return result.job, result.anomaly, result.findings

    async def _recover(
        self,
        job: SlurmJob,
        anomaly: Anomaly,
        findings: tuple[LogFinding, ...],
        *,
        preset: Attribution | None = None,
    ) -> JobRecoveryResult | None:
        """One incident: attribute, isolate, restart, verify. Returns a result only when the workflow ends.

        ``preset`` is an attribution already made (a straggler's), so no evidence is gathered again.
        """
        self._next_anomaly, self._next_findings, self._last_job = None, (), job
        expected_restarts = (
            self._status.restart_count
            if anomaly.kind is not AnomalyKind.NODE_FAILURE
            else min(self._status.restart_count, job.restart_count)
        )
        number = len(self._status.incidents) + 1 + self._carried_offset()
        incident = Incident(
            number=number,
            id=f"{self._inp.job_id}-{number}",
            detected_at=anomaly.observed_at,
            anomaly=anomaly,
            hang=self._hang if anomaly.kind is AnomalyKind.HANG else None,
            stragglers=self._stragglers if anomaly.kind is AnomalyKind.STRAGGLER else None,
        )
        self._put_incident(incident)
        self._set_state(RecoveryState.DETECTED, anomaly.summary, incident=number)
        if anomaly.kind is AnomalyKind.HANG:
            incident = await self._capture_hang_evidence(incident, job)

        if preset is not None:
            attribution, job_state = preset, None
        else:
            attribution, job_state = await self._attribute(job, anomaly, findings, incident)
        incident = self._put_incident(incident.model_copy(update={"attribution": attribution}))
        if job_state is JobState.CANCELLED:
            # Its ranks were stopped by scancel (their "Terminated" lines looked like a failure): not an incident.
            self._put_incident(incident.model_copy(update={"outcome": "cancelled by its owner"}))
            self._status = self._status.model_copy(update={"job_state": JobState.CANCELLED})
            return self._end(RecoveryState.FINISHED, "the job was cancelled by its owner")
        self._set_state(
            RecoveryState.ATTRIBUTED,
            f"{attribution.failure_class.value}/{attribution.cause} "
            f"nodes={','.join(attribution.implicated_nodes) or '-'} confidence={attribution.confidence:.2f}: "
            f"{attribution.explanation}",
            incident=number,
        )
        workflow.upsert_search_attributes(
            [CAUSE.value_set(attribution.cause), IMPLICATED_NODES.value_set(list(attribution.implicated_nodes))]
        )
        metrics.record_incident(incident)
        await self._tell(
            NotificationKind.INCIDENT,
            f"Job {self._inp.job_id}: {attribution.cause} ({attribution.failure_class.value})",
            f"{anomaly.summary}\n{attribution.explanation}",
            Severity.WARNING,
            nodes=", ".join(attribution.implicated_nodes) or "-",
            confidence=f"{attribution.confidence:.2f}",
        )
        if not attribution.retryable:
            self._put_incident(incident.model_copy(update={"outcome": "not retryable"}))
            return self._end(RecoveryState.GAVE_UP, f"not retryable ({attribution.cause}): {attribution.explanation}")
        if self._status.restarts_used >= self._status.restart_budget:
            self._put_incident(incident.model_copy(update={"outcome": "budget spent"}))
            return self._end(
                RecoveryState.GAVE_UP,
                f"restart budget spent ({self._status.restarts_used}/{self._status.restart_budget})",
            )

        self._set_state(
            RecoveryState.ISOLATING,
            f"asking the Fleet: drain {', '.join(attribution.implicated_nodes) or 'nothing'}, restart", number
        )  # fmt: skip
        decision = await self._ask_fleet(incident, job, attribution)
        incident = self._record_decision(incident, decision)
        if not decision.act:
            return self._observed(incident, job, decision)
        if not decision.restart_allowed:
            self._put_incident(incident.model_copy(update={"outcome": "restart rejected"}))
            return self._end(RecoveryState.GAVE_UP, f"the restart was not approved: {'; '.join(decision.reasons)}")

        pause = backoff_s(self._status.restarts_used)
        self._set_state(RecoveryState.RESTARTING, f"requeue excluding {','.join(decision.exclude) or '-'}"
                        + (f" after {pause:.0f} s backoff" if pause else ""), number)  # fmt: skip
        if pause:
            await workflow.sleep(pause, summary=f"backoff before restart {self._status.restarts_used + 1}")
        try:
            incident = await self._requeue(incident, job, decision.exclude, expected_restarts)
        except ActivityError as e:
            # Permanent refusals (a --no-requeue job, a job Slurm forgot): say so instead of failing the workflow.
            cause = e.cause
            kind = cause.type if isinstance(cause, ApplicationError) else type(cause).__name__
            self._put_incident(incident.model_copy(update={"outcome": f"requeue refused: {kind}"}))
            return self._end(RecoveryState.GAVE_UP, f"the job cannot be requeued ({kind}): {cause}")
        if self._status.job_state is JobState.CANCELLED:
            self._put_incident(incident.model_copy(update={"outcome": "cancelled by its owner"}))
            return self._end(RecoveryState.FINISHED, "the job was cancelled by its owner during recovery")
        # A new attempt: its first silence is a startup, not a hang; its stragglers are reported afresh.
        if self._progress is not None:
            self._progress = note_restart(self._progress, workflow.now())
        self._reported_stragglers = ()

        self._set_state(RecoveryState.VERIFYING, "waiting for the job to log a training step", number)
        resumed = await workflow.execute_activity_method(
            WatchActivities.wait_resume,
            WaitResumeInput(
                job_id=self._inp.job_id,
                log_patterns=self._inp.spec.logs,
                offsets=self._status.log_offsets,
                expected_restart_count=self._status.restart_count,
                not_before=incident.restarted_at,
            ),
            summary=f"Wait for job {self._inp.job_id} to train again",
            **WAIT_RESUME,
        )
        self._status = self._status.model_copy(update={"log_offsets": resumed.offsets})
        if resumed.job is not None:
            self._observe(resumed.job)
            self._last_job = resumed.job
        if resumed.outcome is ResumeOutcome.CANCELLED:
            self._put_incident(incident.model_copy(update={"outcome": "cancelled by its owner"}))
            return self._end(RecoveryState.FINISHED, "the job was cancelled by its owner during recovery")
        if resumed.outcome is ResumeOutcome.GONE:
            return self._end(RecoveryState.GAVE_UP, "the scheduler no longer lists the job")
        if resumed.outcome is ResumeOutcome.FAILED_AGAIN:
            self._put_incident(incident.model_copy(update={"outcome": "failed again before resuming"}))
            self._next_anomaly = build_anomaly(
                AnomalyKind.RANK_CRASH, resumed.observed_at, summary="the restarted job failed before it trained a step"
            )
            return None
        where = f" from {resumed.checkpoint}" if resumed.checkpoint else ""
        metrics.record_restart(attribution.cause)
        metrics.record_recovery_action(incident)
        await self._tell(
            NotificationKind.RESUMED,
            f"Job {self._inp.job_id} trains again",
            f"step {resumed.step}{where}, excluding {', '.join(decision.exclude) or 'no node'}",
            Severity.INFO,
        )
        self._put_incident(
            incident.model_copy(
                update={"resumed_at": resumed.observed_at, "resumed_from": resumed.checkpoint, "outcome": "resumed"}
            )
        )
        self._set_state(RecoveryState.WATCHING, f"training again at step {resumed.step}{where}", number)
        return None

    # ----- steps ---------------------------------------------------------------------------------------------------
    async def _attribute(
        self, job: SlurmJob, anomaly: Anomaly, findings: tuple[LogFinding, ...], incident: Incident
    ) -> tuple[Attribution, JobState | None]:
        nodes = job.nodes or self._status.nodes
        gpu_events = list(anomaly.gpu_events) + [e for e in self._gpu_events if e not in anomaly.gpu_events]
        self._gpu_events.clear()
        reports = await asyncio.gather(*(self._read_gpus(n) for n in nodes))
        # Only this attempt's GPU events: an XID from before it started is another job's story (and evidence
        # for the node's history, not for this failure).
        start = job.start_time or self._status.running_since or anomaly.observed_at
        for report in reports:
            if report is not None:
                gpu_events += [
                    e for e in report.events
                    if (start is None or e.observed_at is None or e.observed_at >= start) and e not in gpu_events
                ]  # fmt: skip
        result: AttributeResult = await workflow.execute_activity_method(
            AttributionActivities.attribute_failure,
            AttributeInput(
                job_id=self._inp.job_id,
                anomaly=anomaly,
                job_nodes=nodes,
                task_count=job.task_count,
                log_patterns=self._inp.spec.logs,
                offsets=self._status.log_offsets,
                findings=findings,
                gpu_events=tuple(gpu_events),
                hang=incident.hang,
                odd_ranks=incident.odd_ranks,
                processes=incident.processes,
                stack_summary=describe_stacks(incident.stacks) if incident.stacks else "",
            ),
            summary=f"Attribute: {anomaly.summary[:80]}",
            **ATTRIBUTE,
        )
        self._status = self._status.model_copy(update={"log_offsets": result.offsets})
        return result.attribution, result.job_state

    async def _capture_hang_evidence(self, incident: Incident, job: SlurmJob) -> Incident:
        """Before the hung job is killed: every rank's process state and stack, from each node's agent.

        A node whose agent does not answer is noted and skipped: evidence is worth seconds, not the restart.
        """
        nodes = job.nodes or self._status.nodes
        self._record("EVIDENCE", f"dumping the stacks of every rank on {', '.join(nodes) or '-'}", incident.number)
        found = await asyncio.gather(*(self._node_evidence(n) for n in nodes))
        processes: list[RankProcess] = []
        stacks: list[RankStack] = []
        notes: list[str] = []
        for node, (procs, dump) in zip(nodes, found, strict=True):
            if procs is not None:
                processes += procs.processes
            if dump is not None:
                stacks += dump.stacks
            if procs is None or dump is None or (dump.error and not dump.stacks):
                notes.append(f"{node}: {dump.error if dump is not None and dump.error else 'agent did not answer'}")
        stacks.sort(key=lambda st: st.rank)
        odd = tuple(odd_ranks(stacks))
        summary = describe_stacks(stacks) if stacks else "no stacks"
        self._record(
            "EVIDENCE",
            f"{sum(1 for st in stacks if st.text)} stack(s), {len(processes)} process(es); odd rank(s): "
            f"{', '.join(map(str, odd)) or 'none'}; {summary}"[:400]
            + (f"; {'; '.join(notes)}" if notes else ""),
            incident.number,
        )
        return self._put_incident(
            incident.model_copy(
                update={
                    "stacks": tuple(stacks)[:MAX_STACKS],
                    "processes": tuple(sorted(processes, key=lambda p: p.rank))[:MAX_STACKS],
                    "odd_ranks": odd,
                }
            )
        )

    async def _node_evidence(self, node: str) -> tuple[NodeProcessesResult | None, StackDumpResult | None]:
        timeout = self._inp.detection.stack_dump_timeout_s
        try:
            procs = await workflow.execute_activity_method(
                ProcsActivities.rank_processes,
                NodeProcessesInput(job_id=self._inp.job_id),
                task_queue=node_task_queue(node),
                summary=f"List job {self._inp.job_id}'s rank processes on {node}",
                start_to_close_timeout=timedelta(seconds=10),
                **NODE_AGENT_EVIDENCE,
            )
        except ActivityError:
            procs = None
        try:
            dump = await workflow.execute_activity_method(
                ProcsActivities.dump_stacks,
                StackDumpInput(job_id=self._inp.job_id, timeout_s=timeout),
                task_queue=node_task_queue(node),
                summary=f"Dump the stacks of job {self._inp.job_id}'s ranks on {node} (py-spy)",
                start_to_close_timeout=timedelta(seconds=4 * timeout + 10),
                **NODE_AGENT_EVIDENCE,
            )
        except ActivityError:
            dump = None
        return procs, dump

    async def _judge_straggler(self, job: SlurmJob, anomaly: Anomaly) -> Attribution | None:
        """Record a straggler incident; return its attribution only when the policy says to restart elsewhere."""
        verdict = self._stragglers
        if verdict is None:
            return None
        nodes = tuple(n.node for n in verdict.nodes if n.node)
        self._reported_stragglers = tuple(sorted({*self._reported_stragglers, *nodes}))
        reports = await asyncio.gather(*(self._read_gpus(n) for n in nodes))
        throttled: dict[str, list[str]] = {}
        for node, report in zip(nodes, reports, strict=True):
            for sample in report.samples if report is not None else ():
                reasons = slowdown_reasons(sample.clocks_event_reasons)
                if reasons:
                    throttled.setdefault(node, []).append(
                        f"GPU {sample.index}: {'+'.join(reasons)} (clocks_event_reasons="
                        f"{sample.clocks_event_reasons:#x}, {sample.temperature_c} C)"
                    )
        attribution = attribute_straggler(verdict, throttled)
        worst = max((r.slowdown for r in verdict.stragglers), default=1.0)
        restart = self._inp.spec.stragglers is StragglerAction.RESTART and restart_pays_off(
            worst, self._inp.detection.straggler_horizon_s, self._inp.detection.straggler_restart_cost_s
        )
        if restart:
            return attribution
        number = len(self._status.incidents) + 1 + self._carried_offset()
        self._put_incident(
            Incident(
                number=number,
                id=f"{self._inp.job_id}-{number}",
                detected_at=anomaly.observed_at,
                anomaly=anomaly,
                attribution=attribution,
                stragglers=verdict,
                outcome="reported (straggler action: report)"
                if self._inp.spec.stragglers is not StragglerAction.RESTART
                else f"reported: a {worst:.2f}x slowdown does not repay a restart",
            )
        )
        self._record("STRAGGLER", f"{attribution.explanation}", number)
        metrics.record_incident(self._status.incidents[-1])
        await self._tell(
            NotificationKind.STRAGGLER,
            f"Job {self._inp.job_id}: straggler on {', '.join(attribution.implicated_nodes) or '?'}",
            attribution.explanation,
            Severity.INFO,
        )
        workflow.upsert_search_attributes(
            [CAUSE.value_set(attribution.cause), IMPLICATED_NODES.value_set(list(attribution.implicated_nodes))]
        )
        return None

    def _hang_policy(self) -> HangPolicy:
        policy = self._inp.detection.hang
        if self._inp.spec.hang_after_s is not None:
            policy = policy.model_copy(update={"override_s": self._inp.spec.hang_after_s})
        return policy

    async def _read_gpus(self, node: str) -> GpuHealthReport | None:
        try:
            return await workflow.execute_activity_method(
                GpuActivities.read_gpu_health,
                NvmlReadGpuHealthInput(event_cursor=0),
                task_queue=node_task_queue(node),
                summary=f"Read GPU events of {node}",
                **NODE_AGENT_QUICK_READ,
            )
        except ActivityError:
            return None  # a dead agent is no evidence either way; the scheduler has its own word on the node

    async def _ask_fleet(self, incident: Incident, job: SlurmJob, attribution: Attribution) -> IsolationDecision:
        """Ask the cluster's Fleet (the single writer of quarantine) to drain the implicated nodes; wait for its answer.

        No answer in time is treated as observe mode: a Rebound that cannot reach its own safety limits acts on
        nothing rather than on everything.
        """
        wf_id = workflow.info().workflow_id
        req = IsolationRequest(
            request_id=f"{wf_id}/incident-{incident.number}",
            reply_to=wf_id,
            job_id=self._inp.job_id,
            partition=job.partition,
            incident=incident.id,
            cause=attribution.cause,
            failure_class=attribution.failure_class.value,
            confidence=attribution.confidence,
            nodes=attribution.implicated_nodes,
            restart_number=self._status.restarts_used + 1,
            requested_at=workflow.now(),
        )
        if req.request_id not in self._decisions:
            await workflow.execute_activity_method(
                FleetActivities.request_isolation,
                req,
                summary=f"Ask the Fleet: {attribution.cause} on {','.join(req.nodes) or 'no node'}",
                **FLEET_REQUEST,
            )
            self._record("FLEET", f"asked (request {req.request_id})", incident.number)
        try:
            await workflow.wait_condition(
                lambda: req.request_id in self._decisions,
                timeout=self._inp.fleet_answer_timeout_s,
                timeout_summary=f"the Fleet's answer to incident {incident.number} (may wait for an operator)",
            )
        except TimeoutError:
            return IsolationDecision(
                request_id=req.request_id,
                mode=FleetMode.OBSERVE,
                act=False,
                reasons=(f"the Fleet did not answer within {self._inp.fleet_answer_timeout_s:.0f} s",),
            )
        return self._decisions[req.request_id]

    def _record_decision(self, incident: Incident, decision: IsolationDecision) -> Incident:
        """The Fleet's drains as this incident's actions (verified by the Fleet), and its reasons in the timeline."""
        fleet_id = fleet_workflow_id(self._inp.cluster)
        at = decision.decided_at or workflow.now()
        actions = [
            ActionRecord(
                key=f"{fleet_id}/{decision.request_id}/drain-{node}",
                kind=ActionKind.DRAIN,
                target=node,
                decided_at=at,
                verified_at=at,
                result="drained by the Fleet",
            )
            for node in decision.drained
            if all(a.target != node or a.kind is not ActionKind.DRAIN for a in incident.actions)
        ]
        incident = self._put_incident(incident.model_copy(update={"actions": (*incident.actions, *actions)}))
        for node in decision.drained:
            self._record("DRAINED", f"{node}: drained by the Fleet", incident.number)
        detail = f"mode {decision.mode.value}; " + "; ".join(decision.reasons[:4])
        if decision.approvals:
            detail += f"; awaiting approval {', '.join(decision.approvals)} (rebound approve ID)"
        self._record("FLEET", detail, incident.number)
        return incident

    def _observed(self, incident: Incident, job: SlurmJob, decision: IsolationDecision) -> JobRecoveryResult | None:
        """Observe mode: the decision is recorded; nothing is drained or restarted."""
        self._put_incident(incident.model_copy(update={"outcome": f"observed only ({decision.mode.value} mode)"}))
        if job.state.is_terminal() or (self._status.job_state is not None and self._status.job_state.is_terminal()):
            return self._end(RecoveryState.FINISHED, f"the job failed; {decision.mode.value} mode: not restarted")
        # Still running (a hang, a silent fault): do not report the same silence again at once.
        if self._progress is not None:
            self._progress = note_restart(self._progress, workflow.now())
        self._set_state(RecoveryState.WATCHING, f"{decision.mode.value} mode: nothing done", incident.number)
        return None

    async def _requeue(
        self, incident: Incident, job: SlurmJob, exclude: tuple[str, ...], expected_restarts: int
    ) -> Incident:
        key = f"{workflow.info().workflow_id}/incident-{incident.number}/requeue"
        record = ActionRecord(key=key, kind=ActionKind.REQUEUE, target=str(self._inp.job_id), decided_at=workflow.now())
        incident = self._put_incident(incident.model_copy(update={"actions": (*incident.actions, record)}))
        # Reserve the restart before acting: a crash after this line never grants a free extra restart.
        self._status = self._status.model_copy(update={"restarts_used": self._status.restarts_used + 1})
        self._record("REQUEUE", f"decided (key {key}), restart {self._status.restarts_used}", incident.number)
        done = await workflow.execute_activity_method(
            SlurmActionActivities.requeue_job,
            RequeueInput(
                job_id=self._inp.job_id,
                exclude=exclude,
                expected_restart_count=expected_restarts,
                previous_nodes=job.nodes or self._status.nodes,
                key=key,
            ),
            summary=f"Requeue job {self._inp.job_id} excluding {','.join(exclude) or 'nobody'}",
            **CLUSTER_ACTION,
        )
        verified = record.model_copy(
            update={
                "verified_at": done.verified_at,
                "result": f"{done.state.value} restart {done.restart_count} excluded {','.join(done.excluded_nodes)}",
            }
        )
        self._status = self._status.model_copy(update={"restart_count": done.restart_count, "job_state": done.state})
        workflow.upsert_search_attributes([RESTART_COUNT.value_set(done.restart_count)])
        self._record("REQUEUED", verified.result, incident.number)
        incident = self._replace_action(incident, verified)
        return self._put_incident(incident.model_copy(update={"restarted_at": done.verified_at}))

    async def _observe_job(self) -> SlurmJob | None:
        first: ObserveJobResult = await workflow.execute_activity_method(
            SlurmActivities.observe_job,
            ObserveJobInput(job_id=self._inp.job_id),
            summary=f"Look up Slurm job {self._inp.job_id}",
            **SCHEDULER_READ,
        )
        if first.job is not None:
            self._observe(first.job)
            workflow.upsert_search_attributes([JOB_ID.value_set(str(first.job.job_id))])
        return first.job

    # ----- state helpers: record, never decide ------------------------------------------------------------------

    def _carried_offset(self) -> int:
        done = self._status.incidents
        return (done[0].number - 1) if done else 0

    def _carry(self) -> JobRecoveryInput:
        st = self._status.model_copy(
            update={"incidents": self._status.incidents[-MAX_CARRIED_INCIDENTS:], "runs": self._status.runs + 1}
        )
        return self._inp.model_copy(update={"carried": st, "carried_progress": self._progress})

    def _observe(self, job: SlurmJob, *, keep_nodes: bool = False) -> None:
        update: dict[str, object] = {
            "job_state": job.state,
            "job_name": job.name,
            "last_observed_at": workflow.now(),
        }
        if job.nodes or not keep_nodes:
            update["nodes"] = job.nodes or self._status.nodes
        if job.state is JobState.RUNNING and job.start_time is not None:
            update["running_since"] = job.start_time
        if not keep_nodes:
            update["restart_count"] = job.restart_count
        self._status = self._status.model_copy(update=update)

    def _put_incident(self, incident: Incident) -> Incident:
        others = tuple(i for i in self._status.incidents if i.number != incident.number)
        self._status = self._status.model_copy(
            update={"incidents": tuple(sorted((*others, incident), key=lambda i: i.number))}
        )
        return incident

    def _replace_action(self, incident: Incident, action: ActionRecord) -> Incident:
        actions = tuple(action if a.key == action.key else a for a in incident.actions)
        return self._put_incident(incident.model_copy(update={"actions": actions}))

    def _record(self, event: str, detail: str, incident: int | None = None) -> None:
        entry = TimelineEntry(at=workflow.now(), event=event, detail=detail, incident=incident)
        timeline = (*self._status.timeline, entry)[-200:]
        self._status = self._status.model_copy(update={"note": detail, "timeline": timeline})
        workflow.set_current_details(self._details_markdown())

    def _set_state(self, state: RecoveryState, detail: str, incident: int | None = None) -> None:
        self._status = self._status.model_copy(update={"state": state})
        workflow.upsert_search_attributes([RECOVERY_STATE.value_set(state.value)])
        self._record(state.value, detail, incident)

    def _end(self, state: RecoveryState, reason: str) -> JobRecoveryResult:
        self._set_state(state, reason)
        if state is RecoveryState.GAVE_UP:
            # Started, not awaited: a webhook never delays the end (an unsent message is logged by the worker).
            self._notify_later(NotificationKind.GAVE_UP, f"Rebound gave up on job {self._inp.job_id}", reason)
        return JobRecoveryResult(job_id=self._inp.job_id, state=state, reason=reason)

    async def _tell(self, kind: NotificationKind, title: str, text: str, severity: Severity, **fields: str) -> None:
        """A notification that never blocks or fails the recovery (``workflows.notify``)."""
        await notify(
            Notification(
                kind=kind,
                job_id=self._inp.job_id,
                cluster=self._inp.cluster,
                title=title[:300],
                text=text[:2000],
                severity=severity,
                fields=tuple(NotifyField(key=k, value=v[:2000]) for k, v in fields.items()),
            )
        )

    def _notify_later(self, kind: NotificationKind, title: str, text: str) -> None:
        self._pending_notes.append(
            Notification(
                kind=kind,
                job_id=self._inp.job_id,
                cluster=self._inp.cluster,
                title=title[:300],
                text=text[:2000],
                severity=Severity.CRITICAL,
            )
        )

    def _details_markdown(self) -> str:
        st = self._status
        rows = "\n".join(f"| {e.at:%H:%M:%S} | {e.event} | {e.detail[:160]} |" for e in st.timeline[-25:])
        return (
            f"## Job {st.job_id} ({st.job_name or 'unnamed'}): **{st.state.value}**\n\n"
            f"- Slurm state: {st.job_state.value if st.job_state else 'unknown'}\n"
            f"- nodes: {', '.join(st.nodes) or '-'}; restarts used: {st.restarts_used}/{st.restart_budget}\n\n"
            f"| time (UTC) | event | detail |\n|---|---|---|\n{rows}\n"
        )
