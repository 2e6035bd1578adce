"""One incident's steps, in the order JobRecovery takes them: detect, attribute, announce, isolate, restart, verify.

Each step starts its activities (through ``evidence``, ``fleet_exchange``, ``scheduler``), asks
``workflows.policy.recovery`` what follows, and records through the ``Recorder``. The order of activities, timers
and upserts in here is what running workflows replay against (see the workflow's module docstring).
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    import workflows.job_recovery.checkpoints as checkpoints
    import workflows.job_recovery.evidence as evidence
    import workflows.job_recovery.fleet_exchange as fleet_exchange
    import workflows.job_recovery.ledger as ledger
    import workflows.job_recovery.liveness as liveness
    import workflows.job_recovery.resubmit as resubmission
    import workflows.job_recovery.scheduler as scheduler
    import workflows.job_recovery.state as state
    from workflows import metrics
    from workflows.constants import RESTART_COUNT, isolation_request_id
    from workflows.domain.fleet import IsolationDecision
    from workflows.domain.gpu import NodeGpuVerdict
    from workflows.domain.incident import (
        ActionKind,
        ActionRecord,
        ActionRung,
        Anomaly,
        AnomalyKind,
        Attribution,
        LogFinding,
    )
    from workflows.domain.loop import AttributeInput
    from workflows.domain.notify import NotificationKind, Severity
    from workflows.domain.recovery import JobRecoveryResult, RecoveryState
    from workflows.domain.slurm import JobState, SlurmJob
    from workflows.job_recovery.recorder import Recorder
    from workflows.policy.action_ladder import describe_evidence
    from workflows.policy.budget import backoff_s
    from workflows.policy.gpu_claims import confirm_gpu_events
    from workflows.policy.gpu_merge import dcgm_evidence
    from workflows.policy.implicit import attribute_straggler
    from workflows.policy.rank_map import merge_maps
    from workflows.policy.recovery import (
        Ending,
        after_observe,
        after_requeue,
        after_resume,
        attempt_gpu_events,
        note_unread_agents,
        requeue_refused,
        resumed_note,
        straggler_choice,
        throttled_gpus,
        verify_signals,
    )
    from workflows.policy.restart_strategy import RestartStrategy, cannot_restart, choose_restart
    from workflows.policy.stacks import describe_stacks

#: Requests carry the action ladder's rung (a suspicion is not a drain) and the job keeps its standing exclusion
#: across restarts; histories from before sent every request as a drain request and excluded only the Fleet's nodes.
ACTION_LADDER_PATCH = "job-action-ladder"

__all__ = [
    "ACTION_LADDER_PATCH",
    "RANK_MAP_AT_ATTRIBUTION",
    "announce",
    "attribute",
    "detect",
    "isolate",
    "judge_straggler",
    "observed",
    "restart",
    "verify",
]

#: Patch id (ADR 012): attribution asks the node agents which rank runs where, beside the GPU reads.
RANK_MAP_AT_ATTRIBUTION = "rank-map-at-attribution"
#: Signalled GPU faults are evidence only when the node's agent lists them in the fresh read (issue 13:
#: ``workflows.policy.gpu_claims``); histories from before weighed every signalled event.
CONFIRM_GPU_SIGNALS_PATCH = "13-confirm-signalled-gpu-events"
#: Attribution reads the job nodes' DCGM exporters beside NVML (issue 14) and weighs one merged verdict per GPU;
#: histories from before read NVML only.
DCGM_EVIDENCE_PATCH = "14-dcgm-evidence"


async def detect(rec: Recorder, job: SlurmJob, anomaly: Anomaly) -> int:
    """Open the incident; for a hang, take every rank's evidence before anything kills it. Returns its number."""
    status, number = ledger.open_incident(
        rec.status,
        anomaly=anomaly,
        hang=rec.state.hang if anomaly.kind is AnomalyKind.HANG else None,
        stragglers=rec.state.stragglers if anomaly.kind is AnomalyKind.STRAGGLER else None,
    )
    rec.set_status(status)
    rec.set_state(RecoveryState.DETECTED, anomaly.summary, number)
    if anomaly.kind is AnomalyKind.HANG:
        nodes = job.nodes or rec.status.nodes
        rec.record("EVIDENCE", f"dumping the stacks of every rank on {', '.join(nodes) or '-'}", number)
        found = await evidence.hang_evidence(rec.inp.job_id, nodes, rec.inp.detection.stack_dump_timeout_s)
        rec.record("EVIDENCE", found.detail, number)
        rec.set_status(
            ledger.add_hang_evidence(
                rec.status, number, stacks=found.stacks, processes=found.processes, odd_ranks=found.odd_ranks
            )
        )
    return number


async def attribute(
    rec: Recorder, job: SlurmJob, anomaly: Anomaly, findings: tuple[LogFinding, ...], number: int
) -> tuple[Attribution, JobState | None]:
    """Who is to blame, from the logs, the nodes' GPU reads and the incident's evidence; and the job's state."""
    nodes = job.nodes or rec.status.nodes
    rec.state, signalled = state.take_gpu_events(rec.state)
    ranks = None
    if workflow.patched(RANK_MAP_AT_ATTRIBUTION):
        # Ranks still alive on the healthy nodes place themselves now; those that died keep the attempt's map.
        reports, fresh = await asyncio.gather(evidence.read_all_gpus(nodes), evidence.rank_map(rec.inp.job_id, nodes))
        ranks = merge_maps(fresh, rec.state.rank_map)
    else:
        reports = await evidence.read_all_gpus(nodes)
    start = job.start_time or rec.status.running_since or anomaly.observed_at
    if workflow.patched(CONFIRM_GPU_SIGNALS_PATCH):
        # A signalled GPU fault counts only if the node's own agent lists it in the fresh read just made.
        by_node = dict(zip(nodes, reports, strict=True))
        from_anomaly, notes = confirm_gpu_events(anomaly.gpu_events, by_node)
        signalled, more = confirm_gpu_events(signalled, by_node)
        anomaly = anomaly.model_copy(update={"gpu_events": from_anomaly})
        for note in (*notes, *more):
            rec.record("GPU_CLAIM", note, number)
    verdicts: tuple[NodeGpuVerdict, ...] = ()
    if workflow.patched(DCGM_EVIDENCE_PATCH):
        # NVML's samples go in without their events: attribution weighs this attempt's events itself (below).
        samples_only = [r.model_copy(update={"events": ()}) if r is not None else None for r in reports]
        verdicts, dcgm_notes = dcgm_evidence(nodes, await evidence.read_dcgm(nodes, samples_only))
        for note in dcgm_notes:
            rec.record("GPU_VERDICT", note, number)
    incident = rec.incident(number)
    result = await evidence.attribute(
        AttributeInput(
            job_id=rec.inp.job_id,
            anomaly=anomaly,
            job_nodes=nodes,
            task_count=job.task_count,
            log_patterns=rec.inp.spec.logs,
            offsets=rec.status.log_offsets,
            findings=findings,
            gpu_events=attempt_gpu_events(anomaly, signalled, reports, start),
            gpu_verdicts=verdicts,
            hang=incident.hang,
            odd_ranks=incident.odd_ranks,
            processes=incident.processes,
            stack_summary=describe_stacks(incident.stacks) if incident.stacks else "",
            rank_map=ranks,
        )
    )
    rec.update_status(log_offsets=result.offsets)
    # A node whose agent did not answer was not looked at: say so (pure, no command: replay-safe).
    return note_unread_agents(result.attribution, nodes, reports), result.job_state


async def announce(rec: Recorder, number: int, anomaly: Anomaly, attribution: Attribution) -> None:
    """The attribution in the timeline, the search attributes, the metrics and a notification."""
    rec.set_state(
        RecoveryState.ATTRIBUTED,
        f"{attribution.failure_class.value}/{attribution.cause} "
        f"nodes={','.join(attribution.implicated_nodes) or '-'} confidence={attribution.confidence:.2f}: "
        f"{attribution.explanation}",
        number,
    )
    rec.upsert_cause(attribution)
    metrics.record_incident(rec.incident(number))
    await rec.tell(
        NotificationKind.INCIDENT,
        f"Job {rec.inp.job_id}: {attribution.cause} ({attribution.failure_class.value})",
        f"{anomaly.summary}\n{attribution.explanation}",
        Severity.WARNING,
        nodes=", ".join(attribution.implicated_nodes) or "-",
        confidence=f"{attribution.confidence:.2f}",
    )


async def isolate(rec: Recorder, number: int, job: SlurmJob, attribution: Attribution) -> IsolationDecision:
    """Ask the cluster's Fleet to drain the implicated nodes (or, on the action ladder's exclude rung, to record a
    suspicion) and restart; wait for (and record) its answer.

    Returns the decision as the job acts on it: the Fleet's exclusion plus the job's standing one (its suspects
    from earlier incidents), which the job keeps across its restarts.
    """
    ladder = workflow.patched(ACTION_LADDER_PATCH)
    nodes = ", ".join(attribution.implicated_nodes) or "nothing"
    ask = f"drain {nodes}, restart"
    if ladder and attribution.action is ActionRung.EXCLUDE:
        ask = f"exclude {nodes} from this job's next placement (a suspicion, not a drain), restart"
    rec.set_state(RecoveryState.ISOLATING, f"asking the Fleet: {ask}", number)
    placement = None
    if ladder:
        needs = job.node_count or len(job.nodes or rec.status.nodes)
        # After the restart the job excludes its owner's nodes and its standing ones (stale ones are dropped);
        # without a recorded owner's exclusion, everything it excludes now stays, counted as standing.
        own = rec.state.user_excluded_nodes
        standing = rec.state.excluded_nodes
        if own is None:
            standing, own = tuple(dict.fromkeys((*standing, *job.excluded_nodes))), ()
        placement = fleet_exchange.Placement(needs, standing, own, job.gpus_per_node, job.cpus_per_node)
    req = fleet_exchange.isolation_request(
        workflow_id=workflow.info().workflow_id,
        job_id=rec.inp.job_id,
        partition=job.partition,
        incident=rec.incident(number),
        attribution=attribution,
        restart_number=rec.status.restarts_used + 1,
        now=workflow.now(),
        placement=placement,
        user=job.user,  # the scheduler's owner of the job: one user's jobs alone never drain a node for everyone
    )
    if state.decision_for(rec.state, req.request_id) is None:
        await fleet_exchange.send_request(req)
        rec.record("FLEET", f"asked (request {req.request_id})", number)

    def confirmed(record: IsolationDecision | None, signalled: IsolationDecision) -> None:
        rec.state = state.confirm_decision(rec.state, record, signalled)
        if record is None:
            rec.record("FLEET", "ignored an answer the Fleet has no record of (not the Fleet's: forged?)", number)

    decision = await fleet_exchange.await_decision(
        req,
        lambda: state.decision_for(rec.state, req.request_id),
        timeout_s=rec.inp.fleet_answer_timeout_s,
        number=number,
        confirmed=confirmed,
    )
    rec.record_decision(number, decision)
    if not ladder or not decision.act:
        return decision
    return _with_standing_exclusion(rec, number, attribution, decision)


def _with_standing_exclusion(
    rec: Recorder, number: int, attribution: Attribution, decision: IsolationDecision
) -> IsolationDecision:
    """Keep the job's standing exclusion (the Fleet's word on it) and say what this incident added, and why."""
    standing = decision.job_exclusion if decision.job_exclusion is not None else rec.state.excluded_nodes
    added = [n for n in decision.suspected if n in decision.exclude]
    rec.update(excluded_nodes=standing)
    if added:
        rec.record(
            "EXCLUDED",
            f"excluded {', '.join(added)} from job {rec.inp.job_id}'s next placement: {attribution.explanation}: "
            f"{describe_evidence(attribution.basis)}; suspicion recorded",
            number,
        )
    exclude = tuple(dict.fromkeys((*decision.exclude, *standing)))
    return decision.model_copy(update={"exclude": exclude})


def observed(rec: Recorder, number: int, job: SlurmJob, decision: IsolationDecision) -> JobRecoveryResult | None:
    """Observe mode: the decision is recorded; nothing is drained or restarted."""
    then = after_observe(decision, job.state, rec.status.job_state)
    rec.set_status(ledger.set_outcome(rec.status, number, then.outcome))
    if then.ending is not None:
        return rec.end(then.ending)
    # Still running (a hang, a silent fault): do not report the same silence again at once.
    rec.state = state.restart_hang_clock(rec.state, workflow.now())
    rec.set_state(RecoveryState.WATCHING, then.note, number)
    return None


async def restart(rec: Recorder, number: int, job: SlurmJob, exclude: tuple[str, ...], expected: int) -> Ending | None:
    """Back off, requeue (or resubmit) without ``exclude``; an ending when refused or the job was cancelled."""
    choice = choose_restart(
        rec.inp.spec.restart, requeue_allowed=job.requeue_allowed, submission_captured=rec.state.submission is not None
    )
    # Only a job that is not requeued takes the patched branch: requeue histories replay unchanged (ADR 012).
    resubmitting = choice.strategy is not RestartStrategy.REQUEUE and workflow.patched(resubmission.RESUBMIT_PATCH)
    pause = backoff_s(rec.status.restarts_used, rec.inp.detection.restart_backoff_s)
    backoff = f" after {pause:.0f} s backoff" if pause else ""
    how = "resubmit" if resubmitting else "requeue"
    rec.set_state(RecoveryState.RESTARTING, f"{how} excluding {','.join(exclude) or '-'}{backoff}", number)
    if resubmitting and choice.strategy is None:
        return cannot_restart(choice.reason)
    if pause:
        await workflow.sleep(pause, summary=f"backoff before restart {rec.status.restarts_used + 1}")
    if resubmitting:
        return await resubmission.resubmit(rec, number, job, exclude)
    try:
        await _requeue(rec, number, job, exclude, expected)
    except ActivityError as e:
        # Permanent refusals (a --no-requeue job, a job Slurm forgot): say so instead of failing the workflow.
        cause = e.cause
        kind = cause.type if isinstance(cause, ApplicationError) else type(cause).__name__
        return requeue_refused(str(kind), str(cause))
    stop = after_requeue(rec.status.job_state)
    if stop is None:
        rec.state = state.new_attempt(rec.state, workflow.now())
    return stop


async def _requeue(rec: Recorder, number: int, job: SlurmJob, exclude: tuple[str, ...], expected: int) -> None:
    """Record the requeue (and reserve the restart), do it, record what the scheduler verified."""
    # Keyed under the incident's isolation request: one requeue per incident, whatever replays or retries.
    key = f"{isolation_request_id(workflow.info().workflow_id, number)}/requeue"
    decided = ActionRecord(key=key, kind=ActionKind.REQUEUE, target=str(rec.inp.job_id), decided_at=workflow.now())
    rec.set_status(ledger.add_action(rec.status, number, decided))
    # Reserve the restart before acting: a crash after this line never grants a free extra restart.
    rec.update_status(restarts_used=rec.status.restarts_used + 1)
    rec.record("REQUEUE", f"decided (key {key}), restart {rec.status.restarts_used}", number)
    done = await scheduler.requeue(
        rec.inp.job_id,
        exclude=exclude,
        expected_restarts=expected,
        previous_nodes=job.nodes or rec.status.nodes,
        key=key,
        user_excluded=rec.state.user_excluded_nodes,
    )
    verified = decided.model_copy(
        update={
            "verified_at": done.verified_at,
            "result": f"{done.state.value} restart {done.restart_count} excluded {','.join(done.excluded_nodes)}",
        }
    )
    rec.update_status(restart_count=done.restart_count, job_state=done.state)
    workflow.upsert_search_attributes([RESTART_COUNT.value_set(done.restart_count)])
    rec.record("REQUEUED", verified.result, number)
    rec.set_status(ledger.mark_restarted(ledger.replace_action(rec.status, number, verified), number, done.verified_at))


async def verify(
    rec: Recorder, number: int, attribution: Attribution, decision: IsolationDecision
) -> JobRecoveryResult | None:
    """Wait for the restarted job to train; a job that fails again first hands its anomaly to the next incident."""
    signals = verify_signals(rec.inp.spec)
    rec.set_state(RecoveryState.VERIFYING, f"waiting for the job to train again ({signals})", number)
    found = rec.incident(number).checkpoint
    wait = scheduler.wait_resume_input(
        rec.inp,
        offsets=rec.status.log_offsets,
        expected_restarts=rec.status.restart_count,
        not_before=rec.incident(number).restarted_at,
        restart_checkpoint=found.latest_valid if found is not None else None,
    )
    if rec.inp.detection.silent_sample_s > 0 and workflow.patched(liveness.PATCH_VERIFY_STACKS):
        resumed = await liveness.wait_resume_or_stacks(rec, wait)
    else:
        resumed = await scheduler.wait_resume(wait, task_queue=scheduler.resume_queue(rec.inp))
    rec.update_status(log_offsets=resumed.offsets)
    if resumed.job is not None:
        rec.observe(resumed.job)
        rec.update(last_job=resumed.job)
    then = after_resume(resumed)
    if then.ending is not None:
        return rec.end(then.ending, number)
    if then.failed_again is not None:
        rec.set_status(ledger.set_outcome(rec.status, number, then.outcome))
        rec.update(next_anomaly=then.failed_again, next_findings=then.findings)
        return None
    metrics.record_restart(attribution.cause)
    metrics.record_recovery_action(rec.incident(number))
    await rec.tell(
        NotificationKind.RESUMED,
        f"Job {rec.inp.job_id} trains again",
        f"{resumed_note(resumed)}, excluding {', '.join(decision.exclude) or 'no node'}",
        Severity.INFO,
    )
    status = ledger.mark_resumed(rec.status, number, resumed.observed_at, resumed.checkpoint)
    rec.set_status(ledger.set_outcome(status, number, then.outcome))
    rec.set_state(RecoveryState.WATCHING, resumed_note(resumed), number)
    if found is not None and workflow.patched(checkpoints.PATCH_VERIFY):
        await checkpoints.judge_resume(rec, number, resumed)
    return None


async def judge_straggler(rec: Recorder, anomaly: Anomaly) -> Attribution | None:
    """Record a straggler incident; return its attribution only when the policy says to restart elsewhere."""
    verdict = rec.state.stragglers
    if verdict is None:
        return None
    nodes = tuple(n.node for n in verdict.nodes if n.node)
    reported = tuple(sorted({*rec.state.reported_stragglers, *nodes}))
    rec.update(reported_stragglers=reported)
    reports = await evidence.read_all_gpus(nodes)
    attribution = attribute_straggler(verdict, throttled_gpus(nodes, reports))
    choice = straggler_choice(verdict, rec.inp.spec.stragglers, rec.inp.detection)
    if choice.restart:
        return attribution
    status, number = ledger.open_incident(
        rec.status, anomaly=anomaly, attribution=attribution, stragglers=verdict, outcome=choice.outcome
    )
    rec.set_status(status)
    rec.record("STRAGGLER", f"{attribution.explanation}", number)
    metrics.record_incident(rec.incident(number))
    await rec.tell(
        NotificationKind.STRAGGLER,
        f"Job {rec.inp.job_id}: straggler on {', '.join(attribution.implicated_nodes) or '?'}",
        attribution.explanation,
        Severity.INFO,
    )
    rec.upsert_cause(attribution)
    return None
