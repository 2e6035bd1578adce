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
escaped (``activities.temporal.audit_markdown``, ``activities.temporal.audit_html``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from temporalio import activity
from temporalio.client import Client, WorkflowExecution
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError, RPCStatusCode

from activities.errors import classified_errors
from activities.temporal.audit_html import render_html
from activities.temporal.audit_markdown import render_markdown
from activities.temporal.rebound_workflows import query_fleet_status, query_job_status
from workflows.constants import JOB_RECOVERY_WORKFLOW, fleet_workflow_id
from workflows.domain.audit import (
    AuditCollectInput,
    AuditCollection,
    AuditPaths,
    AuditSummary,
    AuditWriteInput,
    CollectFailure,
    FleetApprovals,
    FleetRead,
)
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.fleet import FleetStatus
from workflows.domain.recovery import JobRecoveryStatus
from workflows.policy.audit import DEFINITIONS
from workflows.policy.audit_approvals import fleet_approvals
from workflows.policy.audit_incidents import RunRead, cap_incidents, job_audit
from workflows.policy.audit_measures import utc

__all__ = ["AuditActivities", "report_json", "visibility_query"]

# Temporal answers that mean "Temporal is not there now": the whole attempt is retried, not reported per run.
_UNREACHABLE_RPC = frozenset({RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED})


def _stamp(t: datetime) -> str:
    return f"{utc(t):%Y-%m-%dT%H:%M:%S.%fZ}"


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


def report_json(summary: AuditSummary) -> dict[str, object]:
    """The JSON report: a schema tag, the definitions of its numbers, the numbers.

    Schema 2: ``approvals`` is an object read from the Fleet (was a list, with ``approvals_waited`` and
    ``approvals_pending`` beside it, read from action records that never carried them).
    """
    return {"schema": "rebound.audit/2", "definitions": DEFINITIONS, **summary.model_dump(mode="json")}
