"""``rebound audit [--since 24h] [--json]``: run one Audit workflow now and wait for its report.

The report is written by the worker that runs the audit, under its ``audit.report_dir`` (default
``<state_dir>/reports``); the paths printed are on that worker's host. While waiting, stderr shows a spinner with
the elapsed seconds when it is a terminal.

Exit codes: 0 the report was written, 1 the audit failed or did not finish in time, 2 usage error, 3 Temporal
unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from workflows.domain.audit import MAX_AUDIT_PERIOD_S

if TYPE_CHECKING:  # the Temporal client and the workflow load when the command runs, not for --help
    from temporalio.client import Client, WorkflowHandle

    from workers.settings import Settings
    from workflows.domain.audit import AuditResult

__all__ = ["add_audit_parser", "parse_duration", "run_audit", "run_audit_command"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_FRAMES = "|/-\\"
#: After this long with no result, the spinner says what is most likely wrong.
HINT_AFTER_S = 15.0


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``24h``, ``7d``, ``1w`` -> seconds (argparse ``type=``).

    Raises:
        argparse.ArgumentTypeError: not a duration, zero, or longer than an audit may cover.
    """
    m = _DURATION.fullmatch(text.strip().lower()) if text.isascii() else None
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write e.g. 90m, 24h or 7d")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
    if not 0 < seconds <= MAX_AUDIT_PERIOD_S:
        raise argparse.ArgumentTypeError(f"{text!r}: an audit covers more than 0 s and at most 90 days")
    return seconds


def add_audit_parser(sub: Any) -> None:
    """Add ``audit [--since DURATION] [--json] [--timeout S]`` to the ``rebound`` subcommands."""
    a = sub.add_parser("audit", help="write an audit report of the last --since now (JSON, Markdown, HTML)")
    a.add_argument(
        "--since", type=parse_duration, default=24 * 3600.0, metavar="DURATION", help="period: 90m, 24h, 7d (24h)"
    )
    a.add_argument("--json", action="store_true", help="print the workflow's result as JSON")
    a.add_argument("--timeout", type=float, default=600.0, metavar="S", help="stop waiting after S seconds (600)")


def run_audit_command(settings: Settings, args: argparse.Namespace) -> int:
    """``rebound audit``, from parsed arguments."""
    return asyncio.run(run_audit(settings, args.since, as_json=args.json, timeout_s=args.timeout))


async def run_audit(
    settings: Settings,
    period_s: float,
    *,
    as_json: bool = False,
    timeout_s: float = 600.0,
    client: Client | None = None,
    progress: TextIO | None = None,
) -> int:
    """Start an on-demand Audit over the last ``period_s`` and wait for it; print the headline and the paths.

    Raises:
        ReboundError: ``TEMPORAL_UNREACHABLE`` when Temporal cannot be reached.
    """
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ApplicationError
    from temporalio.service import RPCError, RPCStatusCode

    from activities.temporal.rebound_workflows import start_audit
    from workers.client import connect
    from workers.console import EXIT_FAIL, EXIT_OK, print_json
    from workflows.constants import audit_ondemand_workflow_id
    from workflows.domain.audit import AuditInput
    from workflows.domain.errors import FailureKind, ReboundError

    inp = AuditInput(cluster=settings.cluster_name, period_s=period_s)  # validated here, not in the workflow task
    client = client or await connect(settings.temporal)
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    try:
        handle = await start_audit(
            client,
            inp,
            workflow_id=audit_ondemand_workflow_id(settings.cluster_name, stamp),
            task_queue=settings.temporal.task_queue,
        )
    except RPCError as e:
        kind = FailureKind.TEMPORAL_UNREACHABLE if e.status is RPCStatusCode.UNAVAILABLE else FailureKind.CONFIGURATION
        raise ReboundError(kind, f"starting the audit failed: {e.status.name}: {e.message}") from e
    stream = progress if progress is not None else sys.stderr
    try:
        result = await wait_with_progress(handle, timeout_s, f"auditing {settings.cluster_name}", stream)
    except WorkflowFailureError as e:
        # Workflow -> activity -> the activity's classified error (ApplicationError): that message says what to fix.
        cause: BaseException = e.cause
        while not isinstance(cause, ApplicationError) and getattr(cause, "cause", None) is not None:
            cause = cause.cause  # type: ignore[attr-defined]
        print(f"rebound: the audit {handle.id} failed: {cause}", file=sys.stderr)
        return EXIT_FAIL
    except TimeoutError:
        print(
            f"rebound: no report after {timeout_s:.0f} s; the audit {handle.id} goes on (see the Temporal UI). "
            "Is a Rebound worker running (`rebound worker`)?",
            file=sys.stderr,
        )
        return EXIT_FAIL
    if as_json:
        print_json(result.model_dump(mode="json"))
        return EXIT_OK
    print(result.headline())
    print(f"  html      {result.paths.html_path}")
    print(f"  markdown  {result.paths.markdown_path}")
    print(f"  json      {result.paths.json_path}")
    return EXIT_OK


async def wait_with_progress(
    handle: WorkflowHandle[Any, AuditResult], timeout_s: float, label: str, stream: TextIO
) -> AuditResult:
    """The workflow's result; a spinner with elapsed seconds on ``stream`` meanwhile, if it is a terminal.

    Raises:
        TimeoutError: no result within ``timeout_s`` (the workflow keeps running).
        WorkflowFailureError: the workflow failed.
    """
    tty = stream.isatty()
    loop = asyncio.get_running_loop()
    start = loop.time()
    task = asyncio.ensure_future(handle.result())
    frame = 0
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.1)
            if done:
                return task.result()
            elapsed = loop.time() - start
            if elapsed >= timeout_s:
                raise TimeoutError
            if tty:
                hint = " (no answer yet: is `rebound worker` running?)" if elapsed >= HINT_AFTER_S else ""
                stream.write(f"\r{_FRAMES[frame % 4]} {label}: {elapsed:5.1f} s{hint}")
                stream.flush()
                frame += 1
    finally:
        if not task.done():
            task.cancel()
        if tty:
            stream.write("\r\033[K")
            stream.flush()
