"""JobRecovery: one durable workflow per monitored job (id ``rebound/{cluster}/job/{job_id}``).

WATCHING -> DETECTED -> ATTRIBUTED -> ISOLATING -> RESTARTING -> VERIFYING -> WATCHING, ending FINISHED or GAVE_UP.
This class only sequences: the incident's ``steps`` start activities (through ``scheduler``, ``evidence``,
``fleet_exchange``), ``workflows.policy.recovery`` decides every branch, and the ``Recorder`` holds the one
``JobRecoveryState``, changed through the pure ``ledger`` and ``state`` functions and carried whole across
continue-as-new. Every action is recorded (with its idempotency key) before it is taken, and every activity is
idempotent, so a crash of the worker or of the Temporal server at any point leads to the action being done once.

The order of activities, timers and search-attribute upserts is what running workflows replay against: change
it only the way the replay ADR says (``workflow.patched``), never by moving a call.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import workflows.job_recovery.checkpoints as checkpoints
    import workflows.job_recovery.gpu_gate as gpu_gate
    import workflows.job_recovery.ledger as ledger
    import workflows.job_recovery.liveness as liveness
    import workflows.job_recovery.owner as owner
    import workflows.job_recovery.ranks as ranks
    import workflows.job_recovery.resubmit as resubmission
    import workflows.job_recovery.scheduler as scheduler
    import workflows.job_recovery.state as state
    import workflows.job_recovery.steps as steps
    import workflows.job_recovery.watching as watching
    from workflows import operator_gate
    from workflows.constants import (
        GPU_FAULT_REPORTED_SIGNAL,
        ISOLATION_DECIDED_SIGNAL,
        JOB_ID,
        JOB_RECOVERY_WORKFLOW,
        OPERATOR_REQUEST_UPDATE,
        PAUSE_UPDATE,
        RESUME_UPDATE,
        STATUS_QUERY,
        WATCH_RETURNED_SIGNAL,
    )
    from workflows.domain.anomaly import build_anomaly
    from workflows.domain.fleet import IsolationDecision
    from workflows.domain.gpu import GpuEvent
    from workflows.domain.incident import Anomaly, AnomalyKind, Attribution, LogFinding
    from workflows.domain.loop import JobWatchInput, JobWatchResult, WatchOutcome
    from workflows.domain.operators import OperatorActionKind, OperatorRequest
    from workflows.domain.recovery import (
        JobRecoveryInput,
        JobRecoveryResult,
        JobRecoveryStatus,
        PauseRequest,
        RecoveryState,
    )
    from workflows.domain.slurm import JobState, SlurmJob
    from workflows.domain.watch_hub import WatchEvent
    from workflows.domain.watch_routing import WatchRouting, shard_of
    from workflows.history import continue_as_new_due
    from workflows.job_recovery.recorder import Recorder
    from workflows.notify import notify
    from workflows.policy.recovery import (
        cancelled_by_owner,
        expected_restart_count,
        give_up_before_isolating,
        job_over,
        restart_rejected,
        scheduler_forgot,
        unknown_job,
    )

#: Patch id (docs/adr/012): anchor the log offsets before the first watch (``scheduler.anchor_logs``).
ANCHOR_LOGS_PATCH = "11-anchor-logs-before-first-watch"
#: Continue as new once the history passes Rebound's own bound, not only when the server suggests it.
HISTORY_BOUND_PATCH = "12-job-history-bound"
#: The unsigned pause/resume (before operators were authenticated) refuse new calls; recorded histories replay.
_UNSIGNED = (
    "unsigned pause/resume is refused: operators use `rebound pause|resume JOB`, which signs the action with "
    "MUNGE (update operator_request); a job's owner pauses monitoring from the job's comment"
)

#: What the watch hands over: the job as last seen, the anomaly (None: only a change), the log findings with it.
Watched = tuple[SlurmJob, Anomaly | None, tuple[LogFinding, ...]]


@workflow.defn(name=JOB_RECOVERY_WORKFLOW)
class JobRecoveryWorkflow:
    """Keeps one training job making progress."""

    @workflow.init
    def __init__(self, inp: JobRecoveryInput) -> None:
        self._inp = inp
        self._rec = Recorder(inp)
        self._rank_look: asyncio.Task[None] | None = None
        self._hub = watching.HubWatch()

    # ----- messages --------------------------------------------------------------------------------------------
    @workflow.signal(
        name=GPU_FAULT_REPORTED_SIGNAL,
        description="A node agent saw a GPU fault (XID, lost GPU, DBE) on a node this job runs on.",
    )
    def gpu_fault_reported(self, event: GpuEvent) -> None:
        self._rec.state = state.take_gpu_event(self._rec.state, event)

    @workflow.signal(
        name=ISOLATION_DECIDED_SIGNAL,
        description="The Fleet's answer: nodes it drained, nodes to exclude, whether to act at all.",
    )
    def isolation_decided(self, decision: IsolationDecision) -> None:
        if state.decision_for(self._rec.state, decision.request_id) is not None:
            # A later word on an answered request: drains an operator approved, recorded in their incident (one
            # carried out of the ledger by continue-as-new keeps its record in the Fleet's state).
            number = state.incident_of_request(self._rec.state, decision.request_id)
            if number is not None:
                self._rec.record_decision(number, decision)
        self._rec.state = state.take_decision(self._rec.state, decision)

    @workflow.signal(
        name=WATCH_RETURNED_SIGNAL,
        description="The watch hub's finding for this job's subscription (ADR 015); duplicates are ignored.",
    )
    def watch_returned(self, event: WatchEvent) -> None:
        self._hub.take(event)

    @workflow.update(
        name=PAUSE_UPDATE, description="Unsigned pause (before operators were authenticated): refused for new calls."
    )
    def pause(self, req: PauseRequest) -> JobRecoveryStatus:
        self._pause(req.operator, req.note)
        return self._rec.status

    @pause.validator
    def _validate_pause(self, req: PauseRequest) -> None:
        raise ValueError(_UNSIGNED)

    @workflow.update(
        name=RESUME_UPDATE, description="Unsigned resume (before operators were authenticated): refused for new calls."
    )
    def resume(self, req: PauseRequest) -> JobRecoveryStatus:
        self._resume(req.operator, req.note)
        return self._rec.status

    @resume.validator
    def _validate_resume(self, req: PauseRequest) -> None:
        raise ValueError(_UNSIGNED)

    @workflow.update(
        name=OPERATOR_REQUEST_UPDATE,
        description="An operator's pause or resume of monitoring, signed with MUNGE (rebound pause|resume JOB).",
    )
    async def operator_request(self, req: OperatorRequest) -> JobRecoveryStatus:
        rec = self._rec
        verified = await operator_gate.admit(
            lambda: rec.state.auth, lambda a: rec.update(auth=a), req, lambda: self._operator_refusal(req)
        )
        if req.action.kind is OperatorActionKind.PAUSE:
            self._pause(verified.user, req.action.note)
        else:
            self._resume(verified.user, req.action.note)
        return rec.status

    @operator_request.validator
    def _validate_operator_request(self, req: OperatorRequest) -> None:
        operator_gate.precheck(self._rec.state.auth, req, self._operator_refusal(req))

    def _operator_refusal(self, req: OperatorRequest) -> str | None:
        action = req.action
        if action.kind not in (OperatorActionKind.PAUSE, OperatorActionKind.RESUME):
            return f"{action.kind.value} is the Fleet's action, not a job's"
        if action.cluster != self._inp.cluster or action.job_id not in (self._inp.job_id, self._rec.inp.job_id):
            return f"the action is for job {action.job_id} of {action.cluster}, not this one"
        return None

    def _pause(self, who: str, note: str) -> None:
        self._rec.update_status(paused_by=who)
        self._rec.record("PAUSED", f"by {who}" + (f": {note}" if note else ""))

    def _resume(self, who: str, note: str) -> None:
        self._rec.update_status(paused_by="")
        self._rec.record("RESUMED", f"monitoring resumed by {who}" + (f": {note}" if note else ""))

    @workflow.query(
        name=STATUS_QUERY, description="Where the job is in the recovery loop, with incidents and their timeline."
    )
    def status(self) -> JobRecoveryStatus:
        return self._rec.status

    # ----- the loop ----------------------------------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: JobRecoveryInput) -> JobRecoveryResult:
        result = await self._loop(inp)
        for note in self._rec.state.pending_notes:
            # A bounded head start: an activity still pending when the run completes would be dropped.
            await notify(note, wait=timedelta(seconds=5))
        return result

    async def _loop(self, inp: JobRecoveryInput) -> JobRecoveryResult:
        rec = self._rec
        job = await self._observe_job()
        if job is None:
            return rec.end(unknown_job(inp.job_id))
        if inp.carried is None:
            # What the job excludes before Rebound ever restarted it is its owner's: kept in every restart.
            rec.update(user_excluded_nodes=job.excluded_nodes)
            rec.set_state(RecoveryState.WATCHING, f"watching job {inp.job_id} ({job.state.value})")
        await resubmission.capture(rec, job)
        pending: Anomaly | None = None
        findings: tuple[LogFinding, ...] = ()
        while True:
            if pending is None:
                if continue_as_new_due(HISTORY_BOUND_PATCH):
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    # rec.inp: after a resubmission the input names the job this lineage runs as now (ADR 014).
                    workflow.continue_as_new(rec.inp.model_copy(update={"carried": state.carry(rec.state)}))
                over = job_over(job.state)
                if over is not None:
                    return rec.end(over)
                if rec.status.paused_by:
                    await workflow.wait_condition(lambda: not rec.status.paused_by)
                    refreshed = await self._observe_job()
                    if refreshed is None:
                        return rec.end(scheduler_forgot())
                    job = refreshed
                    continue
                watched = await self._watch(job)
                if watched is None:
                    return rec.end(scheduler_forgot())
                job, pending, findings = watched
                continue
            if pending.kind is AnomalyKind.GPU_FAULT and workflow.patched(gpu_gate.PATCH):
                pending = await gpu_gate.confirmed_gpu_anomaly(rec, pending)
                if pending is None:  # only claims: no incident, back to watching
                    continue
            preset: Attribution | None = None
            if pending.kind is AnomalyKind.STRAGGLER:
                preset = await steps.judge_straggler(rec, pending)
                if preset is None:  # reported, not restarted
                    pending = None
                    continue
            outcome = await self._recover(job, pending, findings, preset=preset)
            if outcome is not None:
                return outcome
            # The restarted job failed again: the next incident starts at once, on the new attempt's own lines.
            pending, findings = rec.state.next_anomaly, rec.state.next_findings
            job = rec.state.last_job or job

    async def _watch(self, job: SlurmJob) -> Watched | None:
        """Wait for a change or an anomaly: the heartbeating watch, or a GPU fault signalled by a node agent."""
        rec = self._rec
        if not rec.status.log_offsets and workflow.patched(ANCHOR_LOGS_PATCH):
            # Anchored before the watch starts: a first watch cancelled by a GPU signal hands back no offsets, and
            # the attribution would anchor afresh at the files' sizes, skipping what the job wrote meanwhile.
            anchored = await scheduler.anchor_logs(rec.inp, job)
            if anchored is not None:
                rec.update_status(log_offsets=anchored)
        watch = scheduler.watch_input(rec.inp, rec.state, job)
        if rec.inp.detection.silent_sample_s > 0 and workflow.patched(liveness.PATCH_LIVENESS):
            every, _ = liveness.interval(rec, rec.state.liveness)
            watch = watch.model_copy(update={"sample_after_s": every})
        routing = rec.inp.watch_hub
        if routing is not None and workflow.patched(watching.HUB_PATCH):
            result = await self._watch_in_hub(job, watch, routing)
            if result is None:
                return (job, None, ()) if rec.status.paused_by else (job, self._gpu_anomaly(), ())
            return await self._watched(job, result)
        handle = scheduler.start_watch(watch, job)
        self._look_at_ranks(job)
        await workflow.wait_condition(lambda: handle.done() or bool(rec.state.gpu_events) or bool(rec.status.paused_by))
        if not handle.done():
            paused = bool(rec.status.paused_by)
            handle.cancel()
            with contextlib.suppress(ActivityError):  # TRY_CANCEL: resolves at once as cancelled
                await handle
            return (job, None, ()) if paused else (job, self._gpu_anomaly(), ())
        return await self._watched(job, await handle)

    async def _watch_in_hub(self, job: SlurmJob, watch: JobWatchInput, routing: WatchRouting) -> JobWatchResult | None:
        """The watch through the job's shard hub: its result, or None when a GPU fault or a pause came first."""
        rec = self._rec
        shard = shard_of(watch.job_id, routing.shards)
        if shard != self._hub.shard:
            rec.record("WATCHED", f"watched by shard {shard} of {routing.shards}")
        self._look_at_ranks(job)
        return await self._hub.watch(watch, routing, lambda: bool(rec.state.gpu_events) or bool(rec.status.paused_by))

    async def _watched(self, job: SlurmJob, result: JobWatchResult) -> Watched | None:
        """What a watch found (the per-job activity's result or the hub's event), recorded."""
        rec = self._rec
        rec.update_status(log_offsets=result.offsets)
        progress = result.progress if result.progress is not None else rec.state.progress
        rec.update(progress=progress, hang=result.hang, stragglers=result.stragglers)
        if result.outcome is WatchOutcome.GONE or result.job is None:
            return None
        rec.observe(result.job, keep_nodes=result.outcome is WatchOutcome.ANOMALY)
        if result.outcome is WatchOutcome.SAMPLE:
            return result.job, await liveness.sample(rec, result.job), ()
        if result.outcome is not WatchOutcome.CHANGED:
            return result.job, result.anomaly, result.findings
        if result.job.restart_count > job.restart_count:
            rec.record("REQUEUED", f"requeued outside Rebound (restart {result.job.restart_count})")
            rec.state = state.new_attempt(rec.state, workflow.now())
        rec.record("CHANGED", f"job is {result.job.state.value} on {','.join(result.job.nodes) or '-'}")
        return result.job, None, ()

    def _look_at_ranks(self, job: SlurmJob) -> None:
        """Beside the watch: place the attempt's ranks while they run (``job_recovery.ranks``), once per attempt."""
        if self._rank_look is not None and not self._rank_look.done():
            return
        if ranks.wanted(self._rec, job) and workflow.patched(ranks.RANK_MAP_CAPTURE):
            self._rank_look = asyncio.create_task(ranks.capture(self._rec, job))

    def _gpu_anomaly(self) -> Anomaly:
        """The signalled GPU faults as one anomaly, dated by the first."""
        return build_anomaly(AnomalyKind.GPU_FAULT, workflow.now(), gpu_events=self._rec.state.gpu_events)

    async def _recover(
        self, job: SlurmJob, anomaly: Anomaly, findings: tuple[LogFinding, ...], *, preset: Attribution | None
    ) -> JobRecoveryResult | None:
        """One incident: attribute, isolate, restart, verify. Returns a result only when the workflow ends.

        ``preset`` is an attribution already made (a straggler's), so no evidence is gathered again.
        """
        rec = self._rec
        rec.update(next_anomaly=None, next_findings=(), last_job=job)
        expected = expected_restart_count(anomaly.kind, rec.status.restart_count, job.restart_count)
        number = await steps.detect(rec, job, anomaly)
        if preset is not None:
            attribution, job_state = preset, None
        else:
            attribution, job_state = await steps.attribute(rec, job, anomaly, findings, number)
        if job_state is not JobState.CANCELLED and workflow.patched(checkpoints.PATCH_RECORD):
            attribution = await checkpoints.record_before_restart(rec, number, job, attribution, findings)
        rec.set_status(ledger.set_attribution(rec.status, number, attribution))
        if job_state is JobState.CANCELLED:
            # Its ranks were stopped by scancel (their "Terminated" lines looked like a failure): not an incident.
            rec.update_status(job_state=JobState.CANCELLED)
            return rec.end(cancelled_by_owner(during_recovery=False), number)
        await steps.announce(rec, number, anomaly, attribution)
        stop = give_up_before_isolating(attribution, rec.status.restarts_used, rec.status.restart_budget)
        if stop is not None:
            return rec.end(stop, number)
        if workflow.patched(owner.PATCH) and (paused := await owner.paused_by_owner(rec, number)) is not None:
            return paused.result
        decision = await steps.isolate(rec, number, job, attribution)
        if not decision.act:
            return steps.observed(rec, number, job, decision)
        stop = restart_rejected(decision)
        if stop is None and workflow.patched(checkpoints.PATCH_RECORD):
            await checkpoints.quarantine(rec, number, job)
        if stop is None:
            stop = await steps.restart(rec, number, job, decision.exclude, expected)
        if stop is not None:
            return rec.end(stop, number)
        return await steps.verify(rec, number, attribution, decision)

    async def _observe_job(self) -> SlurmJob | None:
        job = await scheduler.observe_job(
            self._rec.inp.job_id, note=lambda detail: self._rec.record("SCHEDULER_AUTH", detail)
        )
        if job is not None:
            self._rec.observe(job)
            workflow.upsert_search_attributes([JOB_ID.value_set(str(job.job_id))])
        return job
