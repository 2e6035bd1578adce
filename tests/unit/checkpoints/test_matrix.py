"""The issue's acceptance matrix through the command: for each format, a directory with a complete save at step 100
and a newer one at step 200, complete or broken the ways users hit (missing metadata, truncated shard, zero-byte
file, missing rank or shard, leftover temporary file, tracker ahead of or behind the directories).
``rebound checkpoints DIR --json`` must name step 200 when it is complete, else step 100 and the broken 200."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from activities.checkpoints.dcp import storage_entries
from deploy.demo.checkpoint import write_checkpoint
from tests.unit.checkpoints.conftest import Torch, truncate
from tests.unit.checkpoints.test_frameworks import hf_checkpoint, nemo_checkpoint
from tests.unit.checkpoints.test_trackers import TRACKER, deepspeed_tag, megatron_iter
from workers.cli import main

Build = Callable[[Path, int, Torch], Path]
Break = Callable[[Path], object]


def _dcp(name: str) -> Build:
    return lambda root, step, t: t.copy_dcp(root / name.format(step=step))


def _shard(d: Path) -> Path:
    metadata = d / ".metadata"
    return d / next(iter(storage_entries(metadata)))


def _megatron_dist(root: Path, step: int, t: Torch) -> Path:
    d = t.copy_dcp(root / f"iter_{step:07d}")
    (d / "common.pt").write_bytes(t.plain)
    (d / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
    (root / TRACKER).write_text(str(step))
    return d


def _megatron_legacy(root: Path, step: int, t: Torch) -> Path:
    d = megatron_iter(root, step, t)
    (root / TRACKER).write_text(str(step))
    return d


def _deepspeed(root: Path, step: int, t: Torch) -> Path:
    d = deepspeed_tag(root, step, t)
    (root / "latest").write_text(f"global_step{step}")
    return d


def _lightning_sharded(root: Path, step: int, t: Torch) -> Path:
    d = t.copy_dcp(root / f"epoch=0-step={step}.ckpt")
    (d / "meta.pt").write_bytes(t.lightning_meta)
    return d


def _lightning(root: Path, step: int, t: Torch) -> Path:
    p = root / f"epoch=0-step={step}.ckpt"
    p.write_bytes(t.plain)
    return p


def _demo(root: Path, step: int, t: Torch) -> Path:
    return write_checkpoint(root, step, b"weights" * 100).path


def _torch_save(root: Path, step: int, t: Torch) -> Path:
    p = root / f"model_step_{step}.pt"
    p.write_bytes(t.plain)
    return p


def _unlink(rel: str) -> Break:
    return lambda p: (p / rel).unlink()


def _empty(rel: str) -> Break:
    return lambda p: (p / rel).write_bytes(b"")


def _cut(rel: str) -> Break:
    return lambda p: truncate(p / rel)


def _touch(rel: str) -> Break:
    return lambda p: (p / rel).write_bytes(b"partial")


def _sibling(suffix: str) -> Break:
    return lambda p: p.with_name(p.name + suffix).touch()


def _tracker(name: str, value: str) -> Break:
    return lambda p: (p.parent / name).write_text(value)


def _shard_cut(p: Path) -> None:
    truncate(_shard(p))


def _shard_empty(p: Path) -> None:
    _shard(p).write_bytes(b"")


def _shard_gone(p: Path) -> None:
    _shard(p).unlink()


def _file_cut(p: Path) -> None:
    truncate(p)


def _file_empty(p: Path) -> None:
    p.write_bytes(b"")


def _file_tmp(p: Path) -> None:
    p.rename(p.with_name(p.name + ".tmp"))


CASES: dict[str, tuple[Build, dict[str, Break]]] = {
    "torch_dcp": (
        _dcp("ckpt_{step}"),
        {
            "missing metadata": _unlink(".metadata"),
            "truncated shard": _shard_cut,
            "zero-byte shard": _shard_empty,
            "missing shard": _shard_gone,
            "leftover tmp": _touch(".metadata.tmp"),
        },
    ),
    "torchtitan": (
        _dcp("step-{step}"),
        {"missing metadata": _unlink(".metadata"), "truncated shard": _shard_cut, "missing shard": _shard_gone},
    ),
    "megatron torch_dist": (
        _megatron_dist,
        {
            "missing metadata": _unlink("metadata.json"),
            "truncated shard": _shard_cut,
            "zero-byte common.pt": _empty("common.pt"),
            "tracker behind": _tracker(TRACKER, "100"),
        },
    ),
    "megatron legacy": (
        _megatron_legacy,
        {
            "truncated rank file": _cut("mp_rank_01/model_optim_rng.pt"),
            "zero-byte rank file": _empty("mp_rank_00/model_optim_rng.pt"),
            "missing rank": lambda p: shutil.rmtree(p / "mp_rank_01"),
            "tracker behind": _tracker(TRACKER, "100"),
        },
    ),
    "nemo": (
        nemo_checkpoint,
        {
            "unfinished marker": _sibling("-unfinished"),
            "missing metadata": _unlink("weights/.metadata"),
            "truncated shard": lambda p: _shard_cut(p / "weights"),
            "missing shard": lambda p: _shard_gone(p / "weights"),
        },
    ),
    "hf_trainer": (
        lambda root, step, t: hf_checkpoint(root, step, t),
        {
            "missing trainer_state": _unlink("trainer_state.json"),
            "truncated shard": _cut("model-00002-of-00002.safetensors"),
            "zero-byte optimizer": _empty("optimizer.pt"),
            "missing shard": _unlink("model-00001-of-00002.safetensors"),
            "leftover tmp": _touch("optimizer.pt.tmp"),
        },
    ),
    "lightning": (_lightning, {"truncated": _file_cut, "zero-byte": _file_empty, "leftover tmp": _file_tmp}),
    "lightning sharded": (
        _lightning_sharded,
        {"missing meta.pt": _unlink("meta.pt"), "missing metadata": _unlink(".metadata"), "missing shard": _shard_gone},
    ),
    "deepspeed": (
        _deepspeed,
        {
            "missing ZeRO shard": _unlink("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"),
            "truncated model states": _cut("mp_rank_00_model_states.pt"),
            "zero-byte shard": _empty("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"),
            "tracker behind": _tracker("latest", "global_step100"),
        },
    ),
    "rebound_demo": (
        _demo,
        {"missing marker": _unlink("COMPLETE"), "truncated payload": _cut("state.pt"), "zero-byte": _empty("state.pt")},
    ),
    "torch_save": (_torch_save, {"truncated": _file_cut, "zero-byte": _file_empty, "leftover tmp": _file_tmp}),
}

MATRIX = [(fmt, None) for fmt in CASES] + [(fmt, brk) for fmt, (_, breaks) in CASES.items() for brk in breaks]


@pytest.mark.parametrize(("fmt", "broken"), MATRIX, ids=[f"{f}-{b or 'complete'}" for f, b in MATRIX])
def test_checkpoints_command(
    fmt: str, broken: str | None, torch_files: Torch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build, breaks = CASES[fmt]
    build(tmp_path, 100, torch_files)
    newest = build(tmp_path, 200, torch_files)
    if broken is not None:
        breaks[broken](newest)
    rc = main(["checkpoints", str(tmp_path), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    if broken is None:
        assert data["latest_valid"]["step"] == 200 and data["incomplete"] == []
        return
    assert data["latest_valid"]["step"] == 100, data
    assert [i["step"] for i in data["incomplete"]] == [200], data


@pytest.mark.parametrize("fmt", ["megatron torch_dist", "deepspeed"])
def test_tracker_ahead(fmt: str, torch_files: Torch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build, _ = CASES[fmt]
    build(tmp_path, 100, torch_files)
    build(tmp_path, 200, torch_files)
    tracker = TRACKER if fmt.startswith("megatron") else "latest"
    (tmp_path / tracker).write_text("300" if fmt.startswith("megatron") else "global_step300")
    assert main(["checkpoints", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["latest_valid"]["step"] == 200 and [i["step"] for i in data["incomplete"]] == [300]
