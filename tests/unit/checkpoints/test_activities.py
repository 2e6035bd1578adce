"""The two activities through Temporal's ActivityEnvironment, with their frozen payloads."""

from __future__ import annotations

import os
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.checkpoints.activities import checkpoint_quarantine, checkpoint_scan
from tests.unit.checkpoints.conftest import Torch
from tests.unit.checkpoints.test_frameworks import hf_checkpoint
from workflows.domain.checkpoints import (
    CheckpointQuarantineInput,
    CheckpointQuarantineResult,
    CheckpointReport,
    CheckpointScanInput,
    QuarantineAction,
)


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
