"""The audit report as Markdown: headline, tables, coverage, definitions; every text from a job made inert. Pure."""

from __future__ import annotations

from activities.temporal.audit_phrases import (
    approval_nodes,
    approval_outcome,
    approvals_line,
    coverage_lines,
    percent,
    secs,
    when,
)
from workflows.domain.audit import AuditSummary, LatencyStats
from workflows.policy.audit import DEFINITIONS

__all__ = ["render_markdown"]


def _md(text: object) -> str:
    """Text from a job, made inert in a Markdown table cell (no markup, no HTML, no line break)."""
    out = " ".join(str(text).split())
    for ch in "\\`*_[]<>|#!":
        out = out.replace(ch, "\\" + ch)
    return out


def _latency_line(name: str, st: LatencyStats) -> str:
    return (
        f"| {name} | {st.count} | {st.unknown} | {secs(st.p50)} | {secs(st.p95)} | {secs(st.mean)} | {secs(st.max)} |"
    )


def render_markdown(s: AuditSummary) -> str:
    """The report as Markdown: headline, tables, definitions."""
    lines = [
        f"# Rebound audit: {_md(s.cluster)}",
        "",
        f"Period {when(s.since)} .. {when(s.until)} (UTC). {s.jobs} job(s) monitored, {s.incidents} incident(s) "
        f"detected, {s.resumed} resumed, {s.unresolved} still open. Cluster goodput {percent(s.cluster_goodput)}.",
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
        f"| {g.job_id} | {_md(g.job_name or '-')} | {_md(g.state)} | {secs(g.observed_s)} | {secs(g.downtime_s)} "
        f"| {percent(g.goodput)} | {g.incidents} |"
        for g in s.goodput
    ] or ["| - | | | | | | |"]
    lines += ["", "## Actions that waited for approval", "", approvals_line(s.approvals)]
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
            f"| {_md(r.id)} | {r.kind.value} | {r.job_id} | {_md(r.incident or '-')} | {_md(approval_nodes(r))} "
            f"| {when(r.requested_at)} | {approval_outcome(r)} | {_md(r.decided_by or '-')} | {secs(r.waited_s)} |"
            for r in a.rows
        ]
    lines += ["", "## Coverage", ""]
    lines += [f"- {_md(line)}" for line in coverage_lines(s)]
    lines += ["", "## Definitions", ""]
    lines += [f"- **{name}**: {text}" for name, text in DEFINITIONS.items()]
    return "\n".join(lines) + "\n"
