"""Model weights as Hugging Face libraries write them: ``model.safetensors``, or shards bound by an index.

A sharded save is complete when every shard the index's ``weight_map`` names is present and sound, and each shard
holds the tensors the index puts in it: a shard that is present but not the one the index was written for (a
re-save interrupted between shards) is as bad as a missing one.
"""

from __future__ import annotations

from pathlib import Path

from activities.checkpoints.files import json_file, safetensors_keys, safetensors_problem, torch_save_problem

__all__ = ["SAFETENSORS_INDEX", "index_problem", "weights_problem"]

SAFETENSORS_INDEX = "model.safetensors.index.json"
_BIN_INDEX = "pytorch_model.bin.index.json"
_SINGLE_FILES = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin")


def index_problem(directory: Path, index_name: str) -> str | None:
    """What is wrong with a sharded save under ``directory`` by its index, or None when every shard is sound.

    Raises:
        OSError: A file cannot be read (not "missing", which is a problem in words).
    """
    try:
        index = json_file(directory / index_name)
    except FileNotFoundError:
        return f"{index_name} is missing"
    except ValueError as e:
        return str(e)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        return f"{index_name} has no weight_map"
    by_shard: dict[str, set[str]] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or "/" in shard or shard.startswith("."):
            return f"{index_name} maps {tensor!r} to an unusable file name {shard!r}"
        by_shard.setdefault(shard, set()).add(tensor)
    for shard, tensors in sorted(by_shard.items()):
        path = directory / shard
        if shard.endswith(".safetensors"):
            problem = safetensors_problem(path)
            if problem is None:
                absent = tensors - safetensors_keys(path)
                if absent:
                    problem = f"{shard} lacks {len(absent)} tensor(s) {index_name} puts there (e.g. {min(absent)!r})"
        else:
            problem = torch_save_problem(path)
        if problem is not None:
            return problem
    return None


def weights_problem(directory: Path) -> str | None:
    """What is wrong with the model weights in ``directory`` (index first, else a single file), or None.

    Raises:
        OSError: A file cannot be read.
    """
    for index_name in (SAFETENSORS_INDEX, _BIN_INDEX):
        if (directory / index_name).exists():
            return index_problem(directory, index_name)
    for name in _SINGLE_FILES:
        path = directory / name
        if path.exists() or path.is_symlink():
            return safetensors_problem(path) if name.endswith(".safetensors") else torch_save_problem(path)
    return "no model weights (no model.safetensors, no index, no pytorch_model.bin)"
