"""Checkpoint files written by the real libraries, once per session, and helpers that lay out the documented
directory formats around them (Megatron, NeMo, DeepSpeed, HF Trainer and Lightning write by hand: they are not
installed here, and their layouts are what ``activities/checkpoints`` reads).
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Torch:
    """Bytes and directories made by torch itself."""

    dcp: Path
    """A directory written by ``torch.distributed.checkpoint.save`` (one process, no process group)."""
    plain: bytes
    """``torch.save`` of a training-state dict with ``global_step`` 42."""
    megatron: dict[int, bytes]
    """``model_optim_rng.pt`` of a 2-way tensor-parallel run (``args`` an ``argparse.Namespace``), by iteration."""
    deepspeed_model: bytes
    """``mp_rank_00_model_states.pt`` of a run with ``dp_world_size`` 2, ``global_steps`` 100."""
    lightning_meta: bytes

    def copy_dcp(self, dst: Path) -> Path:
        shutil.copytree(self.dcp, dst, dirs_exist_ok=True)
        return dst


@pytest.fixture(scope="session")
def torch_files(tmp_path_factory: pytest.TempPathFactory) -> Torch:
    import io

    import torch
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    root = tmp_path_factory.mktemp("torch")

    def saved(obj: object) -> bytes:
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... assuming a single process"
        dcp_save({"model": {"w": torch.randn(8, 8), "b": torch.zeros(8)}, "step": 7}, checkpoint_id=str(root / "dcp"))
    megatron = {
        it: saved(
            {
                "iteration": it,
                "args": argparse.Namespace(tensor_model_parallel_size=2, pipeline_model_parallel_size=1),
                "model": {"w": torch.ones(4)},
            }
        )
        for it in (100, 200)
    }
    return Torch(
        dcp=root / "dcp",
        plain=saved({"global_step": 42, "model": {"w": torch.ones(16)}}),
        megatron=megatron,
        deepspeed_model=saved(
            {"dp_world_size": 2, "mp_world_size": 1, "global_steps": 100, "module": {"w": torch.ones(4)}}
        ),
        lightning_meta=saved({"global_step": 300, "epoch": 1}),
    )


def write_safetensors(path: Path, tensors: dict[str, int], *, cut: int = 0) -> Path:
    """A real safetensors file: 8-byte header length, JSON header, data (``tensors``: name -> float32 count);
    ``cut`` bytes removed from the end (a truncated shard)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, count in tensors.items():
        header[name] = {"dtype": "F32", "shape": [count], "data_offsets": [offset, offset + 4 * count]}
        offset += 4 * count
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    data = struct.pack("<Q", len(raw)) + raw + b"\0" * offset
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: len(data) - cut] if cut else data)
    return path


def truncate(path: Path, keep: int | None = None) -> None:
    """Cut a file to ``keep`` bytes (half of it by default)."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep is None else keep])
