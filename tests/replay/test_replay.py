"""Replay every committed workflow history against today's workflow code (no lab, no server).

A history recorded from the lab (``make record-histories``, see ``tests/e2e/recording.py``) is the list of commands
a workflow issued. Replaying it with ``Replayer`` re-runs the current workflow code over it: a change in the
order or kind of commands (an activity, a timer, a child workflow, a signal to another workflow, an upsert) that
is not behind ``workflow.patched()`` fails here with a nondeterminism error, before it can break a workflow that
is running in production (docs/adr/012-replay-and-workflow-versioning.md).

The replayer is set up as the worker is: the same workflow classes (``workers.worker.WORKFLOWS``), the pydantic
data converter of ``workers.client.connect`` and the default sandbox (the worker sets no workflow runner).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from tests.replay.changed_workflows import JobRecoveryWithAnExtraTimer
from workers.worker import WORKFLOWS
from workflows.constants import CLUSTER_WATCH_WORKFLOW, FLEET_WORKFLOW, JOB_RECOVERY_WORKFLOW

HISTORIES = Path(__file__).parent / "histories"
MANIFEST = "manifest.json"


def _history_files() -> list[Path]:
    """Every committed history, in this folder and in folders of histories kept across a patch."""
    return sorted(p for p in HISTORIES.rglob("*.json") if p.name != MANIFEST)


def _manifest_row(path: Path) -> dict[str, object]:
    rows: list[dict[str, object]] = json.loads((path.parent / MANIFEST).read_text())
    row = next((r for r in rows if r["file"] == path.name), None)
    assert row is not None, f"{path.name} is not in {path.parent / MANIFEST}"
    return row


def _load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(str(_manifest_row(path)["workflow_id"]), path.read_text())


def _replayer(workflows: list[type]) -> Replayer:
    return Replayer(workflows=workflows, data_converter=pydantic_data_converter)


FILES = _history_files()
#: The history the gate test changes the workflow under: a whole recovery (drain, requeue, resume).
GATE_HISTORY = HISTORIES / "rank-crash.JobRecovery.json"


def test_histories_are_committed() -> None:
    """The gate is only as good as its histories: each long-lived workflow has some."""
    recorded = {_manifest_row(p)["workflow_type"] for p in FILES}
    assert {JOB_RECOVERY_WORKFLOW, FLEET_WORKFLOW, CLUSTER_WATCH_WORKFLOW} <= recorded, recorded


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(HISTORIES)) for p in FILES])
async def test_history_replays_on_current_code(path: Path) -> None:
    result = await _replayer(list(WORKFLOWS)).replay_workflow(_load(path), raise_on_replay_failure=False)
    if result.replay_failure is not None:
        raise AssertionError(
            f"{path.name} no longer replays: the change needs workflow.patched() (docs/adr/012)"
        ) from result.replay_failure


async def test_a_command_added_without_a_patch_fails_the_replay() -> None:
    """The gate works: a history that replays on the real JobRecovery must not replay on one with an extra timer."""
    history = _load(GATE_HISTORY)
    assert (
        await _replayer(list(WORKFLOWS)).replay_workflow(history, raise_on_replay_failure=False)
    ).replay_failure is None
    others = [w for w in WORKFLOWS if not issubclass(JobRecoveryWithAnExtraTimer, w)]
    with pytest.raises(NondeterminismError, match="Nondeterminism"):
        await _replayer([JobRecoveryWithAnExtraTimer, *others]).replay_workflow(history)
