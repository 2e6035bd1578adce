"""Hugging Face Trainer, Lightning and NeMo layouts, laid out by hand around real torch and safetensors files."""

from __future__ import annotations

import json
import os
from pathlib import Path

from activities.checkpoints.scan import scan_checkpoints
from tests.unit.checkpoints.conftest import Torch, truncate, write_safetensors
from workflows.domain.checkpoints import CheckpointFormat, CheckpointStatus


def hf_checkpoint(root: Path, step: int, torch_files: Torch, *, sharded: bool = True, state: bool = True) -> Path:
    d = root / f"checkpoint-{step}"
    if sharded:
        write_safetensors(d / "model-00001-of-00002.safetensors", {"a.weight": 16, "a.bias": 4})
        write_safetensors(d / "model-00002-of-00002.safetensors", {"b.weight": 16})
        index = {
            "metadata": {"total_size": 144},
            "weight_map": {
                "a.weight": "model-00001-of-00002.safetensors",
                "a.bias": "model-00001-of-00002.safetensors",
                "b.weight": "model-00002-of-00002.safetensors",
            },
        }
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        write_safetensors(d / "model.safetensors", {"w": 8})
    (d / "optimizer.pt").write_bytes(torch_files.plain)
    (d / "rng_state.pth").write_bytes(torch_files.plain)
    if state:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return d


def verdicts(root: Path) -> dict[str, tuple[CheckpointStatus, str]]:
    return {Path(c.path).name: (c.status, c.reason) for c in scan_checkpoints(root).checked}


def test_hf_trainer_complete_and_each_break(torch_files: Torch, tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 100, torch_files, sharded=False)
    hf_checkpoint(tmp_path, 200, torch_files)
    report = scan_checkpoints(tmp_path)
    assert report.latest_valid is not None and report.latest_valid.step == 200
    assert report.format is CheckpointFormat.HF_TRAINER

    no_state = hf_checkpoint(tmp_path, 300, torch_files, state=False)
    assert "no trainer_state.json" in verdicts(tmp_path)["checkpoint-300"][1]
    (no_state / "trainer_state.json").write_text("")
    assert "empty" in verdicts(tmp_path)["checkpoint-300"][1]

    cut = hf_checkpoint(tmp_path, 400, torch_files)
    truncate(cut / "model-00002-of-00002.safetensors", keep=40)
    assert "truncated" in verdicts(tmp_path)["checkpoint-400"][1]

    missing = hf_checkpoint(tmp_path, 500, torch_files)
    (missing / "model-00001-of-00002.safetensors").unlink()
    assert "missing" in verdicts(tmp_path)["checkpoint-500"][1]

    unbound = hf_checkpoint(tmp_path, 600, torch_files)  # a shard that is not the one its index was written for
    write_safetensors(unbound / "model-00002-of-00002.safetensors", {"c.weight": 16})
    assert "lacks" in verdicts(tmp_path)["checkpoint-600"][1]

    zero = hf_checkpoint(tmp_path, 700, torch_files)
    (zero / "optimizer.pt").write_bytes(b"")
    assert "empty" in verdicts(tmp_path)["checkpoint-700"][1]

    tmp = hf_checkpoint(tmp_path, 800, torch_files)
    (tmp / "model.safetensors.tmp").write_bytes(b"x")
    assert "left over" in verdicts(tmp_path)["checkpoint-800"][1]

    report = scan_checkpoints(tmp_path)
    assert report.latest_valid is not None and report.latest_valid.step == 200  # get_last_checkpoint would take 800
    assert sorted(i.step for i in report.incomplete if i.step is not None) == [300, 400, 500, 600, 700, 800]


def test_lightning_files_symlinks_and_sharded_dirs(torch_files: Torch, tmp_path: Path) -> None:
    (tmp_path / "epoch=0-step=100.ckpt").write_bytes(torch_files.plain)
    (tmp_path / "epoch=0-step=200.ckpt").write_bytes(torch_files.plain)
    os.symlink("epoch=0-step=200.ckpt", tmp_path / "last.ckpt")
    report = scan_checkpoints(tmp_path)
    assert report.format is CheckpointFormat.LIGHTNING
    assert report.latest_valid is not None and report.latest_valid.step == 200
    by_name = verdicts(tmp_path)
    assert by_name["last.ckpt"][0] is CheckpointStatus.VALID

    (tmp_path / "epoch=0-step=200.ckpt").unlink()  # last.ckpt now a broken symlink
    by_name = verdicts(tmp_path)
    assert by_name["last.ckpt"][0] is CheckpointStatus.INCOMPLETE and "does not exist" in by_name["last.ckpt"][1]
    assert scan_checkpoints(tmp_path).latest_valid.step == 100  # type: ignore[union-attr]

    cut = tmp_path / "epoch=1-step=250.ckpt"
    cut.write_bytes(torch_files.plain)
    truncate(cut)
    assert "not a torch.save archive" in verdicts(tmp_path)[cut.name][1]

    sharded = torch_files.copy_dcp(tmp_path / "epoch=1-step=300.ckpt")
    assert "without meta.pt" in verdicts(tmp_path)[sharded.name][1]
    (sharded / "meta.pt").write_bytes(torch_files.lightning_meta)
    assert scan_checkpoints(tmp_path).latest_valid.path == str(sharded)  # type: ignore[union-attr]


def test_lightning_copy_of_last_reads_global_step_without_loading(torch_files: Torch, tmp_path: Path) -> None:
    (tmp_path / "last.ckpt").write_bytes(torch_files.plain)
    assert scan_checkpoints(tmp_path).latest_valid.step == 42  # type: ignore[union-attr]


def nemo_checkpoint(root: Path, step: int, torch_files: Torch) -> Path:
    d = root / f"megatron_gpt--val_loss=2.10-step={step}-consumed_samples={step * 8}.0"
    torch_files.copy_dcp(d / "weights")
    (d / "weights" / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
    (d / "context").mkdir()
    (d / "context" / "io.json").write_text("{}")
    return d


def test_nemo_unfinished_marker_and_missing_parts(torch_files: Torch, tmp_path: Path) -> None:
    nemo_checkpoint(tmp_path, 100, torch_files)
    newest = nemo_checkpoint(tmp_path, 200, torch_files)
    marker = newest.with_name(newest.name + "-unfinished")
    marker.touch()
    report = scan_checkpoints(tmp_path)
    assert report.format is CheckpointFormat.NEMO
    assert report.latest_valid is not None and report.latest_valid.step == 100
    assert [("-unfinished" in i.reason) for i in report.incomplete] == [True]
    assert len(report.checked) == 2  # the marker is not a checkpoint of its own
    marker.unlink()
    (newest / "weights" / "metadata.json").unlink()
    assert "metadata.json missing" in verdicts(tmp_path)[newest.name][1]
