"""The Audit workflow, its Schedule and ``rebound audit`` against a real (in-memory) Temporal dev server.

Stand-in ``JobRecovery`` workflows answer ``status`` with hand-built incidents (tests/unit/audit/builders.py), so
the report's numbers are known in advance: one job still running, one that gave up (a closed run, read by
replay), one that continued as new (two runs, one incident in both), and one whose worker is gone (unreadable).
A stand-in ``Fleet`` answers ``status`` with the builders' approvals; without one, the report says "no Fleet".
"""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio import workflow
from temporalio.client import Client, ScheduleActionStartWorkflow, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from activities.temporal.audit import AuditActivities, visibility_query
from tests.unit.audit.builders import fleet_approvals, job_101_incidents, job_202_incidents, status
from workers.audit_cli import run_audit, wait_with_progress
from workers.audit_schedule import ScheduleOutcome, ensure_audit_schedule
from workers.cli import main
from workers.settings import AuditSettings, Settings, TemporalSettings
from workflows.audit import AuditWorkflow
from workflows.constants import CLUSTER, FLEET_WORKFLOW, JOB_RECOVERY_WORKFLOW, audit_schedule_id, fleet_workflow_id
from workflows.domain.audit import AuditInput, AuditResult
from workflows.domain.base import Frozen
from workflows.domain.fleet import BreakerStatus, FleetPolicy, FleetState, FleetStatus
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState


class FakeJobInput(Frozen):
    runs: tuple[JobRecoveryStatus, ...]
    """One status per run: the workflow continues as new until the last one."""
    finish: bool = False


@workflow.defn(name=JOB_RECOVERY_WORKFLOW)
class FakeJobRecovery:
    """Stands in for JobRecovery: answers ``status`` with the status it was given."""

    @workflow.init
    def __init__(self, inp: FakeJobInput) -> None:
        self._status = inp.runs[0]

    @workflow.run
    async def run(self, inp: FakeJobInput) -> None:
        if len(inp.runs) > 1:
            workflow.continue_as_new(FakeJobInput(runs=inp.runs[1:], finish=inp.finish))
        if not inp.finish:
            await workflow.wait_condition(lambda: False)

    @workflow.query
    def status(self) -> JobRecoveryStatus:
        return self._status


@workflow.defn(name=FLEET_WORKFLOW)
class FakeFleet:
    """Stands in for the cluster's Fleet: answers ``status`` with the status it was given, and runs on."""

    @workflow.init
    def __init__(self, st: FleetStatus) -> None:
        self._status = st

    @workflow.run
    async def run(self, st: FleetStatus) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.query
    def status(self) -> FleetStatus:
        return self._status


@asynccontextmanager
async def _workers(client: Client, jobs_queue: str, audit_queue: str, report_dir: Path) -> AsyncIterator[None]:
    # The stand-in lives in this module, which the sandbox would re-import: it runs unsandboxed. AuditWorkflow runs
    # in the sandbox, as in production.
    acts = AuditActivities(client, report_dir=report_dir, query_timeout_s=2.0)
    async with (
        Worker(
            client,
            task_queue=jobs_queue,
            workflows=[FakeJobRecovery, FakeFleet],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ),
        Worker(client, task_queue=audit_queue, workflows=[AuditWorkflow], activities=[acts.collect, acts.write_report]),
    ):
        yield


async def _start_job(
    client: Client, cluster: str, queue: str, job_id: int, inp: FakeJobInput
) -> WorkflowHandle[Any, Any]:
    return await client.start_workflow(
        FakeJobRecovery.run,
        inp,
        id=f"rebound/{cluster}/job/{job_id}",
        task_queue=queue,
        search_attributes=TypedSearchAttributes([SearchAttributePair(CLUSTER, cluster)]),
    )


async def _until(check: Callable[[], Any], timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.1)


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def _read_json(path: str) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(_read(path)))


async def test_audit_report_numbers_match_known_incidents(temporal_client: Client, tmp_path: Path) -> None:
    client, cluster = temporal_client, f"a-{uuid.uuid4().hex[:8]}"
    jobs_queue, audit_queue = f"jobs-{uuid.uuid4().hex}", f"audit-{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    # The builders' incidents lie 1 h .. 5 h after their base. Job 101's happen after its workflow started (so its
    # downtime is inside its observed window); job 202's hang happened before its run, which closes at once.
    since, until = now - timedelta(hours=9), now + timedelta(hours=6)
    first, second, third, fourth = job_101_incidents(now)
    unresolved_first = first.model_copy(update={"resumed_at": None, "outcome": ""})
    async with _workers(client, jobs_queue, audit_queue, tmp_path / "reports"):
        # 101 continued as new: its first run had incidents 1 (not yet resumed) and 2, the second run all four.
        await _start_job(
            client,
            cluster,
            jobs_queue,
            101,
            FakeJobInput(runs=(status(101, (unresolved_first, second)), status(101, (first, second, third, fourth)))),
        )
        gave_up = status(202, job_202_incidents(now - timedelta(hours=8)), state=RecoveryState.GAVE_UP)
        await _start_job(client, cluster, jobs_queue, 202, FakeJobInput(runs=(gave_up,), finish=True))
        # The Fleet's approvals lie around the period's end as the builders' lie around theirs (UNTIL = base + 10 h),
        # so the period here starts 5 h before their base: a-1 (decided 2000 s before the base) is in it too.
        state = FleetState(cluster=cluster, approvals=fleet_approvals(until - timedelta(hours=10)))
        fleet = await client.start_workflow(
            FakeFleet.run,
            FleetStatus(
                state=state, breaker=BreakerStatus(drained_in_window=0, cap=4, open=False), policy=FleetPolicy()
            ),
            id=fleet_workflow_id(cluster),
            task_queue=jobs_queue,
        )
        # Nobody polls this queue: its status cannot be read.
        orphan = await _start_job(client, cluster, f"gone-{uuid.uuid4().hex}", 404, FakeJobInput(runs=(gave_up,)))
        query = visibility_query(cluster, since, until)

        async def all_listed() -> bool:
            return len([wf async for wf in client.list_workflows(query)]) == 4

        await _until(all_listed)
        handle = await client.start_workflow(
            AuditWorkflow.run,
            AuditInput(cluster=cluster, since=since, until=until, out_dir=str(tmp_path / "out")),
            id=f"rebound/{cluster}/audit-test",
            task_queue=audit_queue,
        )
        result = await handle.result()
        await orphan.terminate("test over")
        await fleet.terminate("test over")
        await client.get_workflow_handle(f"rebound/{cluster}/job/101").terminate("test over")

    assert (result.jobs, result.incidents, result.unreadable_runs) == (2, 5, 1)
    # Approvals of the period (builders' table): a-1 .. a-6, a-8, a-9; a-7 was requested after it. a-6 was decided
    # after it: pending here, with a-3 and a-8.
    assert (result.approvals_waited, result.approvals_pending) == (8, 3)
    assert (result.detection_p50_s, result.detection_p95_s) == (10.0, 82.0)
    assert (result.action_p50_s, result.action_p95_s) == (30.0, 57.0)
    report = _read_json(result.paths.json_path)
    assert Path(result.paths.json_path).parent == tmp_path / "out"
    assert report["runs_listed"] == 4
    assert [f["workflow_id"] for f in report["failures"]] == [f"rebound/{cluster}/job/404"]
    assert report["failures"][0]["kind"] == "QUERY_TIMEOUT"
    assert {r["key"]: r["count"] for r in report["by_cause"]} == {
        "xid-79": 2,
        "node-down": 1,
        "straggler": 1,
        "user-bug": 1,
    }
    assert report["top_nodes"][0] == {"node": "n1", "incidents": 2, "drains": 1}
    approvals = report["approvals"]
    assert (approvals["fleet"], approvals["fleet_workflow_id"]) == ("read", fleet_workflow_id(cluster))
    assert approvals["by_kind"] == [
        {"kind": "drain", "total": 6, "approved": 3, "rejected": 0, "expired": 1, "pending": 2},
        {"kind": "restart", "total": 2, "approved": 0, "rejected": 1, "expired": 0, "pending": 1},
    ]
    # Waits of the five decided in the period: a-2 20, a-9 60, a-4 900, a-5 900 (expired), a-1 1000 s.
    assert approvals["wait"]["values"] == [20.0, 60.0, 900.0, 900.0, 1000.0]
    assert (approvals["wait"]["p50"], approvals["wait"]["max"]) == (900.0, 1000.0)
    assert {r["key"]: r["count"] for r in approvals["deciders"]} == {
        "bob": 2,
        "alice": 1,
        "carol": 1,
        "nobody (expired)": 1,
    }
    assert [r["id"] for r in approvals["rows"]] == ["a-8", "a-1", "a-4", "a-2", "a-3", "a-9", "a-5", "a-6"]
    goodput = {g["job_id"]: g for g in report["goodput"]}
    # 101 runs on: 300 + 600 + 600 s down (incident 1 merged from both runs, resumed). 202 closed at once: its
    # open incident (detected before the run started) covers all of its observed window.
    assert goodput[101]["downtime_s"] == 1500.0
    assert goodput[101]["goodput"] == pytest.approx(1 - 1500 / goodput[101]["observed_s"], abs=1e-6)
    assert 6 * 3600 - 10 < goodput[101]["observed_s"] <= 6 * 3600
    assert goodput[202]["goodput"] == 0.0 and goodput[202]["downtime_s"] == goodput[202]["observed_s"] > 0
    html = _read(result.paths.html_path)
    assert html.count("<svg ") == 8 and "train-101" in html  # eight charts, the last one the approvals'
    assert "<td>drain</td><td>6</td><td>3</td><td>0</td><td>1</td><td>2</td>" in html
    md = _read(result.paths.markdown_path)
    assert "| 101 | train-101 |" in md
    assert "8 action(s) waited for approval, 3 still pending at the end of the period." in md
    assert f"- Fleet rebound/{cluster}/fleet read: 8 approval(s) of the period." in md
    # The recorded history replays against the current code: the workflow is deterministic.
    replayer = Replayer(workflows=[AuditWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(await handle.fetch_history())


def _settings(cluster: str, queue: str, **audit: Any) -> Settings:
    return Settings(
        cluster_name=cluster,
        temporal=TemporalSettings(task_queue=queue),
        audit=AuditSettings(**audit),
    )


async def test_ensure_audit_schedule_is_idempotent_and_follows_the_settings(
    temporal_client: Client, tmp_path: Path
) -> None:
    client, cluster = temporal_client, f"s-{uuid.uuid4().hex[:8]}"
    queue = f"audit-{uuid.uuid4().hex}"
    handle = client.get_schedule_handle(audit_schedule_id(cluster))

    async def described() -> tuple[list[float], AuditInput, str, bool]:
        desc = await handle.describe()
        action = desc.schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        [inp] = await client.data_converter.decode(list(action.args), [AuditInput])
        every = [i.every.total_seconds() for i in desc.schedule.spec.intervals]
        return every, inp, action.workflow, desc.schedule.state.paused

    try:
        assert await ensure_audit_schedule(client, _settings(cluster, queue)) is ScheduleOutcome.CREATED
        assert await ensure_audit_schedule(client, _settings(cluster, queue)) is ScheduleOutcome.UNCHANGED
        every, inp, wf_type, paused = await described()
        assert (every, inp, wf_type, paused) == ([3600.0], AuditInput(cluster=cluster, period_s=3600.0), "Audit", False)

        # An operator pauses it; the interval changes: updated in place, still paused.
        await handle.pause(note="maintenance")
        outcome = await ensure_audit_schedule(client, _settings(cluster, queue, interval_s=7200, period_s=86400))
        assert outcome is ScheduleOutcome.UPDATED
        every, inp, _, paused = await described()
        assert (every, inp.period_s, paused) == ([7200.0], 86400.0, True)
        assert (await handle.describe()).schedule.state.note == "maintenance"
        assert await ensure_audit_schedule(client, _settings(cluster, queue, interval_s=7200, period_s=86400)) is (
            ScheduleOutcome.UNCHANGED
        )

        # A triggered action runs the real workflow: the scheduled run audits the period before its scheduled time.
        await handle.unpause()
        async with _workers(client, f"jobs-{uuid.uuid4().hex}", queue, tmp_path / "reports"):
            await handle.trigger()
            audits = f'WorkflowType = "Audit" AND ReboundCluster = "{cluster}"'

            async def one_audit() -> bool:
                return len([wf async for wf in client.list_workflows(audits)]) == 1

            await _until(one_audit)
            [wf] = [wf async for wf in client.list_workflows(audits)]
            result = await client.get_workflow_handle(wf.id, result_type=AuditResult).result()
        assert wf.id.startswith(audit_schedule_id(cluster) + "-")
        assert (result.until - result.since).total_seconds() == 86400
        assert abs((result.until - wf.start_time).total_seconds()) < 5
        assert Path(result.paths.html_path).parent == tmp_path / "reports"
        assert _read(result.paths.html_path).startswith("<!DOCTYPE html>")

        assert await ensure_audit_schedule(client, _settings(cluster, queue, enabled=False)) is ScheduleOutcome.DELETED
        assert await ensure_audit_schedule(client, _settings(cluster, queue, enabled=False)) is ScheduleOutcome.ABSENT
    finally:
        schedules = [s.id async for s in await client.list_schedules()]
        if handle.id in schedules:
            await handle.delete()


async def test_rebound_audit_runs_one_on_demand(
    temporal_client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, cluster = temporal_client, f"c-{uuid.uuid4().hex[:8]}"
    queue = f"audit-{uuid.uuid4().hex}"
    settings = _settings(cluster, queue)
    async with _workers(client, f"jobs-{uuid.uuid4().hex}", queue, tmp_path / "reports"):
        progress = io.StringIO()  # not a terminal: no spinner
        rc = await run_audit(settings, 2 * 3600, as_json=True, client=client, progress=progress)
        out = capsys.readouterr().out
        assert rc == 0 and progress.getvalue() == ""
        result = AuditResult.model_validate_json(out)
        assert (result.cluster, result.jobs, result.incidents) == (cluster, 0, 0)
        assert (result.until - result.since).total_seconds() == 7200
        report = _read_json(result.paths.json_path)
        assert report["cluster"] == cluster and result.approvals_waited == 0
        assert (report["approvals"]["fleet"], report["approvals"]["total"]) == ("missing", 0)
        assert f"- no Fleet (rebound/{cluster}/fleet not found): approvals not read, 0 reported." in _read(
            result.paths.markdown_path
        )

        rc = await run_audit(settings, 600, client=client, progress=progress)
        text = capsys.readouterr().out
        # The console path: settings from the environment, its own connection and event loop.
        monkeypatch.setenv("REBOUND_TEMPORAL__ADDRESS", client.service_client.config.target_host)
        monkeypatch.setenv("REBOUND_TEMPORAL__TASK_QUEUE", queue)
        monkeypatch.setenv("REBOUND_CLUSTER_NAME", cluster)
        assert await asyncio.to_thread(main, ["audit", "--since", "90m", "--json"]) == 0
        console = AuditResult.model_validate_json(capsys.readouterr().out)
        assert (console.until - console.since).total_seconds() == 5400 and console.until > result.until
    assert rc == 0
    assert f"{cluster} " in text and "0 job(s), 0 incident(s), goodput -" in text and "  html      " in text

    # A worker that cannot write its report directory: the workflow fails, the command says so and exits 1.
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    async with _workers(client, f"jobs-{uuid.uuid4().hex}", queue, blocker / "reports"):
        rc = await run_audit(settings, 600, client=client, progress=io.StringIO())
    err = capsys.readouterr().err
    assert rc == 1 and f"failed: CONFIGURATION: cannot write the audit report to {blocker / 'reports'}" in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _SlowHandle:
    id = "slow"

    def __init__(self, delay_s: float) -> None:
        self._delay_s = delay_s

    async def result(self) -> str:
        await asyncio.sleep(self._delay_s)
        return "done"


async def test_progress_spinner_on_a_terminal_and_timeout() -> None:
    term = _Terminal()
    got = await wait_with_progress(cast(Any, _SlowHandle(0.35)), 5.0, "auditing lab", term)
    assert cast(object, got) == "done"
    shown = term.getvalue()
    assert shown.count("\r") >= 3 and "auditing lab:" in shown and " s" in shown
    assert shown.endswith("\r\x1b[K")  # the line is cleared before the result is printed
    with pytest.raises(TimeoutError):
        await wait_with_progress(cast(Any, _SlowHandle(5.0)), 0.3, "auditing lab", io.StringIO())
