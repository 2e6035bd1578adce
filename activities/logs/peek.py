"""A watched job's quiet polls: between two full polls, a look at what its files gained (ADR 015, "Quiet polls").

A full poll of a job (``JobWatcher.read``) decodes every new line, scans it for failure signatures, folds the step
lines into the job's progress and asks the watch policy; at thousands of jobs, each printing a step line per rank
per second, that is most of a worker's CPU. Most of those polls find only progress, and progress need not be
judged every second: hang and straggler windows are minutes (the lab's: seconds).

So after a full poll the watcher arms a ``Peek`` at the offsets that poll ended at. Until the next full poll is
due (``watch.full_poll_every_s``), each poll only asks the ``Peek`` whether anything came that cannot wait:

* every file the full poll read is looked at: ``stat``; when it grew, its new complete lines are read (``pread``)
  and tested at once by ``signatures.lines_may_match``: a chunk that could hold a failure line (or that is not
  plain ASCII, or larger than a full poll may read, or a file that was replaced, truncated or cannot be read) makes
  this poll a full one;
* the directories the job's files are in, and those its patterns name, are looked at too (``stat``): a changed
  mtime means a file was added or removed there, say a new rank's log, so the poll is a full one that globs the
  patterns again (``directory_changed``). The mtimes are the ones taken before the full poll globbed, so a file
  created while it read is not missed. A new file in an unchanged directory (a create within the directory's mtime
  tick, a filesystem that caches directory attributes, a pattern's deeper directory) waits for the regular glob of
  a full poll, as it did without this look;
* a chunk cleared so only advances the peek's own positions; the job's offsets and progress stay where the last
  full poll left them, so the next full poll reads those lines again and folds them then (a takeover re-reads them
  too: nothing is lost or counted twice);
* when a cleared line was first seen is kept (``seen_at``): a step line without its own timestamp is dated so when
  the full poll folds it, as a full poll at that moment would have, not at the fold.

A partial last line is not advanced past (a failure text cut between two looks is tested whole the next time).
Nothing here decides anything: "look now" (a reason) or "nothing that cannot wait" (None).
"""

from __future__ import annotations

import bisect
import glob
import os
from collections.abc import Iterable, Mapping
from datetime import datetime

from activities.logs.signatures import lines_may_match

__all__ = ["Peek", "directory_times", "watched_directories"]

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def watched_directories(patterns: Iterable[str], paths: Iterable[str]) -> set[str]:
    """The directories a new file of the job would appear in: those its files are in, and each pattern's deepest
    directory without a wildcard or an srun placeholder (``%t``, ``%N``)."""
    directories = {os.path.dirname(path) or "." for path in paths}
    for pattern in patterns:
        fixed: list[str] = []
        for part in pattern.split("/")[:-1]:
            if glob.has_magic(part) or "%" in part:
                break
            fixed.append(part)
        directories.add("/".join(fixed) or ("/" if pattern.startswith("/") else "."))
    return directories


def directory_times(directories: Iterable[str]) -> dict[str, int | None]:
    """Each directory's mtime (ns), None for one that does not exist or cannot be looked at."""
    times: dict[str, int | None] = {}
    for directory in directories:
        try:
            times[directory] = os.stat(directory).st_mtime_ns
        except OSError:
            times[directory] = None
    return times


class Peek:
    """What a job's files gained since its last full poll, looked at cheaply (module docstring).

    Args:
        positions: ``{path: offset}`` where the last full poll stopped reading each file.
        identities: ``{path: (st_dev, st_ino)}`` of the files that poll read: a path now naming another file is a
            reason to look in full (its access checks, its fingerprint).
        max_bytes: More new bytes than this in one file (a full poll's per-file budget) is a reason too.
        directories: ``directory_times`` of the directories to look at, taken before the full poll globbed.
    """

    def __init__(
        self,
        positions: Mapping[str, int],
        identities: Mapping[str, tuple[int, int]],
        max_bytes: int,
        directories: Mapping[str, int | None] | None = None,
    ) -> None:
        self._files = {path: (identities[path], offset) for path, offset in positions.items() if path in identities}
        self._start = {path: offset for path, (_, offset) in self._files.items()}
        self._max_bytes = max_bytes
        self._directories = dict(directories or {})
        self._seen: dict[str, tuple[list[int], list[datetime]]] = {}
        self.directory_changed = False
        """Set by the look that found a directory changed: the full poll it asks for must glob again."""

    def look(self, now: datetime) -> str | None:
        """Read what every file gained; a reason for a full poll now, or None (``now``: when it was seen)."""
        for directory, mtime in directory_times(self._directories).items():
            if mtime != self._directories[directory]:
                self.directory_changed = True
                return f"{directory}: a file was added or removed"
        for path, (identity, offset) in self._files.items():
            try:
                info = os.stat(path)
            except OSError:
                return f"{path}: cannot stat"
            if (info.st_dev, info.st_ino) != identity:
                return f"{path}: replaced"
            if info.st_size == offset:
                continue
            if info.st_size < offset:
                return f"{path}: truncated"
            if info.st_size - offset > self._max_bytes:
                return f"{path}: more than a poll reads"
            reason = self._read(path, identity, offset, info.st_size - offset, now)
            if reason is not None:
                return reason
        return None

    def seen_at(self, path: str, offset: int) -> datetime | None:
        """When the line starting at ``offset`` of ``path`` was first seen by a look, None if no look saw it."""
        seen = self._seen.get(path)
        if seen is None or offset < self._start[path]:
            return None  # not looked at, or read by the full poll itself
        ends, times = seen
        i = bisect.bisect_right(ends, offset)  # the first chunk ending after the line's start holds it
        return times[i] if i < len(ends) else None

    def _read(self, path: str, identity: tuple[int, int], offset: int, size: int, now: datetime) -> str | None:
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError:
            return f"{path}: cannot open"
        try:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != identity:
                return f"{path}: replaced"
            data = os.pread(fd, size, offset)
        except OSError:
            return f"{path}: cannot read"
        finally:
            os.close(fd)
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if end == 0:
            return None  # a partial line: tested whole once it ends
        whole = data[:end]
        if not whole.isascii() or lines_may_match(whole.decode("ascii")):
            return f"{path}: may hold a failure"
        self._files[path] = (identity, offset + end)
        ends, times = self._seen.setdefault(path, ([], []))
        ends.append(offset + end)
        times.append(now)
        return None
