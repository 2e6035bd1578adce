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

Patterns use srun's filename placeholders (``srun --output``), so the pattern that names the files also says
where the rank is:

* ``%j`` is the job id (``expand_patterns`` fills it in, with srun's zero padding: ``%6j``);
* ``%t`` (``%3t``) is the task id, i.e. the rank, and ``%N`` the node name: both match like ``*`` and are
  captured;
* every other ``%x``-style placeholder matches like ``*``; ``%%`` is a literal ``%``.

Rank of a line, first rule that gives one:

1. ``%t`` in the pattern that matched the file (``logs/job-%j-rank-%t.log``);
2. without ``%t``: ``rank-N``, ``rank_N``, ``rank.N`` or ``rankN`` in the file's base name (not ``local_rank``);
3. an srun ``--label`` prefix (``3: ...``), then a PyTorch ``[rank3]:`` prefix;
4. a ``rank=3``, ``[rank 3]``/``[Rank 3]`` or ``rank 3/8`` token in the line (not ``local_rank=``).

A bare ``-N.out`` suffix is deliberately not a rank: ``slurm-1234.out`` ends in the job id.

Leading timestamps (``LogLine.at``): ISO 8601 with ``T`` or a space, ``.`` or ``,`` before the fraction,
optionally in brackets and with a zone (``2026-11-30T03:40:01.123Z``, ``[2026-11-30 03:40:01,123]``); a time
without a zone is taken as UTC. Lines without one (traceback lines) get None.

Lines end at ``\\n``, ``\\r\\n`` or a bare ``\\r`` (progress bars redraw with ``\\r``; each redraw is a line).
Empty lines are skipped. A line longer than ``max_bytes_per_file`` is returned in pieces of about that size, cut
between UTF-8 characters.

Whatever is on disk, reading never raises and stays bounded (the job owner controls both the patterns and the
files, so anything below is input, not an error):

* a call reads at most ``max_bytes_per_file`` per file, ``max_bytes_per_call`` and ``max_lines_per_call`` in all
  (a ``LogLine`` costs about 1.4 KB of memory, so a flood of short lines needs a cap of its own), files with the
  least new data first (a rank's short traceback is not stuck behind another rank's flood);
* globbing looks at no more than ``MAX_GLOB_ENTRIES`` directory entries and keeps at most ``MAX_FILES`` files;
  ``**`` does not descend into symlinked directories (two links to ``.`` would otherwise make the walk
  exponential); what is cut off is reported in ``LogTail.refused``;
* only regular files are opened (a FIFO, a device or a socket is never opened, a directory is skipped), and a
  file matched under several names (a symlinked directory, a hard link) is read under the first name only;
* an optional ``LogAccess`` policy (``activities.logs.access``) refuses patterns and files outside the
  configured roots or not owned by the job's user; refusals are reported in ``LogTail.refused``, never silent.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import os
import re
import stat
import zlib
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import NamedTuple

from pydantic import field_validator

from activities.logs.access import LogAccess
from workflows.domain.base import Frozen

__all__ = [
    "DEFAULT_MAX_BYTES_PER_CALL",
    "DEFAULT_MAX_BYTES_PER_FILE",
    "DEFAULT_MAX_LINES_PER_CALL",
    "LinePrefix",
    "LogLine",
    "LogTail",
    "MAX_FILES",
    "MAX_GLOB_ENTRIES",
    "Offsets",
    "expand_patterns",
    "positions",
    "rank_token",
    "split_prefix",
]

Offsets = dict[str, int]
"""Byte offsets per path, plus fingerprint keys (see the module docstring)."""

DEFAULT_MAX_BYTES_PER_FILE = 1 << 20
# What one call may cost, measured with tracemalloc in tests/property/test_tail_bounds.py: the bytes (read, then
# decoded) and about 1.4 KB per LogLine; together well under 32 MiB whatever the files hold. At a poll a second
# that drains 4 MiB/s or 10k lines/s of backlog; what does not fit waits, nothing is dropped.
DEFAULT_MAX_BYTES_PER_CALL = 4 << 20
DEFAULT_MAX_LINES_PER_CALL = 10_000
MAX_FILES = 10_000
"""Files one ``LogTail`` reads at most; the offsets of more would not fit a Temporal heartbeat."""
MAX_GLOB_ENTRIES = 100_000
"""Directory entries one call's globbing looks at, at most (each listing counts as one more)."""
_FP_PREFIX = "\x00crc:"
_WAIT_PREFIX = "\x00wait:"
# Enough bytes to tell two log files apart (timestamps, pids) while costing nothing to re-read every poll.
_FP_WINDOW = 64
_EOL = re.compile(rb"\r\n|\r|\n")
# Larger numbers are not ranks: a rank fits in an int32, and int() of a long digit string is slow (Python caps
# it at 4300 digits with a ValueError).
_MAX_RANK_DIGITS = 9
# srun: "if a value greater than 10 is used the result is padding up to 10 characters".
_MAX_PAD = 10
_JOB_ID = re.compile(r"[0-9A-Za-z_]+")

_PLACEHOLDER = re.compile(r"%%|%(\d*)([A-Za-z])")
_NAME_RANK = re.compile(r"(?<![a-z])(?<!local_)(?<!local-)rank[-_.]?(\d+)(?!\d)", re.IGNORECASE)
_LABEL = re.compile(r"^\s*(\d{1,6}): ")
# PyTorch prefixes a rank's stderr with ``[rank3]:``; torchrun --tee with ``[default3]:``, whose number is the
# local rank, so it is stripped but never used as the rank.
_TORCH_PREFIX = re.compile(r"^\[(rank|default)(\d{1,6})\]:\s?")
_TS_CORE = (
    r"(?P<date>\d{4}-\d\d-\d\d)[T ](?P<time>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d{1,9}))?"
    r"\s?(?P<tz>Z|UTC|[+-]\d\d:?\d\d)?"
)
_TIMESTAMP = re.compile(rf"^\s*(?:\[{_TS_CORE}\]|{_TS_CORE.replace('?P<', '?P<b_')})\s*")
_RANK_TOKEN = re.compile(
    r"(?<![\w.])rank=(?P<a>\d+)|\[rank\s*(?P<b>\d+)\]|(?<![\w.])rank\s+(?P<c>\d+)\s*/\s*\d+",
    re.IGNORECASE,
)


class LogLine(Frozen):
    """One complete line of a log file, with what its file name and prefixes say about it."""

    path: str
    rank: int | None
    text: str
    """The line without its terminator, undecodable bytes replaced by U+FFFD."""
    offset: int
    """Byte offset of the line's first byte in ``path``: ``(path, offset)`` identifies the line."""
    at: datetime | None = None
    """The line's own leading timestamp, tz-aware (UTC when the line gives no zone); None without one."""
    node: str | None = None
    """The node named by ``%N`` in the pattern that matched the file."""

    @field_validator("at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        # Readers compare timestamps across lines; one naive datetime among aware ones would raise TypeError.
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


class LinePrefix(NamedTuple):
    """What the start of a line says, and the rest of it (``body``)."""

    label: int | None
    """The srun ``--label`` task id."""
    torch_rank: int | None
    """The rank of a PyTorch ``[rankN]:`` prefix."""
    at: datetime | None
    body: str


def split_prefix(text: str, *, parse_time: bool = True) -> LinePrefix:
    """Peel an srun label, a PyTorch rank prefix and a leading timestamp off ``text``, in that order.

    Args:
        text: One log line.
        parse_time: False when only the body is wanted: ``at`` is then None and anything shaped like a
            timestamp is stripped, even an impossible date (parsing is most of the cost).

    Returns:
        The prefixes found and the body: the line after them, indentation kept when there was no timestamp
        (a traceback's ``  File ...`` lines stay indented).
    """
    label = torch_rank = None
    m = _LABEL.match(text)
    if m:
        label, text = int(m.group(1)), text[m.end() :]
    m = _TORCH_PREFIX.match(text)
    if m:
        torch_rank = int(m.group(2)) if m.group(1) == "rank" else None
        text = text[m.end() :]
    at = None
    m = _TIMESTAMP.match(text)
    if m:
        at = _parse_timestamp(m) if parse_time else None
        if at is not None or not parse_time:
            text = text[m.end() :]
    return LinePrefix(label, torch_rank, at, text)


def rank_token(text: str) -> int | None:
    """The rank named by the first ``rank=R``, ``[rank R]`` or ``rank R/W`` token in ``text``, else None.

    A token with an absurdly long number (more than nine digits) names no rank.
    """
    m = _RANK_TOKEN.search(text)
    if m is None:
        return None
    digits = m.group("a") or m.group("b") or m.group("c")
    return int(digits) if len(digits) <= _MAX_RANK_DIGITS else None


def expand_patterns(patterns: Iterable[str], job_id: int | str) -> list[str]:
    """Fill in ``%j`` (and srun's zero-padded ``%6j``) with ``job_id``; other placeholders stay for ``LogTail``.

    Args:
        patterns: srun-style output patterns, e.g. ``/runs/x/logs/job-%j-rank-%t.log``.
        job_id: The Slurm job id.

    Returns:
        The patterns, in order, with the job id filled in. ``%%`` is kept, so ``LogTail`` still reads it as a
        literal ``%``. Padding is capped at 10 digits, as srun caps it.

    Raises:
        ValueError: ``job_id`` is not a plain id (letters, digits, ``_``): it must not add path components.
    """
    job = str(job_id)
    if isinstance(job_id, bool) or not _JOB_ID.fullmatch(job):
        raise ValueError(f"job_id must be a plain job id, got {job_id!r:.80}")

    def substitute(m: re.Match[str]) -> str:
        if m.group(0) != "%%" and m.group(2) == "j":
            width = m.group(1).lstrip("0")
            return job.zfill(_MAX_PAD if len(width) > 2 else min(int(width or 0), _MAX_PAD))
        return m.group(0)

    return [_PLACEHOLDER.sub(substitute, p) for p in patterns]


def positions(offsets: Mapping[str, int]) -> dict[str, int]:
    """``offsets`` without the fingerprint and wait keys: just ``{path: byte offset}``."""
    return {k: v for k, v in offsets.items() if isinstance(k, str) and not k.startswith("\x00")}


class _Pattern:
    """One glob pattern with srun placeholders: the glob to list files, the regex to read rank and node back.

    The regex exists only when the pattern captures something (``%t``, ``%N``), and matching it takes
    polynomial time whatever the pattern, which a job owner writes: a plain translation of ``*a*a*a*a``
    backtracks exponentially on a file name that does not fit it (seconds for 200 characters, measured).
    So, as in glob, each path component is matched on its own: the components before the first ``**`` and
    after the last one are aligned with the path's first and last components, whatever lies between is
    skipped (a capture there is not used), and inside a component a ``*`` followed by literal text and
    another wildcard commits to the literal's first occurrence (an atomic group, as ``fnmatch`` does; a ``*``
    cannot cross a ``/``, so a later occurrence could not match where the first one fails).
    """

    def __init__(self, pattern: str) -> None:
        if not isinstance(pattern, str):
            raise TypeError(f"a log pattern must be a str, got {type(pattern).__name__}: {pattern!r:.80}")
        self.source = pattern
        components = pattern.split("/")
        deep = [i for i, c in enumerate(components) if c == "**"]
        seen: set[str] = set()
        globs: list[str] = []
        regexes: list[str] = []
        for i, component in enumerate(components):
            between = bool(deep) and deep[0] <= i <= deep[-1]
            glob_text, regex = _component(component, None if between else seen)
            globs.append(glob_text)
            regexes.append(regex)
        self.glob = "/".join(globs)
        self.has_rank = "rank" in seen
        if not deep:
            full = "/".join(regexes)
        else:
            head, tail = "/".join(regexes[: deep[0]]), "/".join(regexes[deep[-1] + 1 :])
            if deep[0] == 0:
                full = f"(?:.*/)?{tail}" if deep[-1] + 1 < len(regexes) else ".*"
            else:
                full = head + (f"(?:/.*)?/{tail}" if deep[-1] + 1 < len(regexes) else "(?:/.*)?")
        self.regex: re.Pattern[str] | None = None
        if seen:
            with contextlib.suppress(re.error):  # e.g. a reversed range "[z-a]": the file name must tell then
                self.regex = re.compile(full, re.DOTALL)

    def identity(self, path: str) -> tuple[int | None, str | None]:
        """(rank, node) of ``path`` by the rules in the module docstring; either may be None."""
        m = self.regex.fullmatch(path) if self.regex is not None else None
        groups = m.groupdict() if m else {}
        digits = groups.get("rank")
        rank = int(digits) if digits and len(digits) <= _MAX_RANK_DIGITS else None
        if rank is None and not self.has_rank:
            found = _NAME_RANK.search(os.path.basename(path))
            rank = int(found.group(1)) if found and len(found.group(1)) <= _MAX_RANK_DIGITS else None
        return rank, groups.get("node") or None


def _component(component: str, seen: set[str] | None) -> tuple[str, str]:
    """The glob and the regex of one path component of a pattern.

    Args:
        component: The text between two ``/``, srun placeholders and all.
        seen: The captures made so far (updated); None where nothing may be captured (placeholders match
            like ``*``).
    """
    if component == "**":
        return "**", ".*"
    glob_parts: list[str] = []
    tokens: list[tuple[str, str]] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(component):
        glob_parts.append(component[pos : m.start()])
        tokens += _glob_tokens(component[pos : m.start()])
        pos = m.end()
        if m.group(0) == "%%":
            glob_parts.append("%")
            tokens.append(("lit", "%"))
            continue
        glob_parts.append("*")
        # A rank is a run of digits taken whole (possessive: nothing to backtrack into).
        group = {"t": ("rank", r"\d++"), "N": ("node", r"[^/]+?")}.get(m.group(2)) if seen is not None else None
        if group is None or seen is None:
            tokens.append(("star", ""))
        elif group[0] in seen:
            tokens.append(("lit", f"(?P={group[0]})"))  # fixed text once captured
        else:
            seen.add(group[0])
            tokens.append(("cap", f"(?P<{group[0]}>{group[1]})"))
    glob_parts.append(component[pos:])
    tokens += _glob_tokens(component[pos:])
    return "".join(glob_parts), _assemble(tokens)


class LogTail:
    """Reads what was appended to a set of log files since the offsets it is given.

    The object holds no reading state (only the compiled patterns, and ``refused``: the report of its last
    call), so a restarted activity simply builds a new one and passes the offsets it last heartbeated.

    Args:
        patterns: Glob patterns with srun placeholders (module docstring); ``%j`` already expanded, see
            ``expand_patterns``. Recursive ``**`` is allowed.
        access: The policy that says which patterns and files may be read; None reads whatever matches.

    Raises:
        TypeError: ``patterns`` is a single string, or holds something that is not a string.
    """

    def __init__(self, patterns: Iterable[str], access: LogAccess | None = None) -> None:
        if isinstance(patterns, str | bytes):
            raise TypeError("patterns must be a collection of glob patterns, not a single string")
        self._patterns = tuple(_Pattern(p) for p in patterns)
        self._access = access
        self._refused: dict[str, str] = {}

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

    def identities(self) -> dict[str, tuple[int | None, str | None]]:
        """Every matching file the access policy allows, with the (rank, node) its name says (``%t``, ``%N``, or
        a ``rank-N`` in the name); nothing is opened. Refusals are in ``refused``."""
        matches, self._refused = self._matches()
        out: dict[str, tuple[int | None, str | None]] = {}
        for path, pattern in sorted(matches.items()):
            reason = self._access.check_path(path) if self._access is not None else None
            if reason is not None:
                self._refused[path] = reason
                continue
            out[path] = pattern.identity(path)
        return out

    def read_new(
        self,
        offsets: Mapping[str, int],
        *,
        max_bytes_per_file: int = DEFAULT_MAX_BYTES_PER_FILE,
        max_bytes_per_call: int = DEFAULT_MAX_BYTES_PER_CALL,
        max_lines_per_call: int = DEFAULT_MAX_LINES_PER_CALL,
    ) -> tuple[list[LogLine], Offsets]:
        """Read the complete lines appended since ``offsets``; never raises for missing or odd files.

        Args:
            offsets: What the previous call returned; ``{}`` to start every file at 0. Entries for files that
                are gone, no longer match or are refused are carried over unchanged. Malformed values count
                as 0.
            max_bytes_per_file: At most this many new bytes are read from each file per call; the rest waits
                for the next call.
            max_bytes_per_call: At most this many new bytes are read in all. Files are taken smallest backlog
                first (a short traceback is not stuck behind a flood), but a file that had to wait last time
                goes before all others, so none starves. A file is only read while its backlog or a whole
                ``max_bytes_per_file`` still fits, so this limit never cuts a line short (the line waits).
            max_lines_per_call: At most this many lines are returned; the rest wait, in the same order.

        Returns:
            The new lines, by path then offset, and the offsets to pass next time (a new dict). What was not
            read and why is in ``refused`` afterwards.

        Raises:
            TypeError: ``offsets`` is not a mapping, or a limit is not an integer (values below 1 count as 1).
        """
        if not isinstance(offsets, Mapping):
            raise TypeError(f"offsets must be a mapping of path to offset, got {type(offsets).__name__}")
        per_file = _limit("max_bytes_per_file", max_bytes_per_file)
        remaining = _limit("max_bytes_per_call", max_bytes_per_call)
        lines_left = _limit("max_lines_per_call", max_lines_per_call)
        per_file = min(per_file, remaining)
        matches, refused = self._matches()
        todo: list[tuple[bool, int, str, _Pattern, os.stat_result]] = []
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
            todo.append((_WAIT_PREFIX + path not in offsets, pending, path, pattern, info))

        chunks: dict[str, tuple[_Pattern, _Chunk]] = {}
        waiting: list[str] = []
        for _, pending, path, pattern, info in sorted(todo, key=lambda item: item[:3]):
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
        lines: list[LogLine] = []
        for path in sorted(chunks):
            pattern, chunk = chunks[path]
            rank, node = pattern.identity(path)
            for line_offset, raw in chunk.lines:
                lines.append(_make_line(path, rank, node, line_offset, raw))
            new_offsets[path] = chunk.offset
            if chunk.offset:
                new_offsets[_FP_PREFIX + path] = chunk.fingerprint
            else:
                new_offsets.pop(_FP_PREFIX + path, None)
            new_offsets.pop(_WAIT_PREFIX + path, None)
        for path in waiting:
            new_offsets[_WAIT_PREFIX + path] = 1
        self._refused = refused
        return lines, new_offsets

    def _matches(self) -> tuple[dict[str, _Pattern], dict[str, str]]:
        found: dict[str, _Pattern] = {}
        refused: dict[str, str] = {}
        budget = _GlobBudget()
        for pattern in self._patterns:
            reason = self._access.check_pattern(pattern.glob) if self._access is not None else None
            if reason is None and budget.exhausted:
                reason = budget.exhausted
            if reason is not None:
                refused[pattern.source] = reason
                continue
            for path in _glob(pattern.glob, budget):
                if path not in found and len(found) >= MAX_FILES:
                    budget.exhausted = f"more than {MAX_FILES} files match; the others are not read"
                    break
                found.setdefault(path, pattern)  # the first pattern that names a file says what it is
            if budget.exhausted:
                refused[pattern.source] = budget.exhausted
        return found, refused

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
    ) -> _Chunk:
        """The complete lines of ``path`` after ``offset``, restarting at 0 if the file is not the one we read."""
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
            known = fingerprint if isinstance(fingerprint, int) else None
            return _read_fd(fd, opened.st_size, offset, known, budget, piece, count)
        except OSError as e:
            raise _Skip(f"cannot read: {e.strerror or e}") from e
        finally:
            os.close(fd)


class _Skip(Exception):
    """A matching file that is not read this time; ``reason`` None when there is nothing worth reporting."""

    def __init__(self, reason: str | None) -> None:
        super().__init__(reason)
        self.reason = reason


class _Chunk(NamedTuple):
    lines: list[tuple[int, bytes]]
    offset: int
    fingerprint: int
    read: int
    """New bytes read (past the offset, or from 0 after a reset), what the call's budget counts."""


def _read_fd(fd: int, size: int, offset: int, fingerprint: int | None, budget: int, piece: int, count: int) -> _Chunk:
    if offset > size:
        offset, fingerprint = 0, None
    base = max(0, offset - _FP_WINDOW)
    # Never ask for more than the file has: pread allocates the whole request up front.
    data = os.pread(fd, min(budget + offset - base, size - base), base)
    if offset and fingerprint is not None:
        before = data[: offset - base]
        if len(before) != offset - base or zlib.crc32(before) != fingerprint:
            offset = base = 0
            del data, before  # not twice the budget in memory
            data = os.pread(fd, min(budget, size), 0)
    return _split(data, base, offset, piece, count)


def _split(data: bytes, base: int, offset: int, piece: int, count: int) -> _Chunk:
    """Cut ``data`` (file bytes from ``base``; new ones from ``offset``) into at most ``count`` complete lines.

    A line of ``piece`` bytes or more with no end in sight is handed over in pieces rather than never advancing.
    """
    start = pos = offset - base
    lines: list[tuple[int, bytes]] = []
    for m in _EOL.finditer(data, start):
        if m.end() == len(data) and m.group() == b"\r":
            break  # maybe the first half of a \r\n: decide when the next byte is there
        if m.start() > pos:
            if len(lines) >= count:
                break
            lines.append((base + pos, data[pos : m.start()]))
        pos = m.end()
    if pos == start and len(data) - start >= piece:
        end = _utf8_boundary(data, start, len(data))
        if end == len(data):
            lines.append((base + start, data[start:].rstrip(b"\r")))
        else:
            lines.append((base + start, data[start:end]))
        pos = end
    window = data[max(0, base + pos - _FP_WINDOW) - base : pos]
    return _Chunk(lines, base + pos, zlib.crc32(window), len(data) - start)


def _utf8_boundary(data: bytes, start: int, end: int) -> int:
    """``end``, or the start of a UTF-8 sequence that ``data[:end]`` cuts in half, if the piece keeps a byte."""
    for back in range(1, min(4, end - start) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: its lead is further back
        if byte >= 0xC0 and (2 if byte < 0xE0 else 3 if byte < 0xF0 else 4) > back and end - back > start:
            return end - back
        break
    return end


class _GlobBudget:
    """How much more one call's globbing may look at; ``exhausted`` says why it stopped, once it has."""

    def __init__(self) -> None:
        self.entries = MAX_GLOB_ENTRIES
        self.exhausted: str | None = None

    def listdir(self, directory: str) -> list[os.DirEntry[str]]:
        """The entries of ``directory`` (nothing if it cannot be listed), counted against the budget."""
        out: list[os.DirEntry[str]] = []
        if self.exhausted:
            return out
        self.entries -= 1
        try:
            with os.scandir(directory or ".") as it:
                for entry in it:
                    if self.entries <= 0:
                        self.exhausted = (
                            f"the patterns reach more than {MAX_GLOB_ENTRIES} directory entries; the rest are not read"
                        )
                        break
                    self.entries -= 1
                    out.append(entry)
        except (OSError, ValueError):
            pass
        return out


def _glob(pattern: str, budget: _GlobBudget) -> list[str]:
    """``glob.glob(pattern, recursive=True)``, within ``budget``, and with ``**`` not following symlinks.

    Like glob: ``*``/``?``/``[...]`` never match a leading ``.``; ``**`` as a whole component matches any number
    of directories. Unlike glob, ``**`` looks into a symlinked directory but does not walk below it.
    """
    parts = pattern.split("/")
    current = ["/"] if pattern.startswith("/") else [""]
    parts = [p for p in parts if p]
    if not parts:
        return []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        found: list[str] = []
        for directory in current:
            if part == "**":
                found += _descend(directory, budget, files=last)
            elif glob.has_magic(part):
                hidden_ok = part.startswith(".")
                for entry in budget.listdir(directory):
                    if entry.name.startswith(".") and not hidden_ok:
                        continue
                    if fnmatch.fnmatchcase(entry.name, part) and (last or _is_dir(entry)):
                        found.append(os.path.join(directory, entry.name))
            else:
                path = os.path.join(directory, part)
                if os.path.lexists(path) if last else os.path.isdir(path):
                    found.append(path)
            if budget.exhausted:
                break
        current = found
        if not current or (budget.exhausted and not last):
            return []  # a cut-off walk's directories are not matches
    return current


def _descend(top: str, budget: _GlobBudget, *, files: bool) -> list[str]:
    """``top`` and every non-hidden directory below it (and files, with ``files``), not walking symlinks."""
    out = [top]  # "" is the current directory of a relative pattern: os.path.join("", name) is name
    stack = [top]
    while stack and not budget.exhausted:
        directory = stack.pop()
        for entry in budget.listdir(directory):
            if entry.name.startswith("."):
                continue
            path = os.path.join(directory, entry.name)
            if _is_dir(entry):
                out.append(path)
                if not entry.is_symlink():
                    stack.append(path)
            elif files:
                out.append(path)
    return out


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def _limit(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r:.80}")
    return max(1, value)


def _make_line(path: str, file_rank: int | None, node: str | None, offset: int, raw: bytes) -> LogLine:
    text = raw.decode("utf-8", errors="replace")
    prefix = split_prefix(text)
    rank = file_rank
    for candidate in (prefix.label, prefix.torch_rank):
        if rank is None:
            rank = candidate
    if rank is None:
        rank = rank_token(prefix.body)
    return LogLine(path=path, rank=rank, node=node, text=text, offset=offset, at=prefix.at)


def _as_offset(value: object) -> int:
    """An offset from (possibly hand-edited) state; anything but a whole number counts as 0, negatives too."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # a JSON round trip through another language may turn 12 into 12.0
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, value)


def _parse_timestamp(m: re.Match[str]) -> datetime | None:
    g = {k.removeprefix("b_"): v for k, v in m.groupdict().items() if v is not None}
    try:
        year, month, day = (int(x) for x in g["date"].split("-"))
        hour, minute, second = (int(x) for x in g["time"].split(":"))
        micros = int(g.get("frac", "0")[:6].ljust(6, "0"))
        tz = g.get("tz") or "Z"
        zone = UTC
        if tz not in ("Z", "UTC"):
            sign = -1 if tz[0] == "-" else 1
            digits = tz[1:].replace(":", "")
            zone = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
        return datetime(year, month, day, hour, minute, second, micros, tzinfo=zone)
    except (KeyError, ValueError):
        return None  # 2026-13-45 is not a timestamp: leave the text as it is


def _glob_tokens(text: str) -> list[tuple[str, str]]:
    """Regex tokens for the glob syntax in ``text`` (one path component): ``star`` for ``*`` (and ``**`` inside
    a component, as glob reads it), fixed-width ``lit`` tokens for characters, ``?`` and ``[...]`` sets."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "*":
            if not out or out[-1][0] != "star":
                out.append(("star", ""))
        elif ch == "?":
            out.append(("lit", r"[^/]"))
        elif ch == "[":
            j = i + 1
            if j < len(text) and text[j] == "!":
                j += 1
            if j < len(text) and text[j] == "]":
                j += 1
            j = text.find("]", j)
            if j < 0:
                out.append(("lit", re.escape(ch)))
            else:
                out.append(("lit", _char_set(text[i + 1 : j])))
                i = j
        else:
            out.append(("lit", re.escape(ch)))
        i += 1
    return out


def _char_set(body: str) -> str:
    """A glob ``[...]`` body as a regex set: ``!`` negates, ``-`` makes ranges, everything else is literal."""
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    chars = "".join("\\" + c if c in "\\^[]&~|" else c for c in body)
    chars = re.sub(r"-{2,}", lambda m: "\\-" * len(m.group()), chars)  # "--" would be a set operation
    return "[^/" + chars + "]" if negate else "[" + chars + "]"


def _assemble(tokens: list[tuple[str, str]]) -> str:
    """The regex of one component's tokens (``_glob_tokens`` plus captures); see ``_Pattern`` for the atomic groups."""
    out: list[str] = []
    i, n = 0, len(tokens)
    while i < n:
        kind, regex = tokens[i]
        if kind != "star":
            out.append(regex)
            i += 1
            continue
        j = i
        while j < n and tokens[j][0] == "star":
            j += 1
        k = j
        while k < n and tokens[k][0] == "lit":
            k += 1
        literal = "".join(regex for _, regex in tokens[j:k])
        if k == n:
            out.append(f"[^/]*{literal}")
        elif tokens[k][0] == "star":
            out.append(f"(?>[^/]*?{literal})")  # the literal's first occurrence: nothing to retry later
        else:
            out.append(f"[^/]*?{literal}")  # before a capture, which may need it to give back
        i = k
    return "".join(out)
