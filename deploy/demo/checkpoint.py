"""Atomic checkpoints of the demo job, and finding the latest valid one. Pure file helpers: no torch here.

Layout under ``checkpoints/``:

    step_000120/state.pt     the payload (whatever bytes the trainer serialised)
    step_000120/meta.json    step, job id, restart, world size, save time
    step_000120/COMPLETE     "<sha256 hex>  state.pt": sha256sum's format, so ``sha256sum -c COMPLETE`` checks it

A checkpoint is written into ``.tmp-step_000120-<pid>/``, fsynced, renamed to ``step_000120/`` and only then
marked ``COMPLETE`` (itself written atomically). A reader therefore trusts a directory only when its marker
exists and the payload's checksum matches it: a crash at any point leaves either no step directory, one without a
marker, or a complete checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.demo.common import atomic_write_bytes, fsync_dir

PAYLOAD_NAME = "state.pt"
META_NAME = "meta.json"
MARKER_NAME = "COMPLETE"
TMP_PREFIX = ".tmp-"
DEFAULT_KEEP = 3
_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir_name(step: int) -> str:
    """``step_000120``: zero-padded so a plain directory listing sorts by step."""
    return f"step_{step:06d}"


def parse_step_dir(name: str) -> int | None:
    """The step a directory name stands for, or ``None`` if it is not a checkpoint directory."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint whose marker exists and whose payload matches the marker's checksum."""

    step: int
    path: Path
    sha256: str
    size: int

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def payload_path(self) -> Path:
        return self.path / PAYLOAD_NAME


@dataclass(frozen=True)
class CheckpointScan:
    """Result of looking for the latest valid checkpoint: it, and every newer one skipped with the reason."""

    latest: CheckpointInfo | None
    skipped: list[tuple[str, str]] = field(default_factory=list)


class CheckpointError(RuntimeError):
    """A specific checkpoint is missing, incomplete or corrupt."""


def _step_dirs(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """Checkpoint directories, newest first."""
    if not ckpt_dir.is_dir():
        return []
    found = [(step, p) for p in ckpt_dir.iterdir() if (step := parse_step_dir(p.name)) is not None and p.is_dir()]
    return sorted(found, reverse=True)


def verify_checkpoint(path: Path) -> CheckpointInfo:
    """Check one checkpoint directory: marker present and well-formed, payload present, checksum equal.

    Raises:
        CheckpointError: with the reason, phrased for a log line.
    """
    step = parse_step_dir(path.name)
    if step is None:
        raise CheckpointError(f"{path.name} is not a checkpoint directory name")
    marker = path / MARKER_NAME
    try:
        marker_text = marker.read_text()
    except FileNotFoundError:
        raise CheckpointError(f"incomplete: no {MARKER_NAME} marker") from None
    parts = marker_text.split()
    if len(parts) != 2 or not re.fullmatch(r"[0-9a-f]{64}", parts[0]) or parts[1] != PAYLOAD_NAME:
        raise CheckpointError(f"corrupt: malformed {MARKER_NAME} marker {marker_text.strip()[:80]!r}")
    expected = parts[0]
    try:
        data = (path / PAYLOAD_NAME).read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"corrupt: {PAYLOAD_NAME} missing") from None
    actual = sha256_hex(data)
    if actual != expected:
        raise CheckpointError(f"corrupt: sha256 mismatch (marker {expected[:12]}..., payload {actual[:12]}...)")
    return CheckpointInfo(step=step, path=path, sha256=actual, size=len(data))


def find_latest_valid(ckpt_dir: Path) -> CheckpointScan:
    """The newest checkpoint that verifies, with the reasons every newer one was skipped."""
    skipped: list[tuple[str, str]] = []
    for _, path in _step_dirs(ckpt_dir):
        try:
            return CheckpointScan(latest=verify_checkpoint(path), skipped=skipped)
        except CheckpointError as exc:
            skipped.append((path.name, str(exc)))
    return CheckpointScan(latest=None, skipped=skipped)


def read_checkpoint(ckpt_dir: Path, step: int) -> tuple[CheckpointInfo, bytes]:
    """Read and verify the payload of the checkpoint of one given step.

    The bytes returned are exactly the ones whose checksum was verified, so a concurrent rewrite cannot slip
    an unverified payload in between the check and the load.

    Raises:
        CheckpointError: the checkpoint is missing, incomplete or corrupt.
    """
    path = ckpt_dir / step_dir_name(step)
    if not path.is_dir():
        raise CheckpointError(f"{path.name} does not exist in {ckpt_dir}")
    info = verify_checkpoint(path)
    data = info.payload_path.read_bytes()
    if sha256_hex(data) != info.sha256:
        raise CheckpointError(f"corrupt: {path.name} changed while it was read")
    return info, data


def read_meta(info: CheckpointInfo) -> dict[str, Any]:
    """The checkpoint's ``meta.json`` (empty if unreadable: it is informational, the marker is authoritative)."""
    try:
        meta = json.loads((info.path / META_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def write_checkpoint(
    ckpt_dir: Path, step: int, payload: bytes, meta: Mapping[str, Any] | None = None
) -> CheckpointInfo:
    """Write one checkpoint atomically and mark it complete. Safe to call again for the same step.

    Args:
        ckpt_dir: the run's ``checkpoints/`` directory (created if missing).
        step: the number of optimizer steps the payload has done.
        payload: the serialised training state.
        meta: extra JSON-serialisable facts stored in ``meta.json``.

    Returns:
        The written, complete checkpoint.
    """
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / step_dir_name(step)
    tmp = ckpt_dir / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    _remove_tree(tmp)
    tmp.mkdir()
    digest = sha256_hex(payload)
    with (tmp / PAYLOAD_NAME).open("wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    meta_doc = {"step": step, "sha256": digest, "bytes": len(payload), **(meta or {})}
    with (tmp / META_NAME).open("w") as f:
        json.dump(meta_doc, f, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)
    if final.exists():
        # A directory of this step can only be left over from an attempt that did not reach it validly
        # (we resumed from an earlier step), so it is replaced; rename() cannot overwrite a non-empty dir.
        stale = ckpt_dir / f"{TMP_PREFIX}stale-{final.name}-{os.getpid()}"
        os.rename(final, stale)
        _remove_tree(stale)
    os.rename(tmp, final)
    fsync_dir(ckpt_dir)
    # The marker goes last: its presence is the commit point.
    atomic_write_bytes(final / MARKER_NAME, f"{digest}  {PAYLOAD_NAME}\n".encode())
    return CheckpointInfo(step=step, path=final, sha256=digest, size=len(payload))


def prune_checkpoints(ckpt_dir: Path, keep: int = DEFAULT_KEEP) -> list[Path]:
    """Keep the newest ``keep`` valid checkpoints; delete every checkpoint directory older than the oldest kept.

    Newer-but-invalid directories are left alone (they are evidence, and cheap), and nothing is deleted when no
    checkpoint verifies. Leftover temp directories of other processes are removed: only the single writer
    (rank 0) calls this, between saves, so no other write can be in flight.

    Returns:
        The directories removed.
    """
    if keep < 1:
        raise ValueError("keep must be at least 1")
    removed: list[Path] = []
    if ckpt_dir.is_dir():
        for p in ckpt_dir.iterdir():
            if p.name.startswith(TMP_PREFIX) and p.is_dir():
                _remove_tree(p)
                removed.append(p)
    valid: list[int] = []
    for step, path in _step_dirs(ckpt_dir):
        if len(valid) >= keep:
            break
        try:
            verify_checkpoint(path)
        except CheckpointError:
            continue
        valid.append(step)
    if len(valid) < keep:
        return removed
    oldest_kept = valid[-1]
    for step, path in _step_dirs(ckpt_dir):
        if step < oldest_kept:
            _remove_tree(path)
            removed.append(path)
    return removed
