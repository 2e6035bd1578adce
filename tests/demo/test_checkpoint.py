"""Checkpoint atomicity, validation and resume selection (pure file helpers, no torch)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from deploy.demo import checkpoint as ck


def _write(ckpt_dir: Path, step: int, payload: bytes | None = None) -> ck.CheckpointInfo:
    return ck.write_checkpoint(ckpt_dir, step, payload if payload is not None else f"state {step}".encode())


def test_write_then_find_latest(tmp_path: Path) -> None:
    for step in (5, 10, 15):
        _write(tmp_path, step)
    scan = ck.find_latest_valid(tmp_path)
    assert scan.latest is not None
    assert (scan.latest.step, scan.latest.name, scan.skipped) == (15, "step_000015", [])
    assert scan.latest.sha256 == hashlib.sha256(b"state 15").hexdigest()
    marker = (tmp_path / "step_000015" / "COMPLETE").read_text()
    assert marker == f"{scan.latest.sha256}  state.pt\n"
    meta = ck.read_meta(scan.latest)
    assert meta["step"] == 15 and meta["bytes"] == len(b"state 15")


def test_marker_is_sha256sum_compatible(tmp_path: Path) -> None:
    info = _write(tmp_path, 3)
    done = subprocess.run(["sha256sum", "-c", "COMPLETE"], cwd=info.path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_incomplete_and_corrupt_are_skipped_with_reasons(tmp_path: Path) -> None:
    _write(tmp_path, 10)
    _write(tmp_path, 20)
    (tmp_path / "step_000020" / "COMPLETE").unlink()
    _write(tmp_path, 30)
    (tmp_path / "step_000030" / "state.pt").write_bytes(b"flipped bits")
    _write(tmp_path, 40)
    (tmp_path / "step_000040" / "state.pt").unlink()
    _write(tmp_path, 50)
    (tmp_path / "step_000050" / "COMPLETE").write_text("not a checksum\n")
    (tmp_path / "step_000060").mkdir()  # a writer died between rename and marker
    (tmp_path / ".tmp-step_000070-123").mkdir()  # a writer died before the rename
    (tmp_path / "notes.txt").write_text("ignored")

    scan = ck.find_latest_valid(tmp_path)

    assert scan.latest is not None and scan.latest.step == 10
    reasons = dict(scan.skipped)
    assert list(reasons) == ["step_000060", "step_000050", "step_000040", "step_000030", "step_000020"]
    assert reasons["step_000060"].startswith("incomplete")
    assert reasons["step_000020"].startswith("incomplete")
    assert "malformed" in reasons["step_000050"]
    assert "state.pt missing" in reasons["step_000040"]
    assert "sha256 mismatch" in reasons["step_000030"]


def test_no_checkpoint(tmp_path: Path) -> None:
    assert ck.find_latest_valid(tmp_path / "missing").latest is None
    (tmp_path / "step_000001").mkdir()
    scan = ck.find_latest_valid(tmp_path)
    assert scan.latest is None and len(scan.skipped) == 1


def test_crash_before_rename_leaves_no_visible_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, 5)

    def dying_rename(src: object, dst: object) -> None:
        raise OSError("simulated crash during rename")

    monkeypatch.setattr(os, "rename", dying_rename)
    with pytest.raises(OSError, match="simulated crash"):
        _write(tmp_path, 10)
    monkeypatch.undo()

    scan = ck.find_latest_valid(tmp_path)
    assert scan.latest is not None and scan.latest.step == 5
    assert scan.skipped == []
    assert any(p.name.startswith(".tmp-step_000010") for p in tmp_path.iterdir())
    # The next save (by the single writer) clears the debris.
    _write(tmp_path, 10)
    ck.prune_checkpoints(tmp_path, keep=3)
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())


def test_crash_before_marker_is_incomplete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, 5)

    def dying_marker(path: Path, data: bytes) -> None:
        raise OSError("simulated crash before the marker")

    monkeypatch.setattr(ck, "atomic_write_bytes", dying_marker)
    with pytest.raises(OSError):
        _write(tmp_path, 10)
    monkeypatch.undo()
    scan = ck.find_latest_valid(tmp_path)
    assert scan.latest is not None and scan.latest.step == 5
    assert scan.skipped == [("step_000010", "incomplete: no COMPLETE marker")]
    # Saving that step again replaces the incomplete directory.
    info = _write(tmp_path, 10, b"second try")
    assert ck.find_latest_valid(tmp_path).latest == info
    assert (info.path / "state.pt").read_bytes() == b"second try"


def test_read_checkpoint_verifies(tmp_path: Path) -> None:
    _write(tmp_path, 8, b"payload")
    info, data = ck.read_checkpoint(tmp_path, 8)
    assert (info.step, data) == (8, b"payload")
    (tmp_path / "step_000008" / "state.pt").write_bytes(b"payloaD")
    with pytest.raises(ck.CheckpointError, match="sha256 mismatch"):
        ck.read_checkpoint(tmp_path, 8)
    with pytest.raises(ck.CheckpointError, match="does not exist"):
        ck.read_checkpoint(tmp_path, 9)


def test_prune_keeps_newest_valid(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20, 25):
        _write(tmp_path, step)
    (tmp_path / "step_000025" / "COMPLETE").unlink()  # newest is incomplete: kept, but does not count
    (tmp_path / "step_000003").mkdir()  # old debris

    removed = ck.prune_checkpoints(tmp_path, keep=2)

    assert sorted(p.name for p in removed) == ["step_000003", "step_000005", "step_000010"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000015", "step_000020", "step_000025"]


def test_prune_never_deletes_with_too_few_valid(tmp_path: Path) -> None:
    _write(tmp_path, 5)
    (tmp_path / "step_000001").mkdir()
    assert ck.prune_checkpoints(tmp_path, keep=3) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001", "step_000005"]
    with pytest.raises(ValueError):
        ck.prune_checkpoints(tmp_path, keep=0)


def test_write_is_durable_and_meta_is_json(tmp_path: Path) -> None:
    info = ck.write_checkpoint(tmp_path, 1_234_567, b"x", {"job_id": 3, "restart": 1})
    assert info.name == "step_1234567" and ck.parse_step_dir(info.name) == 1_234_567
    meta = json.loads((info.path / "meta.json").read_text())
    assert meta["job_id"] == 3 and meta["restart"] == 1 and meta["sha256"] == info.sha256
    assert not [p for p in os.listdir(info.path) if p.endswith(".tmp")]
