"""Recording the histories the replay tests check (opt-in: ``REBOUND_RECORD_HISTORIES=<dir>``, ``make
record-histories``).

With the variable set, the e2e session runs only the scenarios of ``SCENARIOS``. It starts a fresh ClusterWatch
(the lab's Temporal state outlives ``lab down``, so the running one may carry an older session's code), and at
the end of each scenario that passed it fetches the histories of the workflows the scenario drove and writes
them to ``<dir>/<scenario>.<WorkflowType>[.<n>].json`` (``WorkflowHistory.to_json()``: the same JSON as
``temporal workflow show --output json``), with one row per file in ``<dir>/manifest.json``. The Fleet and the
ClusterWatch never end: their history is taken up to the moment of recording (a running workflow's partial
history replays like a whole one). A file of the same name is replaced; other files in ``<dir>`` stay (see
docs/adr/012-replay-and-workflow-versioning.md for the histories kept across a patch).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError

from tests.lab_support import REPO, LabHandle, lab_rebound_settings
from workers.client import connect
from workers.discovery import start_cluster_watch
from workflows.constants import (
    CLUSTER_WATCH_WORKFLOW,
    FLEET_WORKFLOW,
    JOB_RECOVERY_WORKFLOW,
    cluster_watch_workflow_id,
    fleet_workflow_id,
)

ENV_VAR = "REBOUND_RECORD_HISTORIES"
MANIFEST = "manifest.json"
#: Where ``make record-histories`` writes (the replay tests read it); excluded from the "dirty" check.
HISTORIES_IN_REPO = "tests/replay/histories"
#: Above this a history makes the replay tests slow and the diff unreadable: record a shorter scenario instead.
MAX_HISTORY_BYTES = 1_000_000


@dataclass(frozen=True)
class Scenario:
    """A recorded scenario: its name in file names and the workflow types whose histories it yields."""

    name: str
    workflow_types: tuple[str, ...]


#: e2e test -> what it records. The session runs only these tests while recording. The ClusterWatch is taken twice:
#: after its first job (opt-in, the first test) and after the last scenario (every job found and gone).
SCENARIOS: dict[str, Scenario] = {
    "test_comment_opts_a_job_in_and_only_that_job": Scenario("opt-in", (CLUSTER_WATCH_WORKFLOW, JOB_RECOVERY_WORKFLOW)),
    "test_rank_crash_drains_its_node_and_resumes_elsewhere": Scenario("rank-crash", (JOB_RECOVERY_WORKFLOW,)),
    "test_node_crash_drains_the_dead_node_and_resumes_elsewhere": Scenario("node-crash", (JOB_RECOVERY_WORKFLOW,)),
    "test_xid_79_drains_the_gpus_node_and_resumes_elsewhere": Scenario("xid-79", (JOB_RECOVERY_WORKFLOW,)),
    "test_user_bug_gives_up_without_draining_anything": Scenario(
        "user-bug", (JOB_RECOVERY_WORKFLOW, CLUSTER_WATCH_WORKFLOW)
    ),
    "test_hung_rank_is_detected_within_its_window_dumped_and_restarted": Scenario("hang", (JOB_RECOVERY_WORKFLOW,)),
    "test_slowed_rank_is_reported_within_ten_steps_and_left_alone": Scenario("straggler", (JOB_RECOVERY_WORKFLOW,)),
    "test_two_jobs_sharing_a_bad_node_drain_it_once_and_both_restart_elsewhere": Scenario(
        "shared-node-drain", (JOB_RECOVERY_WORKFLOW, FLEET_WORKFLOW)
    ),
    "test_three_nodes_failing_at_once_hold_at_the_cap_and_an_approval_after_a_worker_kill_completes": Scenario(
        "breaker-approval", (JOB_RECOVERY_WORKFLOW, FLEET_WORKFLOW)
    ),
    "test_a_drained_node_whose_check_job_passes_is_resumed": Scenario("node-check-pass", (FLEET_WORKFLOW,)),
    "test_a_node_whose_ranks_cannot_complete_the_all_reduce_is_held_with_the_job_id": Scenario(
        "node-check-held", (FLEET_WORKFLOW,)
    ),
}


def recording_dir() -> Path | None:
    """Where histories go, or None when this session does not record."""
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value).resolve() if value else None


def is_recorded(test_name: str) -> bool:
    return test_name in SCENARIOS


async def start_fresh_cluster_watch(handle: LabHandle) -> None:
    """End the running ClusterWatch and start it again as the worker does, so its history is this code's."""
    _code_commit()  # the tree as the worker started it
    settings = lab_rebound_settings(handle)
    client = await connect(settings.temporal)
    with contextlib.suppress(RPCError):
        await client.get_workflow_handle(cluster_watch_workflow_id(settings.cluster_name)).terminate(
            reason="recording histories: a ClusterWatch of this session's code"
        )
    await start_cluster_watch(client, settings)


async def record_scenario(handle: LabHandle, test_name: str, since: datetime, out_dir: Path) -> list[Path]:
    """Write the histories of the workflows ``test_name`` drove (JobRecoveries started since ``since``)."""
    scenario = SCENARIOS[test_name]
    settings = lab_rebound_settings(handle)
    client = await connect(settings.temporal)
    histories: list[tuple[str, WorkflowHistory, str]] = []
    for wf_type in scenario.workflow_types:
        if wf_type == JOB_RECOVERY_WORKFLOW:
            histories += await _job_recoveries(client, since)
        else:
            wf_id = fleet_workflow_id if wf_type == FLEET_WORKFLOW else cluster_watch_workflow_id
            histories.append((wf_type, *await _latest_run(client, wf_id(settings.cluster_name))))
    return write_histories(out_dir, test_name, histories)


def write_histories(out_dir: Path, test_name: str, histories: list[tuple[str, WorkflowHistory, str]]) -> list[Path]:
    """Write ``(workflow type, history, run id)`` of one scenario and its rows of the manifest."""
    scenario = SCENARIOS[test_name]
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    counts: dict[str, int] = {}
    rows: list[dict[str, object]] = []
    commit, now = _code_commit(), datetime.now(UTC).isoformat(timespec="seconds")
    for wf_type, history, run_id in histories:
        counts[wf_type] = counts.get(wf_type, 0) + 1
        suffix = f".{counts[wf_type]}" if counts[wf_type] > 1 else ""
        path = out_dir / f"{scenario.name}.{wf_type}{suffix}.json"
        text = history.to_json()
        if len(text) > MAX_HISTORY_BYTES:
            raise AssertionError(f"{path.name}: {len(text)} bytes of history; record a shorter scenario")
        path.write_text(text + "\n")
        written.append(path)
        rows.append(
            {
                "file": path.name,
                "scenario": scenario.name,
                "test": test_name,
                "workflow_type": wf_type,
                "workflow_id": history.workflow_id,
                "run_id": run_id,
                "events": len(history.events),
                "commit": commit,
                "recorded_at": now,
            }
        )
    _update_manifest(out_dir, scenario.name, rows)
    return written


async def _job_recoveries(client: Client, since: datetime) -> list[tuple[str, WorkflowHistory, str]]:
    """Every JobRecovery run started since ``since``, oldest first (a continued-as-new run is one more file)."""
    query = f'WorkflowType = "{JOB_RECOVERY_WORKFLOW}" AND StartTime >= "{since.isoformat()}"'
    runs = [wf async for wf in client.list_workflows(query)]
    runs.sort(key=lambda wf: (wf.start_time, wf.id))
    out = []
    for wf in runs:
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        out.append((JOB_RECOVERY_WORKFLOW, history, wf.run_id))
    return out


async def _latest_run(client: Client, workflow_id: str) -> tuple[WorkflowHistory, str]:
    handle = client.get_workflow_handle(workflow_id)
    run_id = (await handle.describe()).run_id
    return await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history(), run_id


def _update_manifest(out_dir: Path, scenario: str, rows: list[dict[str, object]]) -> None:
    """Replace this scenario's rows of the manifest (the other scenarios' rows stay)."""
    path = out_dir / MANIFEST
    old: list[dict[str, object]] = json.loads(path.read_text()) if path.exists() else []
    kept = [row for row in old if row.get("scenario") != scenario]
    for row in old:  # a file of this scenario the new recording did not write again is stale
        if row.get("scenario") == scenario and not any(r["file"] == row["file"] for r in rows):
            (out_dir / str(row["file"])).unlink(missing_ok=True)
    merged = sorted([*kept, *rows], key=lambda r: str(r["file"]))
    path.write_text(json.dumps(merged, indent=2) + "\n")


@functools.cache
def _code_commit() -> str:
    """The commit the lab's worker runs, ``-dirty`` when tracked code differed from it (the histories aside).

    Taken once, when the session starts recording: re-recorded histories modify tracked files as the session goes.
    """
    head = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){HISTORIES_IN_REPO}")
    return f"{head}-dirty" if changed else head


def _git(*argv: str) -> str:
    done = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip()
