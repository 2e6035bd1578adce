"""The audit report as one self-contained HTML page: inline CSS and SVG charts, no script, no external reference;
every text from a job escaped. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from activities.temporal.audit_phrases import (
    approval_nodes,
    approval_outcome,
    approvals_line,
    coverage_lines,
    percent,
    secs,
    when,
)
from workflows.domain.audit import ApprovalSummary, AuditSummary, LatencyStats
from workflows.policy.audit import DEFINITIONS
from workflows.policy.audit_measures import histogram

__all__ = ["render_html"]

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
    parts = [f"<p>{escape(approvals_line(a))}</p>", _svg_bars("Approvals by kind and outcome", bars)]
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
                        approval_nodes(r),
                        when(r.requested_at),
                        approval_outcome(r),
                        r.decided_by or "-",
                        secs(r.waited_s),
                    )
                    for r in a.rows
                ],
            )
        )
    return parts


def render_html(s: AuditSummary) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG; no script, no external reference)."""
    lat_rows = [
        (name, st.count, st.unknown, secs(st.p50), secs(st.p95), secs(st.mean), secs(st.max))
        for name, st in (("detection", s.detection), ("recovery action", s.action), ("resume", s.resume))
    ]
    job_label = {g.workflow_id: f"{g.job_id} {g.job_name}".strip() for g in s.goodput}
    body = [
        f"<h1>Rebound audit: {escape(s.cluster)}</h1>",
        f"<p>Period {when(s.since)} .. {when(s.until)} (UTC). <b>{s.jobs}</b> job(s) monitored, "
        f"<b>{s.incidents}</b> incident(s) detected, {s.resumed} resumed, {s.unresolved} still open. "
        f"Cluster goodput <b>{percent(s.cluster_goodput)}</b>.</p>",
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
            [(job_label[g.workflow_id], 100 * (g.goodput or 0), percent(g.goodput)) for g in s.goodput],
            scale_max=100.0,
        ),
        _table(
            ("job", "name", "state", "monitored", "downtime", "goodput", "incidents"),
            [
                (
                    g.job_id,
                    g.job_name,
                    g.state,
                    secs(g.observed_s),
                    secs(g.downtime_s),
                    percent(g.goodput),
                    g.incidents,
                )
                for g in s.goodput
            ],
        ),
        "<h2>Actions that waited for approval</h2>",
        *_html_approvals(s.approvals),
    ]
    body.append("<h2>Coverage</h2>")
    body += [f"<p>{escape(line)}</p>" for line in coverage_lines(s)]
    body.append("<h2>Definitions</h2><dl>")
    body += [f"<dt><b>{escape(k)}</b></dt><dd>{escape(v)}</dd>" for k, v in DEFINITIONS.items()]
    body.append("</dl>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>Rebound audit {escape(s.cluster)} {when(s.until)}</title><style>{_CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
