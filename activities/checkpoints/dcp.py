"""PyTorch Distributed Checkpoint (DCP) directories, as ``torch.distributed.checkpoint.save`` writes them.

Rank 0 writes ``.metadata`` only after every rank's shards are written (``.metadata.tmp``, fsync, rename:
``torch/distributed/checkpoint/filesystem.py``, ``_FileSystemWriter.finish``), so a directory without it is a save
that did not finish. With ``.metadata`` there, each storage entry (``relative_path``, ``offset``, ``length``) must
lie inside its file: a missing or short shard means the directory was damaged after the save (or a re-save into it
was interrupted, which also leaves ``.metadata.tmp``). Without collectives each rank writes ``__{rank}.metadata``
for its own ``__{rank}_*.distcp`` files instead.

``.metadata`` is a pickle; it is read with ``inert_pickle`` (nothing in it runs) and only its storage entries are
used. One that cannot be taken apart is reported as "unreadable metadata", never guessed at.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from activities.checkpoints.files import Candidate, modified_at, unreadable
from activities.checkpoints.inert_pickle import UnreadablePickle, load_inert, state_of
from workflows.domain.checkpoints import CheckpointFormat, CheckpointStatus

__all__ = ["METADATA", "check_dcp", "is_dcp_dir", "storage_entries"]

METADATA = ".metadata"
_RANK_METADATA = re.compile(r"^__(\d+)\.metadata$")
_RANK_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")


def is_dcp_dir(directory: Path) -> bool:
    """True when ``directory`` holds DCP files (a ``.metadata``, per-rank metadata, ``.distcp`` shards)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return any(n.startswith(METADATA) or _RANK_METADATA.match(n) or n.endswith(".distcp") for n in names)


def storage_entries(metadata: Path) -> dict[str, int]:
    """Each file a DCP metadata file names, with the size it must at least have (the largest offset + length).

    Raises:
        UnreadablePickle: The file is not a DCP metadata pickle this reader can take apart.
        OSError: It cannot be read.
    """
    root: Any = load_inert(metadata.read_bytes())
    storage = state_of(root).get("storage_data")
    if not isinstance(storage, dict):
        raise UnreadablePickle("no storage_data in it")
    needed: dict[str, int] = {}
    for info in storage.values():
        fields = state_of(info)
        rel, offset, length = fields.get("relative_path"), fields.get("offset"), fields.get("length")
        if not (isinstance(rel, str) and isinstance(offset, int) and isinstance(length, int)):
            raise UnreadablePickle("a storage entry without relative_path, offset and length")
        needed[rel] = max(needed.get(rel, 0), offset + length)
    return needed


def check_dcp(directory: Path, fmt: CheckpointFormat, step: int | None) -> Candidate:
    """The verdict on one DCP directory (``fmt`` is the format that claims it: DCP, torchtitan, Lightning...)."""
    try:
        return _check(directory, fmt, step)
    except PermissionError as e:
        return unreadable(directory, fmt, step, e)
    except FileNotFoundError:
        return Candidate(directory, fmt, step, CheckpointStatus.INCOMPLETE, "the directory vanished while checked")
    except OSError as e:
        return unreadable(directory, fmt, step, e)


def _check(directory: Path, fmt: CheckpointFormat, step: int | None) -> Candidate:
    names = set(os.listdir(directory))

    def incomplete(reason: str) -> Candidate:
        return Candidate(directory, fmt, step, CheckpointStatus.INCOMPLETE, reason)

    tmp = sorted(n for n in names if n.endswith(".metadata.tmp"))
    if tmp:
        return incomplete(f"{tmp[0]} left over: the save was interrupted while its metadata was written")
    if METADATA in names:
        metadata_files = [directory / METADATA]
    else:
        metadata_files = sorted(directory / n for n in names if _RANK_METADATA.match(n))
        if not metadata_files:
            return incomplete(f"no {METADATA}: DCP writes it last, so the save did not finish")
        with_metadata = {int(m.group(1)) for n in names if (m := _RANK_METADATA.match(n))}
        with_shards = {int(m.group(1)) for n in names if (m := _RANK_SHARD.match(n))}
        missing = sorted(
            (with_shards - with_metadata) | (set(range(max(with_metadata | with_shards) + 1)) - with_metadata)
        )
        if missing:
            return incomplete(f"no __{missing[0]}.metadata: rank {missing[0]}'s save did not finish")
    files = 0
    for metadata in metadata_files:
        if metadata.stat().st_size == 0:
            return incomplete(f"{metadata.name} is empty (0 bytes)")
        try:
            needed = storage_entries(metadata)
        except UnreadablePickle as e:
            return Candidate(
                directory, fmt, step, CheckpointStatus.UNREADABLE, f"unreadable metadata {metadata.name}: {e}"
            )
        for rel, size in sorted(needed.items()):
            shard = directory / rel
            try:
                have = shard.stat().st_size
            except FileNotFoundError:
                return incomplete(f"shard {rel} named in {metadata.name} is missing")
            if have < size:
                return incomplete(f"shard {rel} is truncated ({have} bytes, {metadata.name} needs {size})")
        files += len(needed)
    return Candidate(
        directory,
        fmt,
        step,
        CheckpointStatus.VALID,
        f"{METADATA if len(metadata_files) == 1 else f'{len(metadata_files)} rank metadata files'} present, "
        f"{files} shard file(s) complete",
        saved_at=max((t for m in metadata_files if (t := modified_at(m)) is not None), default=None),
    )
