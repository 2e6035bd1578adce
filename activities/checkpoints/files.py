"""File-structure checks shared by every format: sizes, a ``torch.save`` zip's directory, safetensors headers, JSON.

Nothing here loads a tensor or runs pickled code: a ``torch.save`` file is checked as the zip archive it is (its
central directory, every entry inside the file), a safetensors file by its 8-byte header length, its JSON header
and the data size that header promises. Each check returns the problem in words, or None when the file is sound;
an ``OSError`` other than "no such file" is raised to the caller, who reports the checkpoint as unreadable.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from activities.checkpoints.inert_pickle import UnreadablePickle, load_inert
from workflows.domain.checkpoints import CheckpointFormat, CheckpointStatus

__all__ = [
    "find_step_dirs",
    "TMP_SUFFIXES",
    "Candidate",
    "guarded",
    "incomplete",
    "json_file",
    "leftover_tmp",
    "modified_at",
    "problem_or_valid",
    "safetensors_keys",
    "safetensors_problem",
    "step_in_name",
    "torch_save_fields",
    "torch_save_problem",
    "unreadable",
]

#: What writers call a file or directory still being written (``x.tmp``, DCP's ``.metadata.tmp``, ``.tmp-x``).
TMP_SUFFIXES = (".tmp", ".temp", ".partial")
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
_MAX_JSON = 64 * 1024 * 1024
_STEP = re.compile(r"(?:step|iter|global_step)[=_-]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Candidate:
    """One checkpoint the scan looked at, with its verdict (the scanner turns these into the report)."""

    path: Path
    format: CheckpointFormat
    step: int | None
    status: CheckpointStatus
    reason: str
    saved_at: datetime | None = None


def unreadable(path: Path, fmt: CheckpointFormat, step: int | None, error: OSError) -> Candidate:
    """A candidate Rebound could not look at: never read as complete or incomplete."""
    return Candidate(path, fmt, step, CheckpointStatus.UNREADABLE, f"cannot read: {error.strerror or error}")


def modified_at(path: Path) -> datetime | None:
    """The file's modification time in UTC (None when it is gone)."""
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
    except FileNotFoundError:
        return None


def step_in_name(name: str) -> int | None:
    """``step=120``, ``step_000120``, ``iter_0000120``, ``global_step120`` -> 120; None when the name has none."""
    m = _STEP.search(name)
    return int(m.group(1)) if m else None


def leftover_tmp(directory: Path) -> list[str]:
    """Names in ``directory`` that a writer uses while a save is in flight (an interrupted save leaves them)."""
    return sorted(e.name for e in os.scandir(directory) if e.name.endswith(TMP_SUFFIXES) or e.name.startswith(".tmp"))


def json_file(path: Path) -> Any:
    """A JSON file's content.

    Raises:
        ValueError: Not JSON, empty, or larger than 64 MiB (the message says which).
        OSError: It cannot be read (``FileNotFoundError`` when it is missing).
    """
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"{path.name} is empty")
    if size > _MAX_JSON:
        raise ValueError(f"{path.name} is {size} bytes, too large for a checkpoint's JSON")
    try:
        return json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path.name} is not valid JSON ({e})") from e


def torch_save_problem(path: Path) -> str | None:
    """What is wrong with a ``torch.save`` file, or None: present, not empty, a zip whose entries all lie inside.

    ``torch.save`` writes a zip archive (stored, uncompressed) whose central directory is at the end, so a
    truncated or preallocated-and-unfinished file has none. A legacy (pre-1.6, non-zip) file starts with a pickle;
    only its size can be checked, which the reason says.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path.name} is missing"
    if size == 0:
        return f"{path.name} is empty (0 bytes)"
    if not zipfile.is_zipfile(path):
        with path.open("rb") as f:
            head = f.read(2)
        if head[:1] == b"\x80":
            return None  # legacy pickle-based torch.save: nothing more to check without loading it
        return f"{path.name} is not a torch.save archive (no zip directory: truncated or still being written)"
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError) as e:
        return f"{path.name} has a damaged zip directory ({e})"
    if not any(entry.filename.endswith("data.pkl") for entry in entries):
        return f"{path.name} is a zip archive without data.pkl (not a torch.save file)"
    for entry in entries:
        if entry.header_offset + entry.compress_size > size:
            return f"{path.name} is truncated ({entry.filename} ends past the end of the file)"
    return None


def torch_save_fields(path: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """Top-level plain values (ints, strings) of a ``torch.save``'d dict, read from its ``data.pkl`` without
    running it (``inert_pickle``); attributes of a pickled object (``args.tensor_model_parallel_size``) by dotted
    name. Empty when the file is not such a zip or cannot be read: these are hints, never a verdict.
    """
    from activities.checkpoints.inert_pickle import state_of

    try:
        with zipfile.ZipFile(path) as archive:
            name = next((e for e in archive.infolist() if e.filename.endswith("data.pkl")), None)
            if name is None or name.file_size > 64 * 1024 * 1024:
                return {}
            top = load_inert(archive.read(name))
    except (OSError, zipfile.BadZipFile, ValueError, UnreadablePickle):
        return {}
    if not isinstance(top, dict):
        return {}
    out: dict[str, Any] = {}
    for dotted in names:
        value: Any = top
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else state_of(value).get(part)
        if isinstance(value, (int, str)) and not isinstance(value, bool):
            out[dotted] = value
    return out


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file, or None: an 8-byte little-endian header length, a JSON header of
    that length, and at least as many data bytes as the header's largest ``data_offsets`` end.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path.name} is missing"
    if size == 0:
        return f"{path.name} is empty (0 bytes)"
    if size < 8:
        return f"{path.name} is truncated ({size} bytes, shorter than its header length)"
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > _MAX_SAFETENSORS_HEADER or 8 + header_len > size:
            return f"{path.name} is truncated or damaged (header of {header_len} bytes in a {size}-byte file)"
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return f"{path.name} has a damaged header (not JSON)"
    if not isinstance(header, dict):
        return f"{path.name} has a damaged header (not a JSON object)"
    end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"{path.name} has a damaged header (tensor {key!r} without data_offsets)"
        end = max(end, offsets[1])
    if 8 + header_len + end > size:
        return f"{path.name} is truncated ({size} bytes, its header promises {8 + header_len + end})"
    return None


def safetensors_keys(path: Path) -> set[str]:
    """The tensor names in a safetensors header (call after ``safetensors_problem`` found none)."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    return {k for k in header if k != "__metadata__"}


def guarded(path: Path, fmt: CheckpointFormat, step: int | None, check: Callable[[], Candidate]) -> Candidate:
    """Run one candidate's check; an I/O error makes it unreadable, a vanished path incomplete (never valid)."""
    try:
        return check()
    except FileNotFoundError as e:
        return Candidate(path, fmt, step, CheckpointStatus.INCOMPLETE, f"{Path(e.filename or path).name} vanished")
    except OSError as e:
        return unreadable(path, fmt, step, e)


def find_step_dirs(
    root: Path,
    names: list[str],
    pattern: re.Pattern[str],
    fmt: CheckpointFormat,
    check: Callable[[Path, int], Candidate],
) -> tuple[list[Candidate], set[str]]:
    """The directories among ``names`` (entries of ``root``) whose name ``pattern`` matches with the step as its
    first group (``checkpoint-N``, ``step-N``), each checked by ``check``; and the names claimed."""
    found: list[Candidate] = []
    claimed: set[str] = set()
    for name in names:
        m = pattern.match(name)
        if m and (root / name).is_dir():
            step = int(m.group(1))
            found.append(guarded(root / name, fmt, step, partial(check, root / name, step)))
            claimed.add(name)
    return found, claimed


def problem_or_valid(
    path: Path, fmt: CheckpointFormat, step: int | None, problem: str | None, ok: str, saved_at: datetime | None
) -> Candidate:
    """The candidate for a check that found ``problem`` (incomplete) or nothing (valid, ``ok`` says what held)."""
    if problem is not None:
        return Candidate(path, fmt, step, CheckpointStatus.INCOMPLETE, problem)
    return Candidate(path, fmt, step, CheckpointStatus.VALID, ok, saved_at)


def incomplete(path: Path, fmt: CheckpointFormat, step: int | None, reason: str) -> Candidate:
    """A save that was started and not finished (or damaged since): ``reason`` says what is missing."""
    return Candidate(path, fmt, step, CheckpointStatus.INCOMPLETE, reason)
