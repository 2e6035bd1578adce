"""``rebound approve|reject|mode|breaker|nodes``: operators steer the cluster's Fleet through workflow updates.

Every action is signed with MUNGE as the Unix user running the command (``workers.operator_auth``); the Fleet
verifies the credential once and refuses anyone not in ``fleet.operators`` (exit code 5, nothing changed).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from activities.temporal import rebound_workflows
from workers.console import EXIT_REFUSED, print_json
from workers.operator_auth import AS_HELP, note_claim, refusal_text, signed_request
from workers.settings import Settings
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.fleet import ApprovalOutcome, BreakerStatus, FleetMode, FleetStatus
from workflows.domain.operators import OperatorActionKind
from workflows.policy.fleet import active_suspicions

__all__ = ["add_fleet_parsers", "fleet_status", "reset_breaker", "run_fleet_command"]

_COMMANDS = ("approve", "reject", "mode", "breaker", "nodes")


def add_fleet_parsers(sub: Any) -> None:
    """Add the operator commands to the ``rebound`` subcommands."""

    def operator(p: argparse.ArgumentParser) -> None:
        p.add_argument("--as", dest="operator", default=None, help=AS_HELP)

    for verb, what in (("approve", "approve a pending action"), ("reject", "reject a pending action")):
        p = sub.add_parser(verb, help=f"{what} (ids: `rebound nodes`, or ReboundPendingApproval in the UI)")
        p.add_argument("approval_id")
        p.add_argument("--note", default="", help="why (kept with the approval)")
        operator(p)
    m = sub.add_parser("mode", help="show or switch Rebound's mode: observe, canary (one partition), act")
    m.add_argument("mode", nargs="?", choices=[x.value for x in FleetMode])
    m.add_argument("--partition", default="", help="canary: the one partition Rebound acts on")
    operator(m)
    b = sub.add_parser("breaker", help="show the drain breaker, or reset it")
    b.add_argument("action", nargs="?", choices=["reset"])
    operator(b)
    n = sub.add_parser("nodes", help="quarantine state of every node Rebound knows, pending approvals, breaker")
    n.add_argument("--json", action="store_true", help="machine-readable output")


def is_fleet_command(command: str) -> bool:
    return command in _COMMANDS


async def run_fleet_command(settings: Settings, args: argparse.Namespace) -> int:
    """Dispatch one operator command; returns the exit code."""
    from workers.client import connect

    client = await connect(settings.temporal)
    try:
        if args.command in ("approve", "reject"):
            kind = OperatorActionKind.APPROVE if args.command == "approve" else OperatorActionKind.REJECT
            st = await _signed(client, settings, args, kind, approval_id=args.approval_id, note=args.note)
            approval = next(a for a in st.state.approvals if a.id == args.approval_id)
            print(f"{approval.id}: {approval.outcome.value} by {approval.decided_by} ({approval.kind.value} "
                  f"{', '.join(approval.nodes) or 'job ' + str(approval.request.job_id)})")  # fmt: skip
            return 0
        if args.command == "mode" and args.mode:
            mode = FleetMode(args.mode)
            st = await _signed(
                client, settings, args, OperatorActionKind.MODE, mode=mode, canary_partition=args.partition
            )
            print(_mode_line(st))
            return 0
        if args.command == "breaker" and args.action == "reset":
            br = await reset_breaker(client, settings, claimed=args.operator)
            print(f"breaker reset: {br.drained_in_window}/{br.cap} drains count now")
            return 0
        st = await fleet_status(client, settings)
        if getattr(args, "json", False):
            print_json(st.model_dump(mode="json"))
        elif args.command == "mode":
            print(_mode_line(st))
        elif args.command == "breaker":
            print(_breaker_line(st.breaker))
        else:
            print(format_nodes(st))
        return 0
    except _Refused as e:
        print(f"rebound: refused: {e.message}", file=sys.stderr)
        return EXIT_REFUSED


class _Refused(ReboundError):
    """The Fleet refused the action (its validator, or the verification): nothing changed."""

    def __init__(self, message: str) -> None:
        super().__init__(FailureKind.NOT_OWNED, message)


async def fleet_status(client: Client, settings: Settings) -> FleetStatus:
    """The Fleet's ``status`` query."""
    try:
        return await rebound_workflows.query_fleet_status(client, settings.cluster_name)
    except RPCError as e:
        raise _not_running(settings, e) from e


async def reset_breaker(client: Client, settings: Settings, *, claimed: str | None = None) -> BreakerStatus:
    """Reset the Fleet's drain breaker as the Unix user running this (tests and the benchmark use it between runs)."""
    st = await _signed(client, settings, None, OperatorActionKind.BREAKER_RESET, claimed=claimed)
    return st.breaker


async def _signed(
    client: Client,
    settings: Settings,
    args: argparse.Namespace | None,
    kind: OperatorActionKind,
    claimed: str | None = None,
    **fields: Any,
) -> FleetStatus:
    """Sign the action with MUNGE and send it; the Fleet's refusal as ``_Refused``, an absent Fleet as an error."""
    req = await signed_request(settings, kind, **fields)
    note_claim(claimed if args is None else args.operator, req.credential.claimed_user)
    try:
        return await rebound_workflows.fleet_operator_request(client, settings.cluster_name, req)
    except WorkflowUpdateFailedError as e:
        raise _Refused(refusal_text(e)) from e
    except RPCError as e:
        raise _not_running(settings, e) from e


def _not_running(settings: Settings, e: RPCError) -> ReboundError:
    if e.status is RPCStatusCode.NOT_FOUND:
        return ReboundError(
            FailureKind.JOB_NOT_FOUND,
            f"no Fleet for cluster {settings.cluster_name!r}: is a worker running (`rebound worker`)?",
        )
    return ReboundError(FailureKind.TEMPORAL_UNREACHABLE, f"Fleet of {settings.cluster_name}: {e.message}")


def _mode_line(st: FleetStatus) -> str:
    mode = st.state.mode.value
    return f"mode: {mode}" + (f" (canary partition {st.state.canary_partition})" if mode == "canary" else "")


def _breaker_line(br: BreakerStatus) -> str:
    state = "OPEN: further drains wait for approval" if br.open else "closed"
    return f"breaker: {br.drained_in_window}/{br.cap} drains in the window, {state}"


#: ``rebound nodes`` lists at most this many suspicions (the newest); ``--json`` has them all.
MAX_SUSPICIONS_SHOWN = 20


def format_nodes(st: FleetStatus, now: datetime | None = None) -> str:
    """Nodes, suspicions, approvals and breaker as a readable table (suspicions within the window of ``now``)."""
    lines = [_mode_line(st), _breaker_line(st.breaker), ""]
    lines.append(f"{'node':<10} {'state':<9} {'since':<20} {'incidents':>9}  reason")
    for name in sorted(st.state.nodes):
        r = st.state.nodes[name]
        since = f"{r.since:%Y-%m-%d %H:%M:%S}" if r.since else "-"
        lines.append(f"{name:<10} {r.state.value:<9} {since:<20} {len(r.incidents):>9}  {r.reason[:70]}")
    suspicions = active_suspicions(st.state, st.policy, now or datetime.now(UTC))
    lines.append("")
    lines.append(
        f"suspicions (excluded from one job's placement, not drained; implicated again within "
        f"{st.policy.suspicion_window_s / 3600:g} h by a job of another user: drained): {len(suspicions)}"
    )
    for node, i in suspicions[:MAX_SUSPICIONS_SHOWN]:
        owner = f" of {i.user}" if i.user else ""
        lines.append(f"  {node:<10} {i.at:%Y-%m-%d %H:%M:%S}  job {i.job_id}{owner} ({i.incident}: {i.cause})")
    if len(suspicions) > MAX_SUSPICIONS_SHOWN:
        lines.append(f"  ... {len(suspicions) - MAX_SUSPICIONS_SHOWN} more (rebound nodes --json)")
    pending = [a for a in st.state.approvals if a.outcome is ApprovalOutcome.PENDING]
    lines.append("")
    lines.append(f"pending approvals: {len(pending)}")
    for a in pending:
        what = ", ".join(a.nodes) if a.nodes else f"restart of job {a.request.job_id}"
        lines.append(
            f"  {a.id}  {a.kind.value:<7} {what}  (job {a.request.job_id}, {a.request.cause}, "
            f"deadline {a.deadline:%H:%M:%S}): {'; '.join(a.reasons)[:120]}"
        )
    return "\n".join(lines)
