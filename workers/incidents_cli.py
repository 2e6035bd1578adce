"""``rebound incidents`` (every job's incidents, filtered) and ``rebound pause|resume JOB``.

Incidents are read from each JobRecovery workflow's ``status`` query (running and closed ones: a closed one is
answered by a worker replaying its history), found through Temporal visibility by cluster and, when given, by the
``ReboundCause``/``ReboundNodes`` search attributes; the time filter applies to each incident's detection time.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from activities.temporal.rebound_workflows import job_operator_request, query_job_status
from workers.console import EXIT_REFUSED, print_json
from workers.operator_auth import AS_HELP, note_claim, refusal_text, signed_request
from workers.settings import Settings
from workflows.constants import JOB_RECOVERY_WORKFLOW
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.incident import Incident
from workflows.domain.operators import OperatorActionKind
from workflows.domain.recovery import JobRecoveryStatus

__all__ = ["add_incident_parsers", "is_incident_command", "run_incident_command"]

_COMMANDS = ("incidents", "pause", "resume")
_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: Workflows read at once: each status query may replay a closed run's history on a worker.
_CONCURRENCY = 8


def add_incident_parsers(sub: Any) -> None:
    i = sub.add_parser("incidents", help="incidents of every monitored job, newest first (filters: cause, node, time)")
    i.add_argument("--cause", default=None, help="only this cause (xid-79, hang, rank-crash, straggler, ...)")
    i.add_argument("--node", default=None, help="only incidents that implicate this node")
    i.add_argument("--since", default="24h", help="only incidents detected within this long (30m, 24h, 7d)")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    for verb, what in (("pause", "pause Rebound's monitoring of a job"), ("resume", "resume monitoring a job")):
        p = sub.add_parser(verb, help=what)
        p.add_argument("job_id", type=int)
        p.add_argument("--note", default="", help="why (kept in the job's timeline)")
        p.add_argument("--as", dest="operator", default=None, help=AS_HELP)


def is_incident_command(command: str) -> bool:
    return command in _COMMANDS


def parse_since(text: str) -> timedelta:
    """``30m``, ``24h``, ``7d`` as a duration; a clear error otherwise."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise ReboundError(FailureKind.CONFIGURATION, f"--since: expected a duration like 30m, 24h or 7d, got {text!r}")
    return timedelta(seconds=int(m.group(1)) * _UNIT[m.group(2)])


async def run_incident_command(settings: Settings, args: argparse.Namespace) -> int:
    from workers.client import connect

    client = await connect(settings.temporal)
    if args.command in ("pause", "resume"):
        return await _pause_or_resume(client, settings, args)
    since = datetime.now(UTC) - parse_since(args.since)
    rows = await collect_incidents(client, settings, cause=args.cause, node=args.node, since=since)
    if args.json:
        print_json([{"job_id": job, **inc.model_dump(mode="json")} for job, inc in rows])
    else:
        print(format_incidents(rows))
    return 0


async def _pause_or_resume(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    """An operator's pause or resume, signed with MUNGE: the Unix user running this is who acts."""
    kind = OperatorActionKind.PAUSE if args.command == "pause" else OperatorActionKind.RESUME
    req = await signed_request(settings, kind, job_id=args.job_id, note=args.note)
    note_claim(args.operator, req.credential.claimed_user)
    try:
        st = await job_operator_request(client, settings.cluster_name, args.job_id, req)
    except WorkflowUpdateFailedError as e:
        print(f"rebound: refused: {refusal_text(e)}", file=sys.stderr)
        return EXIT_REFUSED
    except RPCError as e:
        if e.status is RPCStatusCode.NOT_FOUND:
            raise ReboundError(FailureKind.JOB_NOT_FOUND, f"job {args.job_id} is not monitored by Rebound") from e
        raise ReboundError(FailureKind.TEMPORAL_UNREACHABLE, str(e.message)) from e
    state = f"paused by {st.paused_by}" if st.paused_by else "monitored"
    print(f"job {args.job_id}: {state} ({st.state.value})")
    return 0


async def collect_incidents(
    client: Client, settings: Settings, *, cause: str | None, node: str | None, since: datetime
) -> list[tuple[int, Incident]]:
    """(job id, incident) pairs matching the filters, newest first."""
    query = f'WorkflowType = "{JOB_RECOVERY_WORKFLOW}" AND ReboundCluster = "{_quote(settings.cluster_name)}"'
    query += f' AND (CloseTime > "{since.isoformat()}" OR ExecutionStatus = "Running")'
    ids = sorted({wf.id async for wf in client.list_workflows(query)})
    gate = asyncio.Semaphore(_CONCURRENCY)

    async def status(wf_id: str) -> JobRecoveryStatus | None:
        async with gate:
            try:
                return await query_job_status(client, wf_id, timeout_s=settings.temporal.query_timeout_s)
            except Exception:  # noqa: BLE001 - one unreadable workflow (no worker, gone) must not hide the others
                return None

    found: list[tuple[int, Incident]] = []
    for st in await asyncio.gather(*(status(i) for i in ids)):
        if st is None:
            continue
        for inc in st.incidents:
            att = inc.attribution
            if inc.detected_at < since:
                continue
            if cause and (att is None or att.cause != cause):
                continue
            if node and (att is None or node not in att.implicated_nodes):
                continue
            found.append((st.job_id, inc))
    found.sort(key=lambda row: row[1].detected_at, reverse=True)
    return found


def format_incidents(rows: list[tuple[int, Incident]]) -> str:
    if not rows:
        return "no incidents match"
    out = [f"{'detected (UTC)':<20} {'incident':<10} {'kind':<11} {'cause':<16} {'nodes':<12} {'outcome':<14} action"]
    for _job, inc in rows:
        att = inc.attribution
        action = f"{inc.recovery_action_s:.1f}s" if inc.recovery_action_s is not None else "-"
        out.append(
            f"{inc.detected_at:%Y-%m-%d %H:%M:%S} {inc.id:<10} {inc.anomaly.kind.value:<11} "
            f"{(att.cause if att else '-'):<16} {(','.join(att.implicated_nodes) if att else '') or '-':<12} "
            f"{(inc.outcome or 'in progress')[:14]:<14} {action}"
        )
    return "\n".join(out)


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
