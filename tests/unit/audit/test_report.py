"""The report files: what they say, that user text is inert, that the HTML is self-contained, atomic writes."""

from __future__ import annotations

import json
import os
import re
from html import escape
from pathlib import Path
from typing import cast

import pytest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.temporal.audit import AuditActivities, report_json, visibility_query
from activities.temporal.audit_html import render_html
from activities.temporal.audit_markdown import render_markdown
from tests.unit.audit.builders import (
    CLUSTER,
    SINCE,
    UNTIL,
    at,
    fleet_approvals,
    job_101_incidents,
    job_202_incidents,
    status,
)
from workflows.domain.audit import (
    AuditCollection,
    AuditSummary,
    AuditWriteInput,
    CollectFailure,
    FleetApprovals,
    FleetRead,
)
from workflows.policy.audit import DEFINITIONS, summarise
from workflows.policy.audit_approvals import fleet_approvals as approvals_of_period
from workflows.policy.audit_incidents import RunRead, job_audit

EVIL = '<script>alert("x")</script> | **bold** [link](http://evil.example) & `code`'


def _summary(job_name: str = "train-101", operator: str = "alice") -> AuditSummary:
    st = status(101, job_101_incidents()).model_copy(update={"job_name": job_name})
    st202 = status(202, job_202_incidents())
    runs = [
        RunRead(workflow_id="rebound/c/job/101", run_id="r1", started_at=at(-100), status=st),
        RunRead(workflow_id="rebound/c/job/202", run_id="r2", started_at=at(7200), closed_at=at(21600), status=st202),
    ]
    jobs = tuple(j for j in (job_audit([r], SINCE, UNTIL) for r in runs) if j is not None)
    failure = CollectFailure(workflow_id="rebound/c/job/9", run_id="r9", kind="QUERY_TIMEOUT", message=EVIL)
    approvals = tuple(a.model_copy(update={"decided_by": operator}) if a.id == "a-2" else a for a in fleet_approvals())
    fleet = approvals_of_period("rebound/c/fleet", approvals, SINCE, UNTIL)
    return summarise(
        AuditCollection(
            cluster=CLUSTER, since=SINCE, until=UNTIL, runs_listed=3, jobs=jobs, failures=(failure,), fleet=fleet
        )
    )


def test_markdown_states_the_numbers_and_definitions() -> None:
    md = render_markdown(_summary())
    assert "Period 2025-01-01 00:00:00 .. 2025-01-01 10:00:00 (UTC)." in md
    assert "2 job(s) monitored, 5 incident(s) detected, 2 resumed" in md
    assert "| detection | 3 | 2 | 10.0 s | 82.0 s | 34.0 s | 90.0 s |" in md
    assert "| recovery action | 3 | 2 | 30.0 s | 57.0 s | 36.7 s | 60.0 s |" in md
    assert "| xid-79 | 2 |" in md
    assert "| 202 | train-202 | WATCHING | 14400.0 s | 7200.0 s | 50.00 % | 1 |" in md
    assert (
        "7 action(s) waited for approval, 3 still pending at the end of the period. Wait of the 4 decided in the "
        "period: p50 480.0 s, max 900.0 s." in md
    )
    assert "| drain | 5 | 2 | 0 | 1 | 2 |" in md and "| restart | 2 | 0 | 1 | 0 | 1 |" in md
    assert "| alice | 1 |" in md and "| nobody (expired) | 1 |" in md
    assert "| a-2 | drain | 101 | 101-1 | n1 | 2025-01-01 01:00:01 | approved | alice | 20.0 s |" in md
    assert "| a-5 | drain | 303 | 303-1 | n5 | 2025-01-01 05:33:20 | expired (rejected) | - | 900.0 s |" in md
    assert "| a-6 | restart | 101 | 101-5 | restart of job 101 | 2025-01-01 09:43:20 | pending | - | - |" in md
    assert "3 JobRecovery run(s) listed, 1 unreadable, 0 not read." in md
    assert "- Fleet rebound/c/fleet read: 7 approval(s) of the period." in md
    for name in DEFINITIONS:
        assert f"**{name}**" in md


def test_json_report_is_the_summary_with_its_definitions() -> None:
    data = report_json(_summary())
    assert data["schema"] == "rebound.audit/2" and data["definitions"] == DEFINITIONS
    approvals = cast(dict[str, object], data["approvals"])
    assert data["incidents"] == 5 and (approvals["total"], approvals["pending_at_end"], approvals["fleet"]) == (
        7,
        3,
        "read",
    )
    assert AuditSummary.model_validate({k: v for k, v in data.items() if k not in ("schema", "definitions")}) == (
        _summary()
    )


def test_user_text_is_inert_in_html_and_markdown() -> None:
    summary = _summary(job_name=EVIL, operator=EVIL)
    page = render_html(summary)
    assert "<script" not in page and "alert(&quot;x&quot;)" in page
    assert "&lt;script&gt;" in page
    md = render_markdown(summary)
    assert "<script>" not in md and "\\<script\\>" in md
    row = next(line for line in md.splitlines() if line.startswith("| 101 |"))
    assert row.count(" | ") == 6  # the job name's pipe did not add a column
    row = next(line for line in md.splitlines() if line.startswith("| a-2 |"))
    assert row.count(" | ") == 8  # nor the operator's
    assert (
        page.count("<td>&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; | **bold**") == 3
    )  # job, decider, approval row


def test_html_is_self_contained_with_its_charts() -> None:
    page = render_html(_summary())
    assert "http" not in page.replace("http://evil", "")  # no external reference, no script, no CDN
    assert "<script" not in page and "<link" not in page and "src=" not in page
    labels = re.findall(r'<svg [^>]*aria-label="([^"]+)"', page)
    assert labels == [
        "Detection latency (s)",
        "Recovery-action latency (s)",
        "By anomaly",
        "By cause",
        "By failure class",
        "Incidents implicating the node",
        "Goodput (training time / monitored time)",
        "Approvals by kind and outcome",
    ]
    bars = re.search(r'aria-label="Approvals by kind and outcome">(.*?)</svg>', page)
    assert bars is not None
    assert re.findall(r"<title>([^<]+)</title>", bars.group(1)) == [
        "drain: approved",
        "drain: expired",
        "drain: pending",
        "restart: rejected",
        "restart: pending",
    ]
    assert "<th>pending at end</th>" in page and "<td>expired (rejected)</td>" in page
    assert page.count('class="p50"') == 2 and page.count('class="p95"') == 2
    assert "p50 10.00 s" in page and "p95 82.00 s" in page and "p95 57.00 s" in page


def test_html_without_incidents_says_so_instead_of_drawing() -> None:
    page = render_html(summarise(AuditCollection(cluster=CLUSTER, since=SINCE, until=UNTIL)))
    assert "<svg" not in page and "Detection latency (s): no values in this period." in page
    assert "Approvals by kind and outcome: none in this period." in page


@pytest.mark.parametrize(
    ("fleet", "line"),
    [
        (
            FleetApprovals(workflow_id="rebound/c/fleet", read=FleetRead.MISSING),
            "no Fleet (rebound/c/fleet not found): approvals not read, 0 reported.",
        ),
        (
            FleetApprovals(workflow_id="rebound/c/fleet", read=FleetRead.UNREADABLE, message="QUERY_TIMEOUT: <late>"),
            "Fleet rebound/c/fleet unreadable: QUERY_TIMEOUT: <late>: approvals not read, 0 reported.",
        ),
        (
            FleetApprovals(workflow_id="rebound/c/fleet", read=FleetRead.READ, dropped=3, history_full=True),
            "3 older approval(s) left out to keep the report bounded.",
        ),
        (
            FleetApprovals(workflow_id="rebound/c/fleet", read=FleetRead.READ, history_full=True),
            "The Fleet keeps only its 100 most recent decided approvals, and the oldest it still holds was decided "
            "in or after this period: earlier decisions of the period may be missing.",
        ),
    ],
)
def test_coverage_says_what_the_approvals_may_miss(fleet: FleetApprovals, line: str) -> None:
    s = summarise(AuditCollection(cluster=CLUSTER, since=SINCE, until=UNTIL, fleet=fleet))
    md = render_markdown(s)
    coverage = md[md.index("## Coverage") : md.index("## Definitions")]
    inert = line.replace("<", "\\<").replace(">", "\\>").replace("_", "\\_")  # what Markdown needs here
    assert "- " + inert in coverage
    assert f"<p>{escape(line)}</p>" in render_html(s)
    assert "0 action(s) waited for approval, 0 still pending at the end of the period." in md


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def _acts(tmp_path: Path) -> AuditActivities:
    return AuditActivities(cast(Client, object()), report_dir=tmp_path / "reports")


async def test_write_report_writes_three_files_atomically(tmp_path: Path) -> None:
    acts = _acts(tmp_path)
    paths = await ActivityEnvironment().run(acts.write_report, AuditWriteInput(summary=_summary()))
    assert paths.json_path == str(tmp_path / "reports" / "audit-20250101T100000Z.json")
    assert Path(paths.markdown_path).name == "audit-20250101T100000Z.md"
    assert json.loads(_read(paths.json_path))["incidents"] == 5
    assert _read(paths.html_path).startswith("<!DOCTYPE html>")
    # A retried write replaces the files: same names, nothing left behind.
    again = await ActivityEnvironment().run(acts.write_report, AuditWriteInput(summary=_summary("renamed")))
    assert again == paths
    assert sorted(os.listdir(tmp_path / "reports")) == [
        "audit-20250101T100000Z.html",
        "audit-20250101T100000Z.json",
        "audit-20250101T100000Z.md",
    ]
    assert "renamed" in _read(paths.markdown_path)


async def test_write_report_to_an_override_directory(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "deep"
    paths = await ActivityEnvironment().run(
        _acts(tmp_path).write_report, AuditWriteInput(summary=_summary(), out_dir=str(other))
    )
    assert Path(paths.html_path).parent == other and _read(paths.html_path).endswith("</html>\n")


async def test_unwritable_directory_is_a_configuration_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            _acts(tmp_path).write_report, AuditWriteInput(summary=_summary(), out_dir=str(blocker / "reports"))
        )
    assert err.value.type == "CONFIGURATION" and err.value.non_retryable and str(blocker) in str(err.value)


def test_visibility_query_covers_runs_that_overlap_the_period() -> None:
    q = visibility_query("lab", SINCE, UNTIL)
    assert q == (
        'WorkflowType = "JobRecovery" AND ReboundCluster = "lab" AND StartTime < "2025-01-01T10:00:00.000000Z" '
        'AND (CloseTime >= "2025-01-01T00:00:00.000000Z" OR ExecutionStatus = "Running")'
    )
    with pytest.raises(ValueError, match="cannot be used"):
        visibility_query('lab" OR WorkflowType != "x', SINCE, UNTIL)
