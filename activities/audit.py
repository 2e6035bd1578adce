"""The Audit workflow's activities: read the cluster's JobRecovery workflows and its Fleet, and write the report.

Reading. Visibility lists every JobRecovery *run* of the cluster whose lifetime overlaps the period (each
continue-as-new is a run of its own). Each run's ``status`` query is answered by a worker, for a closed run too:
the worker replays its history, so what the audit reads is exactly what ``rebound timeline`` shows. The central
worker that runs the audit also serves JobRecovery, so a worker is there. A run that cannot be read (a query
timeout, history past retention, a replay that fails) is reported by name in the report, and its incidents are
missing; the audit goes on. Only Temporal itself being unreachable fails the attempt (Temporal retries it).

Approvals live only in the cluster's Fleet workflow (``rebound/<cluster>/fleet``), so its ``status`` query is read
as well, alongside the runs. No Fleet (never started, or a cluster run without one) is not an error: the report
shows 0 approvals and says "no Fleet"; a Fleet that does not answer is named in the coverage the same way.

Writing. ``<report dir>/audit-<until, UTC>.{json,md,html}``, each written to a temporary file and renamed, so a
reader never sees half a report and a retried write replaces, never duplicates. The HTML page is self-contained:
inline CSS and SVG charts, no script, no external reference; every text from a job (names, summaries, nodes) is
escaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from html import escape
from pathlib import Path

from temporalio import activity
from temporalio.client import Client, WorkflowExecution
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError, RPCStatusCode

from activities.errors import classified_errors
from activities.temporal.rebound_workflows import query_fleet_status, query_job_status
from workflows.constants import JOB_RECOVERY_WORKFLOW, fleet_workflow_id
from workflows.domain.audit import (
    ApprovalRow,
    ApprovalSummary,
    AuditCollectInput,
    AuditCollection,
    AuditPaths,
    AuditSummary,
    AuditWriteInput,
    CollectFailure,
    FleetApprovals,
    FleetRead,
    LatencyStats,
)
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.fleet import ApprovalOutcome, FleetStatus
from workflows.domain.recovery import JobRecoveryStatus
from workflows.policy.audit import DEFINITIONS
from workflows.policy.audit_approvals import fleet_approvals
from workflows.policy.audit_incidents import RunRead, cap_incidents, job_audit
from workflows.policy.audit_measures import histogram, utc
from workflows.policy.fleet import MAX_DECIDED_APPROVALS

__all__ = ["AuditActivities", "render_html", "render_markdown", "report_json", "visibility_query"]

# Temporal answers that mean "Temporal is not there now": the whole attempt is retried, not reported per run.
_UNREACHABLE_RPC = frozenset({RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED})


def _stamp(t: datetime) -> str:
    return f"{utc(t):%Y-%m-%dT%H:%M:%S.%fZ}"


def _when(t: datetime) -> str:
    return f"{utc(t):%Y-%m-%d %H:%M:%S}"


def visibility_query(cluster: str, since: datetime, until: datetime) -> str:
    """JobRecovery runs of ``cluster`` that started before ``until`` and were still open at ``since``.

    Raises:
        ValueError: a cluster name that cannot be quoted in a visibility query.
    """
    if '"' in cluster or "\\" in cluster:
        raise ValueError(f"cluster name {cluster!r} cannot be used in a visibility query")
    return (
        f'WorkflowType = "{JOB_RECOVERY_WORKFLOW}" AND ReboundCluster = "{cluster}" '
        f'AND StartTime < "{_stamp(until)}" AND (CloseTime >= "{_stamp(since)}" OR ExecutionStatus = "Running")'
    )


class AuditActivities:
    """The audit's reads (through the worker's Temporal client) and its report writer."""

    def __init__(
        self, client: Client, *, report_dir: Path, query_timeout_s: float = 10.0, concurrency: int = 8
    ) -> None:
        """Bind the activities.

        Args:
            client: A client with the pydantic data converter.
            report_dir: Where reports go unless an audit names another (absolute) directory.
            query_timeout_s: Limit on one ``status`` query (a replay of a long history takes a while).
            concurrency: ``status`` queries in flight at once.

        Raises:
            ValueError: a limit that is not positive.
        """
        if query_timeout_s <= 0 or concurrency < 1:
            raise ValueError(f"query_timeout_s and concurrency must be positive: {query_timeout_s}, {concurrency}")
        self._client = client
        self._report_dir = report_dir
        self._query_timeout_s = query_timeout_s
        self._concurrency = concurrency

    @activity.defn(name="audit_collect")
    async def collect(self, inp: AuditCollectInput) -> AuditCollection:
        """List the period's JobRecovery runs, query each one's ``status``, digest them per job; read the Fleet's
        approvals of the period.

        Raises:
            ApplicationError: ``TEMPORAL_UNREACHABLE`` (retried) when Temporal does not answer; ``CONFIGURATION``
                when it refuses the listing (the cluster search attribute is not registered, say).
        """
        with classified_errors():
            listed, skipped = await self._list(inp)
            gate = asyncio.Semaphore(self._concurrency)
            done = 0

            async def read(wf: WorkflowExecution) -> tuple[RunRead, CollectFailure | None]:
                nonlocal done
                async with gate:
                    status, failure = await self._status(wf)
                done += 1
                activity.heartbeat(done)
                run = RunRead(
                    workflow_id=wf.id,
                    run_id=wf.run_id,
                    started_at=wf.start_time,
                    closed_at=wf.close_time,
                    status=status,
                )
                return run, failure

            reads, fleet = await asyncio.gather(asyncio.gather(*(read(wf) for wf in listed)), self._fleet(inp))
        by_id: dict[str, list[RunRead]] = defaultdict(list)
        for run, _ in reads:
            by_id[run.workflow_id].append(run)
        audits = [job_audit(runs, inp.since, inp.until) for _, runs in sorted(by_id.items())]
        jobs, dropped = cap_incidents([a for a in audits if a is not None], inp.max_incidents)
        failures = tuple(f for _, f in reads if f is not None)
        activity.logger.info(
            "audit of %s: %d run(s) listed, %d job(s), %d unreadable; Fleet %s, %d approval(s)",
            inp.cluster,
            len(listed),
            len(jobs),
            len(failures),
            fleet.read.value,
            len(fleet.approvals),
        )
        return AuditCollection(
            cluster=inp.cluster,
            since=inp.since,
            until=inp.until,
            runs_listed=len(listed),
            runs_skipped=skipped,
            incidents_dropped=dropped,
            jobs=jobs,
            failures=failures,
            fleet=fleet,
        )

    async def _list(self, inp: AuditCollectInput) -> tuple[list[WorkflowExecution], int]:
        try:
            query = visibility_query(inp.cluster, inp.since, inp.until)
        except ValueError as e:
            raise ReboundError(FailureKind.CONFIGURATION, str(e)) from e
        listed: list[WorkflowExecution] = []
        skipped = 0
        try:
            async for wf in self._client.list_workflows(query):
                if len(listed) < inp.max_workflows:
                    listed.append(wf)
                else:
                    skipped += 1
                if (len(listed) + skipped) % 200 == 0:
                    activity.heartbeat(0)  # a long listing is progress too
        except RPCError as e:
            kind = FailureKind.TEMPORAL_UNREACHABLE if e.status in _UNREACHABLE_RPC else FailureKind.CONFIGURATION
            raise ReboundError(kind, f"listing JobRecovery workflows failed: {e.status.name}: {e.message}") from e
        return listed, skipped

    async def _status(self, wf: WorkflowExecution) -> tuple[JobRecoveryStatus | None, CollectFailure | None]:
        def failed(kind: str, message: str) -> tuple[None, CollectFailure]:
            return None, CollectFailure(workflow_id=wf.id, run_id=wf.run_id, kind=kind, message=message[:500])

        try:
            status = await query_job_status(self._client, wf.id, run_id=wf.run_id, timeout_s=self._query_timeout_s)
        except TimeoutError:
            return failed("QUERY_TIMEOUT", f"no answer within {self._query_timeout_s:g} s (is a worker running?)")
        except RPCError as e:
            if e.status in _UNREACHABLE_RPC:
                raise ReboundError(FailureKind.TEMPORAL_UNREACHABLE, f"querying {wf.id}: {e.message}") from e
            return failed(f"QUERY_{e.status.name}", e.message)
        except (TemporalError, ValueError, TypeError) as e:  # a failed replay, a status that does not decode
            return failed("QUERY_FAILED", f"{type(e).__name__}: {e}")
        if not isinstance(status, JobRecoveryStatus):
            return failed("QUERY_FAILED", f"status is a {type(status).__name__}, not a JobRecoveryStatus")
        return status, None

    async def _fleet(self, inp: AuditCollectInput) -> FleetApprovals:
        """The Fleet's approvals that overlap the period; MISSING or UNREADABLE (with why) when it cannot say."""
        wf_id = fleet_workflow_id(inp.cluster)

        def unreadable(message: str) -> FleetApprovals:
            return FleetApprovals(workflow_id=wf_id, read=FleetRead.UNREADABLE, message=message[:500])

        try:
            status = await query_fleet_status(self._client, inp.cluster, timeout_s=self._query_timeout_s)
        except TimeoutError:
            return unreadable(f"QUERY_TIMEOUT: no answer within {self._query_timeout_s:g} s (is a worker running?)")
        except RPCError as e:
            if e.status in _UNREACHABLE_RPC:
                raise ReboundError(FailureKind.TEMPORAL_UNREACHABLE, f"querying {wf_id}: {e.message}") from e
            if e.status is RPCStatusCode.NOT_FOUND:
                return FleetApprovals(workflow_id=wf_id, read=FleetRead.MISSING)
            return unreadable(f"QUERY_{e.status.name}: {e.message}")
        except (TemporalError, ValueError, TypeError) as e:  # a failed replay, a status that does not decode
            return unreadable(f"QUERY_FAILED: {type(e).__name__}: {e}")
        if not isinstance(status, FleetStatus):
            return unreadable(f"QUERY_FAILED: status is a {type(status).__name__}, not a FleetStatus")
        return fleet_approvals(wf_id, status.state.approvals, inp.since, inp.until)

    @activity.defn(name="audit_write_report")
    async def write_report(self, inp: AuditWriteInput) -> AuditPaths:
        """Write the JSON, Markdown and HTML report; returns their paths.

        Raises:
            ApplicationError: ``CONFIGURATION`` (not retried) when the directory cannot be created or written.
        """
        out = Path(inp.out_dir) if inp.out_dir else self._report_dir
        base = out / f"audit-{utc(inp.summary.until):%Y%m%dT%H%M%SZ}"
        texts = {
            ".json": json.dumps(report_json(inp.summary), indent=2, sort_keys=False) + "\n",
            ".md": render_markdown(inp.summary),
            ".html": render_html(inp.summary),
        }
        with classified_errors():
            try:
                # fsync can take a while on a busy disk: off the event loop, which serves the other activities.
                await asyncio.to_thread(
                    _write_all, out, {base.with_suffix(suffix): text for suffix, text in texts.items()}
                )
            except OSError as e:
                raise ReboundError(
                    FailureKind.CONFIGURATION, f"cannot write the audit report to {out}: {e.strerror or e}"
                ) from e
        return AuditPaths(
            json_path=str(base.with_suffix(".json")),
            markdown_path=str(base.with_suffix(".md")),
            html_path=str(base.with_suffix(".html")),
        )


def _write_all(out: Path, files: dict[Path, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        _write_atomically(path, text)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ----- rendering (pure) ---------------------------------------------------------------------------------------


def report_json(summary: AuditSummary) -> dict[str, object]:
    """The JSON report: a schema tag, the definitions of its numbers, the numbers.

    Schema 2: ``approvals`` is an object read from the Fleet (was a list, with ``approvals_waited`` and
    ``approvals_pending`` beside it, read from action records that never carried them).
    """
    return {"schema": "rebound.audit/2", "definitions": DEFINITIONS, **summary.model_dump(mode="json")}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _md(text: object) -> str:
    """Text from a job, made inert in a Markdown table cell (no markup, no HTML, no line break)."""
    out = " ".join(str(text).split())
    for ch in "\\`*_[]<>|#!":
        out = out.replace(ch, "\\" + ch)
    return out


def _latency_line(name: str, st: LatencyStats) -> str:
    return f"| {name} | {st.count} | {st.unknown} | {_s(st.p50)} | {_s(st.p95)} | {_s(st.mean)} | {_s(st.max)} |"


def render_markdown(s: AuditSummary) -> str:
    """The report as Markdown: headline, tables, definitions."""
    lines = [
        f"# Rebound audit: {_md(s.cluster)}",
        "",
        f"Period {_when(s.since)} .. {_when(s.until)} (UTC). {s.jobs} job(s) monitored, {s.incidents} incident(s) "
        f"detected, {s.resumed} resumed, {s.unresolved} still open. Cluster goodput {_pct(s.cluster_goodput)}.",
        "",
        "## Latencies",
        "",
        "| latency | n | unknown | p50 | p95 | mean | max |",
        "|---|---|---|---|---|---|---|",
        _latency_line("detection", s.detection),
        _latency_line("recovery action", s.action),
        _latency_line("resume", s.resume),
    ]
    for title, rows in (
        ("Incidents by anomaly", s.by_anomaly),
        ("Incidents by cause", s.by_cause),
        ("Incidents by failure class", s.by_failure_class),
    ):
        lines += ["", f"## {title}", "", "| category | incidents |", "|---|---|"]
        lines += [f"| {_md(r.key)} | {r.count} |" for r in rows] or ["| - | 0 |"]
    lines += ["", "## Top implicated nodes", "", "| node | incidents | drained in |", "|---|---|---|"]
    lines += [f"| {_md(n.node)} | {n.incidents} | {n.drains} |" for n in s.top_nodes] or ["| - | 0 | 0 |"]
    lines += [
        "",
        "## Goodput per job",
        "",
        "| job | name | state | monitored | downtime | goodput | incidents |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {g.job_id} | {_md(g.job_name or '-')} | {_md(g.state)} | {_s(g.observed_s)} | {_s(g.downtime_s)} "
        f"| {_pct(g.goodput)} | {g.incidents} |"
        for g in s.goodput
    ] or ["| - | | | | | | |"]
    lines += ["", "## Actions that waited for approval", "", _approvals_line(s.approvals)]
    a = s.approvals
    if a.by_kind:
        lines += ["", "| kind | total | approved | rejected | expired | pending at end |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {k.kind.value} | {k.total} | {k.approved} | {k.rejected} | {k.expired} | {k.pending} |"
            for k in a.by_kind
        ]
    if a.deciders:
        lines += ["", "| decided by | approvals |", "|---|---|"]
        lines += [f"| {_md(r.key)} | {r.count} |" for r in a.deciders]
    if a.rows:
        lines += [
            "",
            "| approval | kind | job | incident | nodes | requested | outcome | decided by | waited |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {_md(r.id)} | {r.kind.value} | {r.job_id} | {_md(r.incident or '-')} | {_md(_nodes(r))} "
            f"| {_when(r.requested_at)} | {_outcome(r)} | {_md(r.decided_by or '-')} | {_s(r.waited_s)} |"
            for r in a.rows
        ]
    lines += ["", "## Coverage", ""]
    lines += [f"- {_md(line)}" for line in _coverage(s)]
    lines += ["", "## Definitions", ""]
    lines += [f"- **{name}**: {text}" for name, text in DEFINITIONS.items()]
    return "\n".join(lines) + "\n"


def _nodes(r: ApprovalRow) -> str:
    return ", ".join(r.nodes) if r.nodes else f"restart of job {r.job_id}"


def _outcome(r: ApprovalRow) -> str:
    """The outcome at the end of the period; an expired one with what its default did."""
    if r.outcome is ApprovalOutcome.EXPIRED and r.applied is not None:
        return f"expired ({r.applied.value})"
    return r.outcome.value


def _approvals_line(a: ApprovalSummary) -> str:
    text = f"{a.total} action(s) waited for approval, {a.pending_at_end} still pending at the end of the period."
    if a.wait.count:
        text += f" Wait of the {a.wait.count} decided in the period: p50 {_s(a.wait.p50)}, max {_s(a.wait.max)}."
    if a.fleet is not FleetRead.READ:
        text += " Approvals were not read (see Coverage)."
    return text


def _coverage(s: AuditSummary) -> list[str]:
    """What the report may be missing, as plain lines (each renderer escapes them)."""
    out = [f"{s.runs_listed} JobRecovery run(s) listed, {len(s.failures)} unreadable, {s.runs_skipped} not read."]
    if s.incidents_dropped:
        out.append(f"{s.incidents_dropped} older incident(s) left out to keep the report bounded.")
    out += [f"unreadable: {f.workflow_id} run {f.run_id}: {f.kind}: {f.message}" for f in s.failures]
    a = s.approvals
    if a.fleet is FleetRead.MISSING:
        where = f" ({a.fleet_workflow_id} not found)" if a.fleet_workflow_id else ""
        out.append(f"no Fleet{where}: approvals not read, 0 reported.")
    elif a.fleet is FleetRead.UNREADABLE:
        out.append(f"Fleet {a.fleet_workflow_id} unreadable: {a.fleet_message}: approvals not read, 0 reported.")
    else:
        out.append(f"Fleet {a.fleet_workflow_id} read: {a.total} approval(s) of the period.")
    if a.dropped:
        out.append(f"{a.dropped} older approval(s) left out to keep the report bounded.")
    if a.history_full:
        out.append(
            f"The Fleet keeps only its {MAX_DECIDED_APPROVALS} most recent decided approvals, and the oldest it "
            "still holds was decided in or after this period: earlier decisions of the period may be missing."
        )
    return out


# ----- HTML with inline SVG -------------------------------------------------------------------------------------

_CSS = (
    "body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:980px;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;"
    "text-align:left}th{background:#f3f3f3}.num{text-align:right}svg{display:block;margin:.5em 0 1.5em}"
    ".muted{color:#666}"
)


def _svg_histogram(title: str, st: LatencyStats) -> str:
    """Bars of a latency histogram with p50 and p95 marked; a note instead when nothing was measured."""
    if not st.values:
        return f'<p class="muted">{escape(title)}: no values in this period.</p>'
    w, h, left, bottom, top = 640, 220, 40, 30, 24
    bins = histogram(st.values)
    span = bins[-1][1] or 1.0
    tallest = max(c for _, _, c in bins) or 1
    plot_w, plot_h = w - left - 10, h - bottom - top
    parts = [f'<svg width="{w}" height="{h}" role="img" aria-label="{escape(title)}">']
    parts.append(f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>')
    bar_w = plot_w / len(bins)
    for i, (lo, hi, count) in enumerate(bins):
        bh = plot_h * count / tallest
        x, y = left + i * bar_w, top + plot_h - bh
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" height="{bh:.1f}" fill="#5b8def">'
            f"<title>{lo:.2f}-{hi:.2f} s: {count}</title></rect>"
        )
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>')
    parts.append(f'<text x="{left}" y="{h - 10}" font-size="11">0 s</text>')
    parts.append(f'<text x="{left + plot_w}" y="{h - 10}" font-size="11" text-anchor="end">{span:.1f} s</text>')
    parts.append(f'<text x="4" y="{top + 10}" font-size="11">{tallest}</text>')
    for name, value, colour in (("p50", st.p50, "#d9480f"), ("p95", st.p95, "#862e9c")):
        if value is None:
            continue
        x = left + plot_w * min(value / span, 1.0)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="{colour}" '
                     f'stroke-dasharray="4 3" class="{name}"/>')  # fmt: skip
        # Labels near the right edge go left of their line, so they stay inside the picture.
        anchor, tx = ("end", x - 3) if x > left + 0.75 * plot_w else ("start", x + 3)
        parts.append(f'<text x="{tx:.1f}" y="{top + 10 if name == "p50" else top + 24}" font-size="11" '
                     f'text-anchor="{anchor}" fill="{colour}" stroke="#fff" stroke-width="3" paint-order="stroke">'
                     f'{name} {value:.2f} s</text>')  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def _svg_bars(title: str, rows: Sequence[tuple[str, float, str]], scale_max: float | None = None) -> str:
    """Horizontal bars: ``(label, value, value text)`` per row; a note instead when there are none."""
    if not rows:
        return f'<p class="muted">{escape(title)}: none in this period.</p>'
    label_w, bar_max, row_h = 220, 360, 20
    h = 24 + row_h * len(rows)
    top_value = scale_max or max(v for _, v, _ in rows) or 1.0
    parts = [f'<svg width="{label_w + bar_max + 120}" height="{h}" role="img" aria-label="{escape(title)}">']
    parts.append(f'<text x="0" y="14" font-weight="bold">{escape(title)}</text>')
    for i, (label, value, text) in enumerate(rows):
        y = 24 + i * row_h
        bw = bar_max * max(value, 0) / top_value
        short = label if len(label) <= 32 else label[:31] + "…"
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end" font-size="12">{escape(short)}'
                     f"<title>{escape(label)}</title></text>")  # fmt: skip
        parts.append(f'<rect x="{label_w}" y="{y + 2}" width="{bw:.1f}" height="{row_h - 5}" fill="#37b24d"/>')
        parts.append(f'<text x="{label_w + bw + 4:.1f}" y="{y + 13}" font-size="12">{escape(text)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _html_approvals(a: ApprovalSummary) -> list[str]:
    """Headline, counts by kind and outcome (a table and its bars), who decided, and one row per approval."""
    bars = [
        (f"{k.kind.value}: {outcome}", count, str(count))
        for k in a.by_kind
        for outcome, count in (
            ("approved", k.approved),
            ("rejected", k.rejected),
            ("expired", k.expired),
            ("pending", k.pending),
        )
        if count
    ]
    parts = [f"<p>{escape(_approvals_line(a))}</p>", _svg_bars("Approvals by kind and outcome", bars)]
    if a.by_kind:
        parts.append(
            _table(
                ("kind", "total", "approved", "rejected", "expired", "pending at end"),
                [(k.kind.value, k.total, k.approved, k.rejected, k.expired, k.pending) for k in a.by_kind],
            )
        )
    if a.deciders:
        parts.append(_table(("decided by", "approvals"), [(r.key, r.count) for r in a.deciders]))
    if a.rows:
        parts.append(
            _table(
                ("approval", "kind", "job", "incident", "nodes", "requested", "outcome", "decided by", "waited"),
                [
                    (
                        r.id,
                        r.kind.value,
                        r.job_id,
                        r.incident or "-",
                        _nodes(r),
                        _when(r.requested_at),
                        _outcome(r),
                        r.decided_by or "-",
                        _s(r.waited_s),
                    )
                    for r in a.rows
                ],
            )
        )
    return parts


def render_html(s: AuditSummary) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG; no script, no external reference)."""
    lat_rows = [
        (name, st.count, st.unknown, _s(st.p50), _s(st.p95), _s(st.mean), _s(st.max))
        for name, st in (("detection", s.detection), ("recovery action", s.action), ("resume", s.resume))
    ]
    job_label = {g.workflow_id: f"{g.job_id} {g.job_name}".strip() for g in s.goodput}
    body = [
        f"<h1>Rebound audit: {escape(s.cluster)}</h1>",
        f"<p>Period {_when(s.since)} .. {_when(s.until)} (UTC). <b>{s.jobs}</b> job(s) monitored, "
        f"<b>{s.incidents}</b> incident(s) detected, {s.resumed} resumed, {s.unresolved} still open. "
        f"Cluster goodput <b>{_pct(s.cluster_goodput)}</b>.</p>",
        "<h2>Latencies</h2>",
        _table(("latency", "n", "unknown", "p50", "p95", "mean", "max"), lat_rows),
        _svg_histogram("Detection latency (s)", s.detection),
        _svg_histogram("Recovery-action latency (s)", s.action),
        "<h2>Incidents by category</h2>",
        _svg_bars("By anomaly", [(r.key, r.count, str(r.count)) for r in s.by_anomaly]),
        _svg_bars("By cause", [(r.key, r.count, str(r.count)) for r in s.by_cause]),
        _svg_bars("By failure class", [(r.key, r.count, str(r.count)) for r in s.by_failure_class]),
        "<h2>Top implicated nodes</h2>",
        _svg_bars(
            "Incidents implicating the node",
            [(n.node, n.incidents, f"{n.incidents} (drained in {n.drains})") for n in s.top_nodes],
        ),
        "<h2>Goodput per job</h2>",
        _svg_bars(
            "Goodput (training time / monitored time)",
            [(job_label[g.workflow_id], 100 * (g.goodput or 0), _pct(g.goodput)) for g in s.goodput],
            scale_max=100.0,
        ),
        _table(
            ("job", "name", "state", "monitored", "downtime", "goodput", "incidents"),
            [
                (g.job_id, g.job_name, g.state, _s(g.observed_s), _s(g.downtime_s), _pct(g.goodput), g.incidents)
                for g in s.goodput
            ],
        ),
        "<h2>Actions that waited for approval</h2>",
        *_html_approvals(s.approvals),
    ]
    body.append("<h2>Coverage</h2>")
    body += [f"<p>{escape(line)}</p>" for line in _coverage(s)]
    body.append("<h2>Definitions</h2><dl>")
    body += [f"<dt><b>{escape(k)}</b></dt><dd>{escape(v)}</dd>" for k, v in DEFINITIONS.items()]
    body.append("</dl>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>Rebound audit {escape(s.cluster)} {_when(s.until)}</title><style>{_CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
