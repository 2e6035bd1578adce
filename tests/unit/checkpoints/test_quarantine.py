"""Quarantine and restore: renames and tracker rewrites, idempotence, refusals (symlinks, foreign owners)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from activities.checkpoints.quarantine import (
    QUARANTINE_DIR,
    QuarantineRefused,
    quarantine_partial_newest,
    restore_quarantine,
)
from activities.checkpoints.scan import scan_checkpoints
from tests.unit.checkpoints.conftest import Torch
from tests.unit.checkpoints.test_frameworks import hf_checkpoint
from tests.unit.checkpoints.test_trackers import TRACKER, deepspeed_tag, megatron_iter
from workflows.domain.checkpoints import QuarantineAction

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


def test_partial_newest_directory_is_set_aside_and_restored(torch_files: Torch, tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 100, torch_files)
    partial = hf_checkpoint(tmp_path, 200, torch_files, state=False)
    os.chmod(partial, 0o750)
    result = quarantine_partial_newest(tmp_path)
    assert result.action is QuarantineAction.QUARANTINED and result.set_aside == ("checkpoint-200",)
    assert result.fallback is not None and result.fallback.step == 100
    moved = tmp_path / QUARANTINE_DIR / "checkpoint-200"
    assert not partial.exists() and moved.is_dir()
    assert moved.stat().st_mode & 0o777 == 0o750  # mode kept (a rename)
    manifest = json.loads((tmp_path / QUARANTINE_DIR / "manifest.json").read_text())
    assert [e["name"] for e in manifest["entries"]] == ["checkpoint-200"]
    # what HF's get_last_checkpoint would see now: the highest checkpoint-N is the valid one
    assert max(p.name for p in tmp_path.glob("checkpoint-*")) == "checkpoint-100"
    assert quarantine_partial_newest(tmp_path).action is QuarantineAction.NOTHING  # idempotent

    restored = restore_quarantine(tmp_path)
    assert restored.restored == ("checkpoint-200",) and not restored.left
    assert partial.is_dir() and not moved.exists()
    assert restore_quarantine(tmp_path).restored == ()  # idempotent


def test_restore_leaves_a_name_a_new_save_took(torch_files: Torch, tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 100, torch_files)
    hf_checkpoint(tmp_path, 200, torch_files, state=False)
    quarantine_partial_newest(tmp_path)
    hf_checkpoint(tmp_path, 200, torch_files)  # the resumed job saved step 200 again, completely
    result = restore_quarantine(tmp_path)
    assert result.restored == () and "took its name" in result.left[0]
    assert (tmp_path / QUARANTINE_DIR / "checkpoint-200").is_dir()


def test_nothing_to_fall_back_to_is_refused(torch_files: Torch, tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 200, torch_files, state=False)
    result = quarantine_partial_newest(tmp_path)
    assert result.action is QuarantineAction.REFUSED and (tmp_path / "checkpoint-200").exists()


def test_megatron_tracker_ahead_is_pointed_back_and_restored(torch_files: Torch, tmp_path: Path) -> None:
    megatron_iter(tmp_path, 100, torch_files)
    (tmp_path / TRACKER).write_text("200")  # names a save that never finished
    megatron_iter(tmp_path, 200, torch_files, ranks=1)
    result = quarantine_partial_newest(tmp_path)
    assert result.action is QuarantineAction.QUARANTINED
    assert (tmp_path / TRACKER).read_text().strip() == "100"
    assert (tmp_path / (TRACKER + ".rebound-orig")).read_text() == "200"
    assert (tmp_path / "iter_0000200").is_dir()  # tracker formats: directories stay where they are
    assert quarantine_partial_newest(tmp_path).action is QuarantineAction.NOTHING
    restore_quarantine(tmp_path)
    assert (tmp_path / TRACKER).read_text() == "200" and not (tmp_path / (TRACKER + ".rebound-orig")).exists()


def test_deepspeed_latest_is_pointed_back(torch_files: Torch, tmp_path: Path) -> None:
    deepspeed_tag(tmp_path, 100, torch_files)
    deepspeed_tag(tmp_path, 200, torch_files, dp=1)
    (tmp_path / "latest").write_text("global_step200")
    assert quarantine_partial_newest(tmp_path).action is QuarantineAction.QUARANTINED
    assert (tmp_path / "latest").read_text().strip() == "global_step100"
    assert scan_checkpoints(tmp_path).latest_valid.step == 100  # type: ignore[union-attr]


def test_symlinked_directory_and_entries_are_refused(torch_files: Torch, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    hf_checkpoint(real, 100, torch_files)
    hf_checkpoint(real, 200, torch_files, state=False)
    (tmp_path / "link").symlink_to(real)
    assert quarantine_partial_newest(tmp_path / "link").action is QuarantineAction.REFUSED
    with pytest.raises(QuarantineRefused):
        restore_quarantine(tmp_path / "link")

    other = tmp_path / "other"
    hf_checkpoint(other, 100, torch_files)
    elsewhere = hf_checkpoint(tmp_path / "elsewhere", 300, torch_files, state=False)
    (other / "checkpoint-300").symlink_to(elsewhere)
    result = quarantine_partial_newest(other)
    assert result.action is QuarantineAction.REFUSED and "symlink" in result.reason
    assert (other / "checkpoint-300").is_symlink() and elsewhere.is_dir()


@root_only
def test_foreign_owner_is_refused(torch_files: Torch, tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 100, torch_files)
    partial = hf_checkpoint(tmp_path, 200, torch_files, state=False)
    assert quarantine_partial_newest(tmp_path, expected_owner_uid=4242).action is QuarantineAction.REFUSED
    os.chown(tmp_path, 4242, 4242)
    os.chown(partial, 4343, 4343)  # someone else's directory inside the job's
    result = quarantine_partial_newest(tmp_path, expected_owner_uid=4242)
    assert result.action is QuarantineAction.REFUSED and "uid 4343" in result.reason and partial.is_dir()
    os.chown(partial, 4242, 4242)
    result = quarantine_partial_newest(tmp_path, expected_owner_uid=4242)
    assert result.action is QuarantineAction.QUARANTINED
    assert (tmp_path / QUARANTINE_DIR).stat().st_uid == 4242
    assert (tmp_path / QUARANTINE_DIR / "manifest.json").stat().st_uid == 4242
    assert (tmp_path / QUARANTINE_DIR / "checkpoint-200").stat().st_uid == 4242


def test_lightning_partial_last_is_replaced_by_a_link_to_the_latest_valid(torch_files: Torch, tmp_path: Path) -> None:
    (tmp_path / "epoch=0-step=100.ckpt").write_bytes(torch_files.plain)
    (tmp_path / "last.ckpt").write_bytes(torch_files.plain[:100])  # a copy cut short: Lightning would load it
    os.utime(tmp_path / "epoch=0-step=100.ckpt", (1, 1))  # older than the partial last.ckpt
    report = scan_checkpoints(tmp_path)
    assert report.latest_valid is not None and report.latest_valid.step == 100
    result = quarantine_partial_newest(tmp_path)
    assert result.action is QuarantineAction.QUARANTINED
    assert os.readlink(tmp_path / "last.ckpt") == "epoch=0-step=100.ckpt"  # ckpt_path="last" still finds one
    assert quarantine_partial_newest(tmp_path).action is QuarantineAction.NOTHING
    assert restore_quarantine(tmp_path).restored == ("last.ckpt",)
    assert not (tmp_path / "last.ckpt").is_symlink() and (tmp_path / "last.ckpt").stat().st_size == 100


def test_lightning_broken_last_link_is_moved_not_followed(torch_files: Torch, tmp_path: Path) -> None:
    (tmp_path / "epoch=0-step=100.ckpt").write_bytes(torch_files.plain)
    os.symlink("epoch=0-step=200.ckpt", tmp_path / "last.ckpt")  # the checkpoint it named is gone
    os.utime(tmp_path / "epoch=0-step=100.ckpt", (1, 1))
    result = quarantine_partial_newest(tmp_path)
    assert result.action is QuarantineAction.QUARANTINED
    assert os.readlink(tmp_path / "last.ckpt") == "epoch=0-step=100.ckpt"
    assert os.readlink(tmp_path / QUARANTINE_DIR / "last.ckpt") == "epoch=0-step=200.ckpt"


def test_nemo_partial_with_its_marker_needs_nothing_without_it_is_refused(torch_files: Torch, tmp_path: Path) -> None:
    from tests.unit.checkpoints.test_frameworks import nemo_checkpoint

    nemo_checkpoint(tmp_path, 100, torch_files)
    newest = nemo_checkpoint(tmp_path, 200, torch_files)
    marker = newest.with_name(newest.name + "-unfinished")
    marker.touch()
    assert quarantine_partial_newest(tmp_path).action is QuarantineAction.NOTHING  # NeMo skips it itself
    marker.unlink()
    (newest / "context" / "io.json").unlink()
    (newest / "context").rmdir()
    result = quarantine_partial_newest(tmp_path)
    assert result.action is QuarantineAction.REFUSED and "by hand" in result.reason and newest.is_dir()
