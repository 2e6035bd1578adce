"""Setting a partial newest checkpoint aside so the framework's own resume picks the previous complete one, and
putting it back (``rebound checkpoints restore DIR``).

Directory and file formats (HF Trainer, torchtitan, DCP, Lightning, the demo, plain files): each incomplete
checkpoint newer than the latest valid one is renamed into ``DIR/.rebound-quarantine/`` (same file system: a rename,
never a copy or a delete; owner and mode stay as they are), where no framework looks; a Lightning ``last.ckpt`` set
aside is replaced by a symlink to the latest valid checkpoint (``ckpt_path="last"`` would otherwise start over).
NeMo skips its ``-unfinished`` saves itself; a NeMo save partial without the marker is refused.
Tracker formats (Megatron's ``latest_checkpointed_iteration.txt``, DeepSpeed's ``latest``): the tracker is
rewritten atomically to name the latest valid save, its original content kept beside it as
``<tracker>.rebound-orig``. Either way ``.rebound-quarantine/manifest.json`` records what was done, so
``restore_quarantine`` can undo it.

Safety: the directory is opened once without following symlinks and every step works relative to that handle;
a symlinked path (the directory, any component of it, or an entry to move; only a Lightning ``last*.ckpt`` link
is moved as the link it is, never followed) and a path whose owner is not the expected one (the job's user) are
refused, nothing touched. Both operations are idempotent.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from activities.checkpoints import deepspeed, megatron, nemo
from activities.checkpoints.scan import scan_checkpoints
from workflows.domain.checkpoints import (
    CheckpointFormat,
    CheckpointQuarantineResult,
    CheckpointRef,
    CheckpointReport,
    CheckpointRestoreResult,
    CheckpointStatus,
    QuarantineAction,
)

__all__ = ["QUARANTINE_DIR", "QuarantineRefused", "quarantine_partial_newest", "restore_quarantine"]

QUARANTINE_DIR = ".rebound-quarantine"
MANIFEST = "manifest.json"
ORIGINAL_SUFFIX = ".rebound-orig"
_LIGHTNING_LAST = re.compile(r"^last(-v?\d+)?\.ckpt$")
_TRACKER_FORMATS = (CheckpointFormat.MEGATRON, CheckpointFormat.DEEPSPEED)


class QuarantineRefused(Exception):
    """The directory or a path in it may not be touched (symlinked, foreign-owned, unreadable)."""


def quarantine_partial_newest(directory: Path, expected_owner_uid: int | None = None) -> CheckpointQuarantineResult:
    """Set aside every partial checkpoint newer than the latest valid one in ``directory``.

    Args:
        directory: The job's checkpoint directory.
        expected_owner_uid: The job's user; None: the directory's own owner.

    Returns:
        What was done (``NOTHING`` when nothing newer than the latest valid one is partial), or ``REFUSED`` with
        the reason; never raises for a refusal.
    """
    report = scan_checkpoints(directory)
    if report.error:
        return _refused(report.error)
    latest = report.latest_valid
    if latest is None:
        return _refused("no valid checkpoint to fall back to: nothing is set aside")
    try:
        with _opened(directory, expected_owner_uid) as (fd, owner):
            if latest.format in _TRACKER_FORMATS:
                done = _point_tracker(fd, owner, report)
            else:
                done = _rename_newer_partials(fd, owner, report)
    except QuarantineRefused as e:
        return _refused(str(e), report)
    except OSError as e:
        return _refused(f"cannot change {directory}: {e.strerror or e}", report)
    if not done:
        return CheckpointQuarantineResult(
            action=QuarantineAction.NOTHING,
            reason="no partial checkpoint newer than the latest valid one",
            fallback=latest,
        )
    return CheckpointQuarantineResult(
        action=QuarantineAction.QUARANTINED,
        reason=f"set aside {', '.join(done)}; the resume should pick {latest.path}",
        fallback=latest,
        set_aside=tuple(done),
    )


def restore_quarantine(directory: Path, expected_owner_uid: int | None = None) -> CheckpointRestoreResult:
    """Undo ``quarantine_partial_newest``: move every set-aside path back and restore every tracker.

    A path whose name a newer save has taken since, or a tracker the framework has rewritten since, is left as it
    is and named in ``left`` (its set-aside copy stays in the quarantine folder). Restoring twice is a no-op.

    Raises:
        QuarantineRefused: The directory is symlinked, foreign-owned or cannot be opened.
    """
    try:
        with _opened(directory, expected_owner_uid) as (fd, _owner):
            entries = _read_manifest(fd)
            restored: list[str] = []
            left: list[str] = []
            kept: list[dict[str, Any]] = []
            for entry in reversed(entries):  # undo in the reverse order: the last.ckpt link before its original
                outcome = _undo(fd, entry)
                if outcome is not None:
                    left.append(outcome)
                    kept.insert(0, entry)
                elif entry["kind"] != "link":
                    restored.insert(0, entry["name"])
            _write_manifest(fd, _owner, kept)
    except OSError as e:
        raise QuarantineRefused(f"cannot open {directory}: {e.strerror or e}") from e
    if not entries:
        summary = "nothing to restore"
    else:
        summary = f"restored {', '.join(restored) or 'nothing'}" + (f"; left {len(left)}" if left else "")
    return CheckpointRestoreResult(restored=tuple(restored), left=tuple(left), summary=summary)


def _refused(reason: str, report: CheckpointReport | None = None) -> CheckpointQuarantineResult:
    return CheckpointQuarantineResult(
        action=QuarantineAction.REFUSED, reason=reason, fallback=report.latest_valid if report else None
    )


@contextlib.contextmanager
def _opened(directory: Path, expected_owner_uid: int | None) -> Iterator[tuple[int, int]]:
    """The directory, opened without following symlinks, checked for its owner; yields (fd, owner uid)."""
    absolute = os.path.abspath(directory)
    if os.path.realpath(absolute) != absolute:
        raise QuarantineRefused(f"{directory} is or lies under a symlink: refused")
    try:
        fd = os.open(absolute, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise QuarantineRefused(f"cannot open {directory}: {e.strerror or e}") from e
    try:
        owner = os.fstat(fd).st_uid
        if expected_owner_uid is not None and owner != expected_owner_uid:
            raise QuarantineRefused(f"{directory} belongs to uid {owner}, not the job's user {expected_owner_uid}")
        yield fd, owner
    finally:
        os.close(fd)


def _entry_checked(fd: int, name: str, owner: int, *, link_ok: bool = False) -> os.stat_result:
    """The entry's own status (never its target's); refused when it is a symlink (unless ``link_ok``: moving the
    link itself, never what it points at) or belongs to someone else."""
    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode) and not link_ok:
        raise QuarantineRefused(f"{name} is a symlink: refused")
    if st.st_uid != owner:
        raise QuarantineRefused(f"{name} belongs to uid {st.st_uid}, not {owner}: refused")
    return st


def _rename_newer_partials(fd: int, owner: int, report: CheckpointReport) -> list[str]:
    latest = report.latest_valid
    assert latest is not None
    names = [
        Path(c.path).name
        for c in report.checked
        if c.status is CheckpointStatus.INCOMPLETE
        and c.format is latest.format
        and Path(c.path).parent == Path(report.dir)
        and _newer(fd, Path(c.path).name, c.step, latest)
    ]
    if not names:
        return []
    if latest.format is CheckpointFormat.NEMO:
        return _nemo(fd, names)
    for name in names:  # every check before any move: a refusal leaves everything as it was
        _entry_checked(fd, name, owner, link_ok=latest.format is CheckpointFormat.LIGHTNING and _is_last(name))
    qfd = _quarantine_dir(fd, owner)
    try:
        entries = _read_manifest(fd)
        for name in names:
            target = _free_name(qfd, name)
            os.rename(name, target, src_dir_fd=fd, dst_dir_fd=qfd)
            entries.append({"kind": "rename", "name": name, "moved_to": target, "at": _now()})
            _write_manifest(fd, owner, entries)
    finally:
        os.close(qfd)
    if latest.format is CheckpointFormat.LIGHTNING and any(_is_last(n) for n in names):
        names += _relink_last(fd, owner, Path(latest.path).name, entries)
    return names


def _newer(fd: int, name: str, step: int | None, latest: CheckpointRef) -> bool:
    """Whether a partial checkpoint is one the framework's resume would take over ``latest``: a higher step, or
    with no step to compare, written after it (and Lightning's ``last*.ckpt``, which ``ckpt_path="last"`` takes)."""
    if latest.format is CheckpointFormat.LIGHTNING and _is_last(name):
        return True
    if step is not None and latest.step is not None:
        return step > latest.step
    if latest.saved_at is None:
        return False
    try:
        mtime = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return False
    return mtime >= latest.saved_at.timestamp()


def _is_last(name: str) -> bool:
    return _LIGHTNING_LAST.match(name) is not None


def _relink_last(fd: int, owner: int, valid: str, entries: list[dict[str, Any]]) -> list[str]:
    """Lightning's ``ckpt_path="last"`` resumes from the newest ``last*.ckpt`` and starts over without one: with
    the partial one set aside, ``last.ckpt`` becomes a symlink to the latest valid checkpoint (as
    ``save_last="link"`` would have made it)."""
    if any(_is_last(n) for n in os.listdir(fd)):
        return []  # another last*.ckpt is still there (the latest valid one): Lightning picks it
    os.symlink(valid, "last.ckpt", dir_fd=fd)
    os.chown("last.ckpt", owner, -1, dir_fd=fd, follow_symlinks=False)
    entries.append({"kind": "link", "name": "last.ckpt", "target": valid, "at": _now()})
    _write_manifest(fd, owner, entries)
    return [f"last.ckpt (now a symlink to {valid})"]


def _nemo(fd: int, names: list[str]) -> list[str]:
    unfinished = [n for n in names if _exists(fd, n + nemo.UNFINISHED_SUFFIX)]
    if len(unfinished) == len(names):
        return []  # NeMo's AutoResume already skips checkpoints with an -unfinished marker
    raise QuarantineRefused(
        f"{sorted(set(names) - set(unfinished))[0]} is partial without NeMo's -unfinished marker; NeMo resumes only"
        " from a *-last checkpoint, so setting it aside could make the job start over: fix it by hand"
    )


def _point_tracker(fd: int, owner: int, report: CheckpointReport) -> list[str]:
    latest = report.latest_valid
    assert latest is not None
    if latest.format is CheckpointFormat.MEGATRON:
        tracker = megatron.TRACKER
        content = "release" if Path(latest.path).name == "release" else str(latest.step)
    else:
        tracker = next((t for t in deepspeed.TRACKERS if _exists(fd, t)), deepspeed.TRACKERS[0])
        content = Path(latest.path).name
    if not _exists(fd, tracker):
        return []
    st = _entry_checked(fd, tracker, owner)
    current = _read(fd, tracker)
    if current.strip() == content:
        return []
    kept = tracker + ORIGINAL_SUFFIX
    if not _exists(fd, kept):  # a second quarantine keeps the first original: that is what restore puts back
        _write_new(fd, kept, current, owner, stat.S_IMODE(st.st_mode))
    tmp = f".{tracker}.rebound-tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=fd)
    _write_new(fd, tmp, content + "\n", owner, stat.S_IMODE(st.st_mode))
    os.rename(tmp, tracker, src_dir_fd=fd, dst_dir_fd=fd)
    qfd = _quarantine_dir(fd, owner)
    os.close(qfd)
    entries = [e for e in _read_manifest(fd) if not (e["kind"] == "tracker" and e["name"] == tracker)]
    entries.append({"kind": "tracker", "name": tracker, "kept_as": kept, "written": content, "at": _now()})
    _write_manifest(fd, owner, entries)
    return [f"{tracker} (was {current.strip() or 'empty'}, now {content}; original kept as {kept})"]


def _undo(fd: int, entry: dict[str, Any]) -> str | None:
    """Put one manifest entry back; the problem in words when it cannot be, None when done (or already done)."""
    name = entry["name"]
    if entry["kind"] == "link":
        try:
            ours = os.readlink(name, dir_fd=fd) == entry["target"]
        except (FileNotFoundError, OSError):
            return None
        if ours:
            os.unlink(name, dir_fd=fd)
        return None
    if entry["kind"] == "rename":
        qfd = os.open(QUARANTINE_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        try:
            if not _exists(qfd, entry["moved_to"]):
                return None if _exists(fd, name) else f"{name}: its set-aside copy is gone"
            if _exists(fd, name):
                return f"{name}: a new save took its name; the set-aside copy stays in {QUARANTINE_DIR}/"
            os.rename(entry["moved_to"], name, src_dir_fd=qfd, dst_dir_fd=fd)
            return None
        finally:
            os.close(qfd)
    kept = entry["kept_as"]
    if not _exists(fd, kept):
        return None
    if _read(fd, name).strip() != entry["written"]:
        return f"{name} was rewritten since (by the framework); the original stays as {kept}"
    os.rename(kept, name, src_dir_fd=fd, dst_dir_fd=fd)
    return None


def _quarantine_dir(fd: int, owner: int) -> int:
    try:
        os.mkdir(QUARANTINE_DIR, 0o700, dir_fd=fd)
        os.chown(QUARANTINE_DIR, owner, -1, dir_fd=fd, follow_symlinks=False)
    except FileExistsError:
        _entry_checked(fd, QUARANTINE_DIR, owner)
    return os.open(QUARANTINE_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)


def _read_manifest(fd: int) -> list[dict[str, Any]]:
    try:
        qfd = os.open(QUARANTINE_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    except FileNotFoundError:
        return []
    try:
        data = json.loads(_read(qfd, MANIFEST))
    except FileNotFoundError:
        return []
    finally:
        os.close(qfd)
    return list(data.get("entries", []))


def _write_manifest(fd: int, owner: int, entries: list[dict[str, Any]]) -> None:
    if not entries and not _exists(fd, QUARANTINE_DIR):
        return
    qfd = _quarantine_dir(fd, owner)
    try:
        tmp = MANIFEST + ".tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=qfd)
        _write_new(qfd, tmp, json.dumps({"entries": entries}, indent=2) + "\n", owner, 0o600)
        os.rename(tmp, MANIFEST, src_dir_fd=qfd, dst_dir_fd=qfd)
    finally:
        os.close(qfd)


def _free_name(qfd: int, name: str) -> str:
    candidate, n = name, 1
    while _exists(qfd, candidate):
        candidate, n = f"{name}.{n}", n + 1
    return candidate


def _exists(fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _read(fd: int, name: str) -> str:
    f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    with os.fdopen(f, "rb") as stream:
        return stream.read(1 << 20).decode(errors="replace")


def _write_new(fd: int, name: str, text: str, owner: int, mode: int) -> None:
    f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=fd)
    with os.fdopen(f, "wb") as stream:
        os.fchown(stream.fileno(), owner, -1)
        os.fchmod(stream.fileno(), mode)
        stream.write(text.encode())
        stream.flush()
        os.fsync(stream.fileno())


def _now() -> str:
    return datetime.now(tz=UTC).isoformat()
