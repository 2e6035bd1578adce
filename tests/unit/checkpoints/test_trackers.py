"""Megatron-LM and DeepSpeed: checkpoints behind a tracker file (ahead of, behind, empty), rank completeness."""

from __future__ import annotations

from pathlib import Path

from activities.checkpoints.scan import scan_checkpoints
from tests.unit.checkpoints.conftest import Torch, truncate
from workflows.domain.checkpoints import CheckpointFormat, CheckpointStatus

TRACKER = "latest_checkpointed_iteration.txt"


def megatron_iter(root: Path, it: int, torch_files: Torch, ranks: int = 2) -> Path:
    d = root / f"iter_{it:07d}"
    for tp in range(ranks):
        (d / f"mp_rank_{tp:02d}").mkdir(parents=True)
        (d / f"mp_rank_{tp:02d}" / "model_optim_rng.pt").write_bytes(
            torch_files.megatron.get(it, torch_files.megatron[100])
        )
    return d


def status_of(root: Path) -> dict[str, tuple[CheckpointStatus, str]]:
    return {Path(c.path).name: (c.status, c.reason) for c in scan_checkpoints(root).checked}


def test_megatron_legacy_complete_then_tracker_ahead_behind_empty(torch_files: Torch, tmp_path: Path) -> None:
    megatron_iter(tmp_path, 100, torch_files)
    megatron_iter(tmp_path, 200, torch_files)
    (tmp_path / TRACKER).write_text("200")
    report = scan_checkpoints(tmp_path)
    assert report.format is CheckpointFormat.MEGATRON
    assert report.latest_valid is not None and report.latest_valid.step == 200 and not report.incomplete

    (tmp_path / TRACKER).write_text("300")  # ahead: names a save that is not there
    report = scan_checkpoints(tmp_path)
    assert report.latest_valid is not None and report.latest_valid.step == 200
    assert [i.step for i in report.incomplete] == [300]

    (tmp_path / TRACKER).write_text("100")  # behind: iter 200 was never finalised
    report = scan_checkpoints(tmp_path)
    assert report.latest_valid is not None and report.latest_valid.step == 100
    assert "not finalised" in status_of(tmp_path)["iter_0000200"][1]

    (tmp_path / TRACKER).write_text("")
    verdict = status_of(tmp_path)[TRACKER]
    assert verdict[0] is CheckpointStatus.INCOMPLETE and "empty" in verdict[1]
    assert scan_checkpoints(tmp_path).latest_valid.step == 200  # type: ignore[union-attr]


def test_megatron_missing_rank_and_truncated_rank_file(torch_files: Torch, tmp_path: Path) -> None:
    megatron_iter(tmp_path, 100, torch_files, ranks=1)  # args say 2-way tensor parallel: rank 01 missing
    assert "mp_rank_01" in status_of(tmp_path)["iter_0000100"][1]
    d = megatron_iter(tmp_path, 200, torch_files)
    truncate(d / "mp_rank_01" / "model_optim_rng.pt")
    assert status_of(tmp_path)["iter_0000200"][0] is CheckpointStatus.INCOMPLETE
    (d / "mp_rank_01" / "model_optim_rng.pt").write_bytes(b"")
    assert "empty" in status_of(tmp_path)["iter_0000200"][1]


def test_megatron_torch_dist(torch_files: Torch, tmp_path: Path) -> None:
    d = torch_files.copy_dcp(tmp_path / "iter_0000500")
    (d / "common.pt").write_bytes(torch_files.plain)
    (tmp_path / TRACKER).write_text("500")
    assert (
        "metadata.json missing" in status_of(tmp_path)["iter_0000500"][1]
        or "no metadata.json" in status_of(tmp_path)["iter_0000500"][1]
    )
    (d / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
    report = scan_checkpoints(tmp_path)
    assert report.latest_valid is not None and report.latest_valid.step == 500


def deepspeed_tag(root: Path, step: int, torch_files: Torch, dp: int = 2) -> Path:
    d = root / f"global_step{step}"
    d.mkdir()
    (d / "mp_rank_00_model_states.pt").write_bytes(torch_files.deepspeed_model)
    for rank in range(dp):
        (d / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(torch_files.plain)
    return d


def test_deepspeed_latest_and_zero_shards(torch_files: Torch, tmp_path: Path) -> None:
    deepspeed_tag(tmp_path, 100, torch_files)
    deepspeed_tag(tmp_path, 200, torch_files)
    (tmp_path / "latest").write_text("global_step200")
    report = scan_checkpoints(tmp_path)
    assert report.format is CheckpointFormat.DEEPSPEED
    assert report.latest_valid is not None and report.latest_valid.step == 200

    (tmp_path / "global_step200" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    report = scan_checkpoints(tmp_path)
    assert report.latest_valid is not None and report.latest_valid.step == 100
    assert "data-parallel rank 1" in report.incomplete[0].reason

    (tmp_path / "latest").write_text("global_step300")  # ahead
    assert "tracker ahead" in status_of(tmp_path)["global_step300"][1]

    (tmp_path / "latest").write_text("global_step100")  # behind: 200 did not finish
    assert "newer than latest" in status_of(tmp_path)["global_step200"][1]


def test_deepspeed_world_size_from_model_states(torch_files: Torch, tmp_path: Path) -> None:
    deepspeed_tag(tmp_path, 100, torch_files, dp=1)  # the model states say dp_world_size 2: the last shard is gone
    assert "1 of 2" in status_of(tmp_path)["global_step100"][1]


def test_megatron_pipeline_and_expert_rank_directories(torch_files: Torch, tmp_path: Path) -> None:
    d = tmp_path / "iter_0000100"
    for tp in range(2):
        for pp in range(2):
            for ep in range(2):
                rank = d / f"mp_rank_{tp:02d}_{pp:03d}_{ep:03d}"
                rank.mkdir(parents=True)
                (rank / "model_optim_rng.pt").write_bytes(torch_files.megatron[100])
    (tmp_path / TRACKER).write_text("100")
    assert scan_checkpoints(tmp_path).latest_valid is not None
    for f in (d / "mp_rank_01_001_001").iterdir():
        f.unlink()
    (d / "mp_rank_01_001_001").rmdir()
    assert "mp_rank_01_001_001 missing" in status_of(tmp_path)["iter_0000100"][1]
