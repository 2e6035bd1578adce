"""PyTorch DCP directories written by torch itself, complete and broken."""

from __future__ import annotations

from pathlib import Path

from activities.checkpoints.dcp import check_dcp, storage_entries
from activities.checkpoints.scan import scan_checkpoints
from tests.unit.checkpoints.conftest import Torch, truncate
from workflows.domain.checkpoints import CheckpointFormat, CheckpointStatus

F = CheckpointFormat.TORCH_DCP


def test_storage_entries_are_read_from_the_metadata_pickle(torch_files: Torch) -> None:
    entries = storage_entries(torch_files.dcp / ".metadata")
    assert entries and all(name.endswith(".distcp") for name in entries)
    for name, size in entries.items():
        assert (torch_files.dcp / name).stat().st_size >= size > 0


def test_complete_save_is_valid_with_its_metadata_time(torch_files: Torch, tmp_path: Path) -> None:
    d = torch_files.copy_dcp(tmp_path / "ckpt_200")
    verdict = check_dcp(d, F, 200)
    assert verdict.status is CheckpointStatus.VALID, verdict.reason
    assert verdict.saved_at is not None


def test_missing_metadata_is_an_unfinished_save(torch_files: Torch, tmp_path: Path) -> None:
    d = torch_files.copy_dcp(tmp_path / "c")
    (d / ".metadata").unlink()
    verdict = check_dcp(d, F, None)
    assert verdict.status is CheckpointStatus.INCOMPLETE and "no .metadata" in verdict.reason


def test_leftover_metadata_tmp_is_an_interrupted_save(torch_files: Torch, tmp_path: Path) -> None:
    d = torch_files.copy_dcp(tmp_path / "c")
    (d / ".metadata.tmp").write_bytes(b"partial")
    assert check_dcp(d, F, None).status is CheckpointStatus.INCOMPLETE


def test_truncated_missing_and_zero_byte_shards(torch_files: Torch, tmp_path: Path) -> None:
    shard = next(iter(storage_entries(torch_files.dcp / ".metadata")))
    cut = torch_files.copy_dcp(tmp_path / "cut")
    truncate(cut / shard)
    assert "truncated" in check_dcp(cut, F, None).reason
    gone = torch_files.copy_dcp(tmp_path / "gone")
    (gone / shard).unlink()
    assert "missing" in check_dcp(gone, F, None).reason
    empty = torch_files.copy_dcp(tmp_path / "empty")
    (empty / shard).write_bytes(b"")
    assert check_dcp(empty, F, None).status is CheckpointStatus.INCOMPLETE


def test_damaged_metadata_is_unreadable_not_guessed(torch_files: Torch, tmp_path: Path) -> None:
    d = torch_files.copy_dcp(tmp_path / "c")
    truncate(d / ".metadata")
    verdict = check_dcp(d, F, None)
    assert verdict.status is CheckpointStatus.UNREADABLE and "unreadable metadata" in verdict.reason


def test_per_rank_metadata_variant(torch_files: Torch, tmp_path: Path) -> None:
    d = torch_files.copy_dcp(tmp_path / "c")
    (d / ".metadata").rename(d / "__0.metadata")  # use_collectives=False: each rank writes __{rank}.metadata
    assert check_dcp(d, F, None).status is CheckpointStatus.VALID
    (d / "__1_0.distcp").write_bytes(b"x" * 10)  # rank 1 wrote shards, never its metadata
    verdict = check_dcp(d, F, None)
    assert verdict.status is CheckpointStatus.INCOMPLETE and "__1.metadata" in verdict.reason


def test_torchtitan_step_dirs_newest_valid_wins(torch_files: Torch, tmp_path: Path) -> None:
    torch_files.copy_dcp(tmp_path / "step-100")
    partial = torch_files.copy_dcp(tmp_path / "step-200")
    (partial / ".metadata").unlink()
    report = scan_checkpoints(tmp_path)
    assert report.format is CheckpointFormat.TORCHTITAN
    assert report.latest_valid is not None and report.latest_valid.step == 100
    assert [(i.step, "no .metadata" in i.reason) for i in report.incomplete] == [(200, True)]


def test_plain_dcp_directory_given_itself(torch_files: Torch, tmp_path: Path) -> None:
    d = torch_files.copy_dcp(tmp_path / "run")
    report = scan_checkpoints(d)
    assert report.latest_valid is not None and report.latest_valid.path == str(d)
    assert report.format is F
