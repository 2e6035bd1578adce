"""The two activities through Temporal's ActivityEnvironment, with their frozen payloads."""

from __future__ import annotations

import os
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.checkpoints.activities import CheckpointActivities
from activities.logs.job_logs import LogPolicy
from tests.unit.checkpoints.conftest import Torch
from tests.unit.checkpoints.test_frameworks import hf_checkpoint
from workflows.domain.checkpoints import (
    CheckpointQuarantineInput,
    CheckpointQuarantineResult,
    CheckpointReport,
    CheckpointScanInput,
    QuarantineAction,
)

# No roots, no owner required: the worker's default policy (what these tests exercise besides the policy's).
_OPEN = CheckpointActivities(LogPolicy())
checkpoint_scan = _OPEN.checkpoint_scan
checkpoint_quarantine = _OPEN.checkpoint_quarantine


async def test_scan_then_quarantine(torch_files: Torch, tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 100, torch_files)
    hf_checkpoint(tmp_path, 200, torch_files, state=False)
    env = ActivityEnvironment()
    report = await env.run(checkpoint_scan, CheckpointScanInput(dir=str(tmp_path)))
    assert CheckpointReport.model_validate_json(report.model_dump_json()) == report  # survives the converter
    assert report.latest_valid is not None and report.latest_valid.step == 100 and report.incomplete
    result = await env.run(
        checkpoint_quarantine, CheckpointQuarantineInput(dir=str(tmp_path), expected_owner_uid=os.getuid())
    )
    assert CheckpointQuarantineResult.model_validate_json(result.model_dump_json()) == result
    assert result.action is QuarantineAction.QUARANTINED
    report = await env.run(checkpoint_scan, CheckpointScanInput(dir=str(tmp_path)))
    assert not report.incomplete


async def test_scan_of_a_missing_directory_is_a_report_not_a_failure(tmp_path: Path) -> None:
    report = await ActivityEnvironment().run(checkpoint_scan, CheckpointScanInput(dir=str(tmp_path / "gone")))
    assert report.error is not None and report.latest_valid is None


async def test_quarantine_without_the_jobs_uid_is_refused(torch_files: Torch, tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 100, torch_files)
    hf_checkpoint(tmp_path, 200, torch_files, state=False)
    result = await ActivityEnvironment().run(checkpoint_quarantine, CheckpointQuarantineInput(dir=str(tmp_path)))
    assert result.action is QuarantineAction.REFUSED and (tmp_path / "checkpoint-200").is_dir()  # noqa: ASYNC240


async def test_scan_outside_the_roots_is_refused_and_reads_nothing(torch_files: Torch, tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    hf_checkpoint(elsewhere, 100, torch_files)
    (root / "link").symlink_to(elsewhere)  # a symlink under the root does not bring its target inside
    acts = CheckpointActivities(LogPolicy([root]))
    env = ActivityEnvironment()
    for directory in (elsewhere, root / "link", root / ".." / "elsewhere"):
        report = await env.run(acts.checkpoint_scan, CheckpointScanInput(dir=str(directory)))
        assert report.error is not None and "outside the log roots" in report.error, directory
        assert report.latest_valid is None and not report.checked
    hf_checkpoint(root / "run", 100, torch_files)
    report = await env.run(acts.checkpoint_scan, CheckpointScanInput(dir=str(root / "run")))
    assert report.error is None and report.latest_valid is not None and report.latest_valid.step == 100


async def test_quarantine_outside_the_roots_is_refused_and_moves_nothing(torch_files: Torch, tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    hf_checkpoint(elsewhere, 100, torch_files)
    hf_checkpoint(elsewhere, 200, torch_files, state=False)
    acts = CheckpointActivities(LogPolicy([root]))
    result = await ActivityEnvironment().run(
        acts.checkpoint_quarantine, CheckpointQuarantineInput(dir=str(elsewhere), expected_owner_uid=os.getuid())
    )
    assert result.action is QuarantineAction.REFUSED and "outside the log roots" in result.reason
    assert (elsewhere / "checkpoint-200").is_dir() and not (elsewhere / ".rebound-quarantine").exists()  # noqa: ASYNC240


async def test_owner_required_refuses_another_users_directory_and_an_unknown_user(
    torch_files: Torch, tmp_path: Path
) -> None:
    hf_checkpoint(tmp_path, 100, torch_files)
    hf_checkpoint(tmp_path, 200, torch_files, state=False)
    acts = CheckpointActivities(LogPolicy(require_owner=True))
    env = ActivityEnvironment()
    other = os.getuid() + 1
    report = await env.run(acts.checkpoint_scan, CheckpointScanInput(dir=str(tmp_path), expected_owner_uid=other))
    assert report.error is not None and f"owned by uid {os.getuid()}" in report.error and not report.checked
    report = await env.run(acts.checkpoint_scan, CheckpointScanInput(dir=str(tmp_path)))
    assert report.error is not None and "user id is unknown" in report.error  # fails closed
    result = await env.run(
        acts.checkpoint_quarantine, CheckpointQuarantineInput(dir=str(tmp_path), expected_owner_uid=other)
    )
    assert result.action is QuarantineAction.REFUSED and (tmp_path / "checkpoint-200").is_dir()  # noqa: ASYNC240
    mine = await env.run(acts.checkpoint_scan, CheckpointScanInput(dir=str(tmp_path), expected_owner_uid=os.getuid()))
    assert mine.error is None and mine.latest_valid is not None and mine.latest_valid.step == 100
