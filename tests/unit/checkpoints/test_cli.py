"""``rebound checkpoints DIR [--json]`` and ``rebound checkpoints restore DIR``: output shape and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from activities.checkpoints.quarantine import quarantine_partial_newest
from tests.unit.checkpoints.conftest import Torch
from tests.unit.checkpoints.test_frameworks import hf_checkpoint
from workers.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(["checkpoints", *argv])
    return rc, capsys.readouterr().out


def test_json_shape_and_exit_zero(torch_files: Torch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf_checkpoint(tmp_path, 100, torch_files)
    hf_checkpoint(tmp_path, 200, torch_files, state=False)
    rc, out = run(capsys, str(tmp_path), "--json")
    data = json.loads(out)
    assert rc == 0
    assert set(data) == {"dir", "format", "latest_valid", "incomplete", "checked"}
    assert data["format"] == "hf_trainer"
    assert set(data["latest_valid"]) == {"path", "step", "saved_at"} and data["latest_valid"]["step"] == 100
    assert data["latest_valid"]["saved_at"].endswith("+00:00")
    assert data["incomplete"] == [
        {"path": str(tmp_path / "checkpoint-200"), "step": 200, "reason": data["incomplete"][0]["reason"]}
    ]
    assert [(c["step"], c["status"], c["format"]) for c in data["checked"]] == [
        (200, "incomplete", "hf_trainer"),
        (100, "valid", "hf_trainer"),
    ]
    assert all(set(c) == {"path", "format", "step", "status", "reason"} for c in data["checked"])


def test_human_table(torch_files: Torch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf_checkpoint(tmp_path, 100, torch_files)
    rc, out = run(capsys, str(tmp_path))
    assert rc == 0 and "latest valid:" in out and "checkpoint-100" in out


def test_exit_one_when_none_valid_two_when_unreadable(
    torch_files: Torch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf_checkpoint(tmp_path, 200, torch_files, state=False)
    rc, out = run(capsys, str(tmp_path), "--json")
    assert rc == 1 and json.loads(out)["latest_valid"] is None
    assert run(capsys, str(tmp_path / "missing"), "--json")[0] == 2
    assert run(capsys, str(tmp_path / "a"), str(tmp_path / "b"))[0] == 2


def test_restore_command(torch_files: Torch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf_checkpoint(tmp_path, 100, torch_files)
    hf_checkpoint(tmp_path, 200, torch_files, state=False)
    quarantine_partial_newest(tmp_path)
    rc, out = run(capsys, "restore", str(tmp_path))
    assert rc == 0 and "restored checkpoint-200" in out and (tmp_path / "checkpoint-200").is_dir()
    assert run(capsys, "restore", str(tmp_path))[1].strip() == "nothing to restore"
    assert run(capsys, "restore", str(tmp_path / "missing"))[0] == 2
