"""Incremental, restart-safe reading of a job's log files, one complete line at a time.

A ``LogTail`` watches the files matching a set of glob patterns. Its whole state is the ``Offsets`` dict that
``read_new`` takes and returns: plain ``str -> int``, JSON-serialisable, so an activity carries it in its
heartbeat details and a workflow in its state. A restarted activity given the offsets it last heartbeated
neither re-reads nor misses a line.

State format: ``{path: offset}`` plus, for every path with ``offset > 0``, ``{"\\0crc:" + path: crc32}`` of the
(up to) 64 bytes that end at ``offset``, and ``{"\\0wait:" + path: 1}`` for a file whose new data did not fit the
last call's budget (it goes first next time). The NUL prefix cannot occur in a POSIX path, so the kinds of key
never collide; ``positions`` drops all but the offsets for display. A file whose size fell below its offset, or
whose bytes before the offset changed (truncated and rewritten past the old offset, replaced by a new file), is
read again from 0. Offsets written by hand (no fingerprint) are trusted as far as the size allows.

Attempt anchoring (a ``LogTail`` built with ``attempt_start``; ``activities.logs.job_logs`` builds every tail of
a watched job so; ``docs/detection.md`` "Which files are read"): lines written before the watched attempt started
never count. The first call on offsets that are not anchored yet starts every matching file at its current size
(with its fingerprint), unless this attempt began the file: it was created at or after the attempt's start (its
birth time, ``activities.logs.birth``, where the file system keeps one), or its first line is stamped, with a
zone, at or after it; such a file is read from 0. It records the anchor's time as ``{"\\0since": epoch
seconds}``; a file that appears after that is read from 0. Lines whose own timestamp (``LogLine.at``) predates the
anchor's time are dropped, whatever file they are in: by more than ``CLOCK_SKEW`` for a stamp with a zone, by more
than ``ZONELESS_SLACK`` for one without (local time of an unknown zone). Offsets of an earlier version (paths but
no ``\\0since``) count as anchored, without a time.

Which files a pattern names and what rank and node their names say: ``activities.logs.patterns``; what a line's
start says (srun label, PyTorch prefix, rank token, timestamp): ``activities.logs.line``. Lines end at ``\\n``,
``\\r\\n`` or a bare ``\\r`` (progress bars redraw with ``\\r``; each redraw is a line). Empty lines are skipped. A
line longer than ``max_bytes_per_file`` is returned in pieces of about that size, cut between UTF-8 characters
(``activities.logs.chunk``).

Whatever is on disk, reading never raises and stays bounded (the job owner controls both the patterns and the
files, so anything below is input, not an error):

* a call reads at most ``max_bytes_per_file`` per file, ``max_bytes_per_call`` and ``max_lines_per_call`` in all
  (a ``LogLine`` costs about 1.4 KB of memory, so a flood of short lines needs a cap of its own), files with the
  least new data first (a rank's short traceback is not stuck behind another rank's flood);
* globbing (``activities.logs.globbing``) looks at no more than ``glob_entries`` directory entries per expansion
  (``logs.glob_max_entries``) and keeps at most ``max_files`` files; ``**`` does not descend into symlinked
  directories (two links to ``.`` would otherwise make the walk exponential); what is cut off is reported in
  ``LogTail.refused``; a pattern whose walk ran out of entries is refused outright (none of its matches is read)
  and not walked again by this tail (a job's tail lives for its attempt), so a ``logs=/scratch/**`` costs one
  bounded walk, not one every few seconds;
* only regular files are opened (a FIFO, a device or a socket is never opened, a directory is skipped), and a
  file matched under several names (a symlinked directory, a hard link) is read under the first name only;
* an optional ``LogAccess`` policy (``activities.logs.access``) refuses patterns and files outside the
  configured roots or not owned by the job's user; refusals are reported in ``LogTail.refused``, never silent.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from activities.logs.access import LogAccess
from activities.logs.birth import birth_time
from activities.logs.chunk import Chunk, read_chunk
from activities.logs.globbing import expand_within
from activities.logs.line import CLOCK_SKEW, ZONELESS_SLACK, Line, LogLine, decode, has_zone, predates, to_model
from activities.logs.patterns import FileIdentity, LogPattern
from workflows.domain.bounds import (  # the per-job bounds live in one place
    DEFAULT_GLOB_ENTRIES,
    DEFAULT_MAX_BYTES_PER_CALL,
    DEFAULT_MAX_BYTES_PER_FILE,
    DEFAULT_MAX_LINES_PER_CALL,
    MAX_FILES,
)

__all__ = [
    "CLOCK_SKEW",
    "DEFAULT_MAX_BYTES_PER_CALL",
    "DEFAULT_MAX_BYTES_PER_FILE",
    "DEFAULT_MAX_LINES_PER_CALL",
    "LogTail",
    "MAX_FILES",
    "Offsets",
    "WAIT_PREFIX",
    "ZONELESS_SLACK",
    "positions",
    "predates",
]

Offsets = dict[str, int]
"""Byte offsets per path, plus fingerprint keys (see the module docstring)."""
_T = TypeVar("_T")

_FP_PREFIX = "\x00crc:"
WAIT_PREFIX = "\x00wait:"
_SINCE = "\x00since"
# How much of a file's start the anchoring reads for its first line's stamp.
_PROBE = 4096
# The kernel stamps a file's birth with a coarse clock: up to a tick (a few ms; 5 ms measured) before the real time.
# Slurm's start_time is cut to whole seconds, which only moves it earlier: a file created in the second the attempt
# started, but before it, counts as the attempt's (the one ambiguity left).
_BIRTH_GRAIN = timedelta(milliseconds=100)


def positions(offsets: Mapping[str, int]) -> dict[str, int]:
    """``offsets`` without the fingerprint and wait keys: just ``{path: byte offset}``."""
    return {k: v for k, v in offsets.items() if isinstance(k, str) and not k.startswith("\x00")}


class LogTail:
    """Reads what was appended to a set of log files since the offsets it is given.

    The object holds no reading state (the compiled patterns, ``refused`` and its last glob's matches only), so a
    restarted activity simply builds a new one and passes the offsets it last heartbeated.

    Args:
        patterns: Glob patterns with srun placeholders (module docstring); ``%j`` already expanded, see
            ``expand_patterns``. Recursive ``**`` is allowed.
        access: The policy that says which patterns and files may be read; None reads whatever matches.
        attempt_start: When the watched attempt of the job started (or, for a pending job, when Rebound first
            saw it): offsets not anchored yet are anchored to it (module docstring). None reads every file from 0
            and keeps every line (``rebound diagnose`` reads whole files).
        hosts: The job's nodes: a torchrun worker's file in a directory named after one is that node's (patterns).
        glob_entries: Directory entries one expansion of the patterns may visit (``logs.glob_max_entries``).
        max_files: Files the patterns may match (``logs.max_files``), at most ``MAX_FILES``.
        overran: Patterns whose walk ran out of entries, never walked again: the caller's dict when it builds a
            new tail per call but must remember them (heartbeat files); else this tail's own.

    Raises:
        TypeError: ``patterns`` is a single string, or holds something that is not a string.
    """

    def __init__(
        self,
        patterns: Iterable[str],
        access: LogAccess | None = None,
        *,
        attempt_start: datetime | None = None,
        hosts: Iterable[str] = (),
        glob_entries: int = DEFAULT_GLOB_ENTRIES,
        max_files: int = MAX_FILES,
        overran: dict[str, str] | None = None,
    ) -> None:
        if isinstance(patterns, str | bytes):
            raise TypeError("patterns must be a collection of glob patterns, not a single string")
        self._patterns = tuple(LogPattern(p) for p in patterns)
        self._access = access
        self._attempt_start = attempt_start
        self._hosts = frozenset(hosts)
        self._refused: dict[str, str] = {}
        self._globbed: tuple[dict[str, LogPattern], dict[str, str]] | None = None
        self._identity: dict[str, tuple[LogPattern, FileIdentity]] = {}  # what a path says: read once per name
        self._glob_entries = glob_entries
        self._max_files = max(1, min(max_files, MAX_FILES))
        self._overran = overran if overran is not None else {}  # walks that ran out of entries: never again
        self.read_identities: dict[str, tuple[int, int]] = {}  # (st_dev, st_ino) of what read_lines last read

    @property
    def patterns(self) -> tuple[str, ...]:
        return tuple(p.source for p in self._patterns)

    @property
    def refused(self) -> dict[str, str]:
        """What the last ``paths``/``read_new`` call did not read, and why: ``{pattern or path: reason}``.

        Patterns refused by the access policy or cut off by the glob limits, and matching files that were
        refused by the policy, are not regular files, or could not be opened. Directories, files that
        vanished meanwhile and second names of a file already read are not listed. A copy: the caller may keep
        it.
        """
        return dict(self._refused)

    def paths(self) -> list[str]:
        """The files matching the patterns now, sorted; an unreadable directory simply matches nothing."""
        matches, self._refused = self._matches()
        return sorted(matches)

    def identities(self) -> dict[str, FileIdentity]:
        """Every matching file the access policy allows, with the rank, node and local rank its path says (``%t``,
        ``%N``, a ``rank-N`` in the name, torchrun's layout); nothing is opened. Refusals are in ``refused``."""
        matches, self._refused = self._matches()
        out: dict[str, FileIdentity] = {}
        for path, pattern in sorted(matches.items()):
            reason = self._access.check_path(path) if self._access is not None else None
            if reason is not None:
                self._refused[path] = reason
                continue
            out[path] = pattern.identity(path, self._hosts)
        return out

    def read_new(
        self,
        offsets: Mapping[str, int],
        *,
        max_bytes_per_file: int = DEFAULT_MAX_BYTES_PER_FILE,
        max_bytes_per_call: int = DEFAULT_MAX_BYTES_PER_CALL,
        max_lines_per_call: int = DEFAULT_MAX_LINES_PER_CALL,
        rescan: bool = True,
    ) -> tuple[list[LogLine], Offsets]:
        """Read the complete lines appended since ``offsets``; never raises for missing or odd files.

        Args:
            offsets: What the previous call returned; ``{}`` to start every file at 0. Entries for files that are
                gone, no longer match or are refused are carried over unchanged. Malformed values count as 0.
            max_bytes_per_file: At most this many new bytes are read from each file per call; the rest waits.
            max_bytes_per_call: At most this many new bytes are read in all. Files are taken smallest backlog
                first (a short traceback is not stuck behind a flood), but a file that had to wait last time
                goes before all others, so none starves. A file is only read while its backlog or a whole
                ``max_bytes_per_file`` still fits, so this limit never cuts a line short (the line waits).
            max_lines_per_call: At most this many lines are returned; the rest wait, in the same order.
            rescan: Glob the patterns again, or (False) read the files this tail's last glob matched: a listing
                costs far more than a stat, so a watcher of many jobs globs each only every few seconds.

        Returns:
            The new lines, by path then offset, and the offsets to pass next time (a new dict); what was not read
            and why is in ``refused`` afterwards (and what was, in ``read_identities``).

        Raises:
            TypeError: ``offsets`` is not a mapping, or a limit is not an integer (values below 1 count as 1).
        """
        lines, new_offsets = self.read_lines(
            offsets,
            max_bytes_per_file=max_bytes_per_file,
            max_bytes_per_call=max_bytes_per_call,
            max_lines_per_call=max_lines_per_call,
            rescan=rescan,
        )
        return [to_model(line) for line in lines], new_offsets

    def read_lines(
        self,
        offsets: Mapping[str, int],
        *,
        max_bytes_per_file: int = DEFAULT_MAX_BYTES_PER_FILE,
        max_bytes_per_call: int = DEFAULT_MAX_BYTES_PER_CALL,
        max_lines_per_call: int = DEFAULT_MAX_LINES_PER_CALL,
        rescan: bool = True,
    ) -> tuple[list[Line], Offsets]:
        """``read_new``, its lines as plain ``Line`` s (the watch's hot path: no model per line)."""
        if not isinstance(offsets, Mapping):
            raise TypeError(f"offsets must be a mapping of path to offset, got {type(offsets).__name__}")
        per_file = _limit("max_bytes_per_file", max_bytes_per_file)
        remaining = _limit("max_bytes_per_call", max_bytes_per_call)
        lines_left = _limit("max_lines_per_call", max_lines_per_call)
        per_file = min(per_file, remaining)
        offsets = self.anchor(offsets)
        since = _since(offsets)
        self._globbed = self._matches() if rescan or self._globbed is None else self._globbed
        matches, refused = self._globbed[0], dict(self._globbed[1])
        todo: list[tuple[bool, int, str, LogPattern, os.stat_result]] = []
        files: set[tuple[int, int]] = set()
        for path, pattern in sorted(matches.items()):
            try:
                info = self._inspect(path)
            except _Skip as skip:
                if skip.reason:
                    refused[path] = skip.reason
                continue
            if (info.st_dev, info.st_ino) in files:
                continue  # the same file by another name (``logs/latest -> run3``, a hard link): its lines once
            files.add((info.st_dev, info.st_ino))
            offset = _as_offset(offsets.get(path))
            pending = info.st_size - offset if info.st_size >= offset else info.st_size
            todo.append((WAIT_PREFIX + path not in offsets, pending, path, pattern, info))

        chunks: dict[str, tuple[LogPattern, Chunk]] = {}
        waiting: list[str] = []
        for _, pending, path, pattern, info in sorted(todo):  # paths are unique: decided by the first three items
            budget = min(per_file, remaining)
            if (budget < per_file and budget < pending) or not lines_left:
                waiting.append(path)  # more than is left of this call's budget: first in line next call
                continue
            fingerprint = offsets.get(_FP_PREFIX + path)
            try:
                chunk = self._read(path, info, _as_offset(offsets.get(path)), fingerprint, budget, per_file, lines_left)
            except _Skip as skip:
                if skip.reason:
                    refused[path] = skip.reason
                continue
            remaining -= chunk.read
            lines_left -= len(chunk.lines)
            chunks[path] = (pattern, chunk)

        new_offsets: Offsets = dict(offsets)
        lines: list[Line] = []
        for path in sorted(chunks):
            pattern, chunk = chunks[path]
            known = self._identity.get(path)
            if known is None or known[0] is not pattern:
                if len(self._identity) >= self._max_files:
                    self._identity.clear()
                known = self._identity[path] = (pattern, pattern.identity(path, self._hosts))
            rank, node, _ = known[1]
            for line_offset, raw in chunk.lines:
                line = decode(path, rank, node, line_offset, raw)
                if since is None or not predates(line, since):
                    lines.append(line)
            new_offsets[path] = chunk.offset
            if chunk.offset:
                new_offsets[_FP_PREFIX + path] = chunk.fingerprint
            else:
                new_offsets.pop(_FP_PREFIX + path, None)
            new_offsets.pop(WAIT_PREFIX + path, None)
        for path in waiting:
            new_offsets[WAIT_PREFIX + path] = 1
        self._refused = refused
        self.read_identities = {path: (info.st_dev, info.st_ino) for _, _, path, _, info in todo if path in chunks}
        return lines, new_offsets

    def anchor(self, offsets: Mapping[str, int]) -> Offsets:
        """``offsets`` anchored to the attempt (module docstring), no line read; ``read_new`` starts with it.

        JobRecovery records this before its first watch of a job, so a watch cancelled before it returned (a node
        agent's GPU signal) loses no anchor. Offsets already anchored, and a tail without ``attempt_start``, come
        back unchanged (a copy).
        """
        if self._attempt_start is None or _since(offsets) is not None or positions(offsets):
            return dict(offsets)
        anchored: Offsets = {**offsets, _SINCE: int(self._attempt_start.timestamp())}
        matches, self._refused = self._matches()
        for path in sorted(matches):
            with contextlib.suppress(_Skip):  # read_new reports it (its own look at the file)
                anchored.update(self._start_at(path, self._inspect(path), self._attempt_start))
        return anchored

    def _matches(self) -> tuple[dict[str, LogPattern], dict[str, str]]:
        return expand_within(
            self._patterns, self._access, entries=self._glob_entries, max_files=self._max_files, overran=self._overran
        )

    def _inspect(self, path: str) -> os.stat_result:
        """The ``stat`` of the regular file ``path``, checked against the policy before anything opens it."""
        reason = self._access.check_path(path) if self._access is not None else None
        if reason is not None:
            raise _Skip(reason)
        try:
            info = os.stat(path)
        except FileNotFoundError as e:
            # Gone since it was listed (no report), or a symlink to nothing (worth saying).
            raise _Skip(f"cannot read: {e.strerror} (dangling symlink)" if os.path.islink(path) else None) from e
        except OSError as e:
            raise _Skip(f"cannot read: {e.strerror or e}") from e
        except ValueError as e:
            raise _Skip(None) from e
        if stat.S_ISDIR(info.st_mode):
            raise _Skip(None)  # a glob naturally matches directories too
        if not stat.S_ISREG(info.st_mode):
            # Never opened: opening a FIFO or a device can block or act (a watchdog device arms on open).
            raise _Skip(f"not a regular file ({_kind(info.st_mode)})")
        reason = self._access.check_owner(info.st_uid) if self._access is not None else None
        if reason is not None:
            raise _Skip(reason)
        return info

    def _read(
        self, path: str, info: os.stat_result, offset: int, fingerprint: object, budget: int, piece: int, count: int
    ) -> Chunk:
        """The complete lines of ``path`` after ``offset``, restarting at 0 if the file is not the one we read."""
        known = fingerprint if isinstance(fingerprint, int) else None
        return self._on_file(path, info, lambda fd, size: read_chunk(fd, size, offset, known, budget, piece, count))

    def _start_at(self, path: str, info: os.stat_result, since: datetime) -> Offsets:
        """Where reading ``path`` starts for an attempt anchored at ``since``, as offset entries (module docstring).

        0 when the file is empty, was created at or after ``since`` (its birth time, where the file system keeps
        one), or its first line is stamped, with a zone, at or after ``since``; else its size,
        with its fingerprint. The size, not the end of the last complete line: a line cut short there may be an
        old run's last words (a rank killed mid-write), which the next run's first line must not complete into a
        crash line; a line of the attempt that was being written then is read as its remaining piece.
        """

        def start(fd: int, size: int) -> Offsets:
            if size == 0:
                return {path: 0}
            born = birth_time(fd)
            if born is not None and born >= since - _BIRTH_GRAIN:
                return {path: 0}
            head = os.pread(fd, min(_PROBE, size), 0)
            end = head.find(b"\n")
            if end > 0:
                first = decode(path, None, None, 0, head[:end].rstrip(b"\r"))
                if first.at is not None and has_zone(first) and first.at >= since:
                    return {path: 0}
            # Nothing read (budget 0): just the offset and the fingerprint a later read checks it against.
            at_end = read_chunk(fd, size, size, None, 0, 1, 0)
            return {path: at_end.offset, _FP_PREFIX + path: at_end.fingerprint}

        return self._on_file(path, info, start)

    def _on_file(self, path: str, info: os.stat_result, use: Callable[[int, int], _T]) -> _T:
        """``use(fd, size)`` of ``path`` opened for reading, checked to be the file ``info`` describes and allowed by
        the policy; every failure is a ``_Skip`` (a plain call: a generator context manager, per file per poll,
        cost more than the read)."""
        try:
            # O_NONBLOCK: should a FIFO replace the file after _inspect, opening it must still not block.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except FileNotFoundError as e:
            raise _Skip(None) from e
        except OSError as e:
            raise _Skip(f"cannot open: {e.strerror or e}") from e
        try:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                raise _Skip("replaced while it was being opened; read again next time")
            reason = self._access.check_fd(fd, opened.st_uid) if self._access is not None else None
            if reason is not None:
                raise _Skip(reason)
            return use(fd, opened.st_size)
        except OSError as e:
            raise _Skip(f"cannot read: {e.strerror or e}") from e
        finally:
            os.close(fd)


def _since(offsets: Mapping[str, int]) -> datetime | None:
    """The anchor's time recorded in ``offsets``; None when they are not anchored (or hold a broken value)."""
    value = offsets.get(_SINCE)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        return None


class _Skip(Exception):
    """A matching file that is not read this time; ``reason`` None when there is nothing worth reporting."""

    def __init__(self, reason: str | None) -> None:
        super().__init__(reason)
        self.reason = reason


_SPECIAL = ((stat.S_ISFIFO, "fifo"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in (*_SPECIAL, (stat.S_ISSOCK, "socket")) if test(mode)), "special file")


def _limit(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r:.80}")
    return max(1, value)


def _as_offset(value: object) -> int:
    """An offset from (possibly hand-edited) state; anything but a whole number counts as 0, negatives too."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # a JSON round trip through another language may turn 12 into 12.0
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, value)
