"""CLI commands about monitored jobs: ``watch`` and ``status``."""

from __future__ import annotations

from datetime import datetime

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.temporal.rebound_workflows import query_job_status, start_job_recovery
from workers.client import connect
from workers.console import EXIT_NOT_FOUND, EXIT_OK, print_json
from workers.settings import Settings
from workflows.constants import JOB_ID, JOB_RECOVERY_WORKFLOW, RECOVERY_STATE, job_workflow_id
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.recovery import JobRecoveryInput, JobRecoveryStatus


async def watch(settings: Settings, job_id: int, poll_interval_s: float) -> int:
    """Start the job's JobRecovery workflow; starting it again is a no-op (the id is the business key)."""
    client = await connect(settings.temporal)
    # Validate on the client: a payload that fails to decode would wedge the workflow task, not fail it.
    inp = JobRecoveryInput(
        cluster=settings.cluster_name,
        job_id=job_id,
        poll_interval_s=poll_interval_s,
        detection=settings.detection,
        watch_hub=settings.watch.routing(),
    )
    handle = await start_job_recovery(client, inp, task_queue=settings.temporal.task_queue)
    print(f"monitoring job {job_id}: workflow {handle.id} (run {handle.result_run_id})")
    return EXIT_OK


async def query_status(client: Client, settings: Settings, job_id: int) -> JobRecoveryStatus:
    """The workflow's ``status`` query, with a client-side timeout (a query with no live worker hangs)."""
    wf_id = job_workflow_id(settings.cluster_name, job_id)
    try:
        try:
            return await query_job_status(client, wf_id, timeout_s=settings.temporal.query_timeout_s)
        except RPCError as e:
            if e.status is not RPCStatusCode.NOT_FOUND:
                raise
            # A resubmitted job is followed by its lineage's workflow, whose ReboundJobId names the current job.
            followed_by = await _lineage_of(client, settings, job_id)
            if followed_by is None:
                raise ReboundError(FailureKind.JOB_NOT_FOUND, f"job {job_id} is not monitored by Rebound") from e
            return await query_job_status(client, followed_by, timeout_s=settings.temporal.query_timeout_s)
    except TimeoutError as e:
        raise ReboundError(
            FailureKind.TEMPORAL_UNREACHABLE,
            f"no answer from job {job_id}'s workflow within {settings.temporal.query_timeout_s:.0f} s: "
            "is a Rebound worker running?",
        ) from e


async def _lineage_of(client: Client, settings: Settings, job_id: int) -> str | None:
    """The running JobRecovery whose current job is ``job_id`` (a resubmission, ADR 014), by its search attribute."""
    query = (
        f'WorkflowType = "{JOB_RECOVERY_WORKFLOW}" AND ReboundCluster = "{settings.cluster_name}" '
        f'AND ReboundJobId = "{job_id}" AND ExecutionStatus = "Running"'
    )
    async for wf in client.list_workflows(query):
        return wf.id
    return None


async def status(settings: Settings, job_id: int | None, *, as_json: bool) -> int:
    """One job's recovery status, or a table of every monitored job."""
    client = await connect(settings.temporal)
    if job_id is not None:
        st = await query_status(client, settings, job_id)
        if as_json:
            print_json(st.model_dump(mode="json"))
        else:
            print(f"job {st.job_id} ({st.job_name or 'unnamed'}): {st.state.value}")
            if st.lineage:
                print(f"  resubmitted: {' -> '.join(map(str, st.lineage))}")
            print(
                f"  slurm: {st.job_state.value if st.job_state else '?'} on {','.join(st.nodes) or '-'}, "
                f"restarts {st.restart_count}"
            )
            for e in st.timeline:
                print(f"  {e.at:%Y-%m-%d %H:%M:%S} {e.event:<10} {e.detail}")
        return EXIT_OK
    query = f'WorkflowType = "{JOB_RECOVERY_WORKFLOW}" AND ReboundCluster = "{settings.cluster_name}"'
    rows = []
    try:
        async for wf in client.list_workflows(query):
            sa = wf.typed_search_attributes
            rows.append(
                {
                    "workflow_id": wf.id,
                    "job_id": sa.get(JOB_ID) or "?",
                    "state": sa.get(RECOVERY_STATE) or "?",
                    "status": wf.status.name if wf.status else "?",
                    "started": wf.start_time.isoformat(),
                }
            )
    except RPCError as e:
        raise ReboundError(FailureKind.TEMPORAL_UNREACHABLE, f"listing workflows failed: {e}") from e
    # Running ones first, then by job id (newest first); a closed workflow's state is where it stopped.
    rows.sort(key=lambda r: (r["status"] != "RUNNING", -int(r["job_id"]) if str(r["job_id"]).isdigit() else 0))
    if as_json:
        print_json(rows)
    elif not rows:
        print("no monitored jobs")
    else:
        print(f"{'JOB':>8}  {'STATE':<10} {'WORKFLOW':<10} {'STARTED':<25} ID")
        stopped = False
        for r in rows:
            state = r["state"]
            if r["status"] not in ("RUNNING", "COMPLETED"):
                state, stopped = f"{state}*", True  # terminated/failed/timed out: the state it had then
            print(f"{r['job_id']:>8}  {state:<10} {r['status']:<10} {r['started']:<25} {r['workflow_id']}")
        if stopped:
            print("* the workflow was stopped (terminated, failed, timed out) in this state: not monitored any more")
    return EXIT_OK if rows or job_id is None else EXIT_NOT_FOUND


def _secs(a: datetime | None, b: datetime | None) -> str:
    return f"{(b - a).total_seconds():.1f}s" if a and b else "-"


def render_timeline(st: JobRecoveryStatus) -> str:
    """The incident timeline of one job, with the latencies that matter to its owner."""
    lines = [
        f"job {st.job_id} ({st.job_name or 'unnamed'}) on {st.cluster}: {st.state.value}; "
        f"restarts used {st.restarts_used}/{st.restart_budget}"
    ]
    for inc in st.incidents:
        att = inc.attribution
        lines.append(f"\nincident {inc.id}: {inc.anomaly.summary}")
        lines.append(f"  detected    {inc.detected_at:%Y-%m-%d %H:%M:%S.%f}"[:-3])
        if att is not None:
            lines.append(
                f"  attributed  {att.failure_class.value}/{att.cause} confidence {att.confidence:.2f} "
                f"nodes {','.join(att.implicated_nodes) or '-'} ranks {','.join(map(str, att.implicated_ranks)) or '-'}"
            )
            lines.append(f"              {att.explanation}")
            if att.action is not None:
                lines.append(f"  action      {att.action.value}: {att.action_reason}")
            for ev in att.evidence[:4]:
                where = f"{ev.node or ''}{f' rank {ev.rank}' if ev.rank is not None else ''}".strip()
                lines.append(f"              [{ev.source.value}{' ' + where if where else ''}] {ev.text[:140]}")
        for act in inc.actions:
            lines.append(
                f"  {act.kind.value:<10}  {act.target}: {act.result or 'decided, not yet verified'} "
                f"(+{_secs(inc.detected_at, act.verified_at)} after detection)"
            )
        lines.append(
            f"  latencies   recovery action {_secs(inc.detected_at, inc.restarted_at)}, "
            f"resumed {_secs(inc.detected_at, inc.resumed_at)} after detection"
            + (f" from {inc.resumed_from}" if inc.resumed_from else "")
        )
        if inc.outcome:
            lines.append(f"  outcome     {inc.outcome}")
    lines.append("\nevents:")
    for e in st.timeline:
        tag = f"#{e.incident} " if e.incident else ""
        lines.append(f"  {e.at:%H:%M:%S} {e.event:<10} {tag}{e.detail}")
    return "\n".join(lines)


async def timeline(settings: Settings, job_id: int, *, as_json: bool) -> int:
    """``rebound timeline JOB``."""
    client = await connect(settings.temporal)
    st = await query_status(client, settings, job_id)
    if as_json:
        print_json(st.model_dump(mode="json"))
    else:
        print(render_timeline(st))
    return EXIT_OK
