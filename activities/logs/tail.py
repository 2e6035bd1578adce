"""Incremental, restart-safe reading of a job's log files, one complete line at a time.

A ``LogTail`` watches the files matching a set of glob patterns. Its whole state is the ``Offsets`` dict that
``read_new`` takes and returns: plain ``str -> int``, JSON-serialisable, so an activity carries it in its
heartbeat details and a workflow in its state. A restarted activity given the offsets it last heartbeated
neither re-reads nor misses a line.

State format: ``{path: offset}`` plus, for every path with ``offset > 0``, ``{"\\0crc:" + path: crc32}`` of the
(up to) 64 bytes that end at ``offset``. The NUL prefix cannot occur in a POSIX path, so the two kinds of key
never collide; ``positions`` drops the fingerprints for display. A file whose size fell below its offset, or
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
Empty lines are skipped. A line longer than ``max_bytes_per_file`` is returned in pieces of that size.
"""

from __future__ import annotations

import glob
import os
import re
import stat
import zlib
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import NamedTuple

from workflows.domain.base import Frozen

__all__ = [
    "DEFAULT_MAX_BYTES_PER_FILE",
    "LinePrefix",
    "LogLine",
    "LogTail",
    "Offsets",
    "expand_patterns",
    "positions",
    "rank_token",
    "split_prefix",
]

Offsets = dict[str, int]
"""Byte offsets per path, plus fingerprint keys (see the module docstring)."""

DEFAULT_MAX_BYTES_PER_FILE = 1 << 20
_FP_PREFIX = "\x00crc:"
# Enough bytes to tell two log files apart (timestamps, pids) while costing nothing to re-read every poll.
_FP_WINDOW = 64
_EOL = re.compile(rb"\r\n|\r|\n")

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
    """The rank named by the first ``rank=R``, ``[rank R]`` or ``rank R/W`` token in ``text``, else None."""
    m = _RANK_TOKEN.search(text)
    if m is None:
        return None
    return int(m.group("a") or m.group("b") or m.group("c"))


def expand_patterns(patterns: Iterable[str], job_id: int | str) -> list[str]:
    """Fill in ``%j`` (and srun's zero-padded ``%6j``) with ``job_id``; other placeholders stay for ``LogTail``.

    Args:
        patterns: srun-style output patterns, e.g. ``/runs/x/logs/job-%j-rank-%t.log``.
        job_id: The Slurm job id.

    Returns:
        The patterns, in order, with the job id filled in. ``%%`` is kept, so ``LogTail`` still reads it as a
        literal ``%``.
    """

    def substitute(m: re.Match[str]) -> str:
        if m.group(0) != "%%" and m.group(2) == "j":
            return str(job_id).zfill(int(m.group(1) or 0))
        return m.group(0)

    return [_PLACEHOLDER.sub(substitute, p) for p in patterns]


def positions(offsets: Mapping[str, int]) -> dict[str, int]:
    """``offsets`` without the fingerprint keys: just ``{path: byte offset}``."""
    return {k: v for k, v in offsets.items() if not k.startswith(_FP_PREFIX)}


class _Pattern:
    """One glob pattern with srun placeholders: the glob to list files, the regex to read rank and node back."""

    def __init__(self, pattern: str) -> None:
        self.source = pattern
        glob_parts: list[str] = []
        regex_parts: list[str] = []
        seen: set[str] = set()
        pos = 0
        for m in _PLACEHOLDER.finditer(pattern):
            glob_parts.append(pattern[pos : m.start()])
            regex_parts.append(_glob_to_regex(pattern[pos : m.start()]))
            pos = m.end()
            if m.group(0) == "%%":
                glob_parts.append("%")
                regex_parts.append("%")
                continue
            glob_parts.append("*")
            group = {"t": ("rank", r"\d+"), "N": ("node", r"[^/]+?")}.get(m.group(2))
            if group is None:
                regex_parts.append(r"[^/]*?")
            elif group[0] in seen:
                regex_parts.append(f"(?P={group[0]})")
            else:
                seen.add(group[0])
                regex_parts.append(f"(?P<{group[0]}>{group[1]})")
        glob_parts.append(pattern[pos:])
        regex_parts.append(_glob_to_regex(pattern[pos:]))
        self.glob = "".join(glob_parts)
        self.has_rank = "rank" in seen
        try:
            self.regex: re.Pattern[str] | None = re.compile("".join(regex_parts), re.DOTALL)
        except re.error:
            self.regex = None

    def identity(self, path: str) -> tuple[int | None, str | None]:
        """(rank, node) of ``path`` by the rules in the module docstring; either may be None."""
        m = self.regex.fullmatch(path) if self.regex is not None else None
        groups = m.groupdict() if m else {}
        rank = int(groups["rank"]) if groups.get("rank") else None
        if rank is None and not self.has_rank:
            found = _NAME_RANK.search(os.path.basename(path))
            rank = int(found.group(1)) if found else None
        return rank, groups.get("node") or None


class LogTail:
    """Reads what was appended to a set of log files since the offsets it is given.

    The object holds no reading state (only the compiled patterns), so a restarted activity simply builds a new
    one and passes the offsets it last heartbeated.

    Args:
        patterns: Glob patterns with srun placeholders (module docstring); ``%j`` already expanded, see
            ``expand_patterns``. Recursive ``**`` is allowed.
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        self._patterns = tuple(_Pattern(p) for p in patterns)

    @property
    def patterns(self) -> tuple[str, ...]:
        return tuple(p.source for p in self._patterns)

    def paths(self) -> list[str]:
        """The files matching the patterns now, sorted; an unreadable directory simply matches nothing."""
        return sorted(self._matches())

    def read_new(
        self, offsets: Mapping[str, int], *, max_bytes_per_file: int = DEFAULT_MAX_BYTES_PER_FILE
    ) -> tuple[list[LogLine], Offsets]:
        """Read the complete lines appended since ``offsets``; never raises for missing or odd files.

        Args:
            offsets: What the previous call returned; ``{}`` to start every file at 0. Entries for files that
                are gone or no longer match are carried over unchanged. Malformed values count as 0.
            max_bytes_per_file: At most this many new bytes are read from each file per call; the rest waits
                for the next call.

        Returns:
            The new lines, by path then offset, and the offsets to pass next time (a new dict).
        """
        budget = max(1, int(max_bytes_per_file))
        new_offsets: Offsets = dict(offsets)
        lines: list[LogLine] = []
        for path, pattern in sorted(self._matches().items()):
            offset = _as_offset(offsets.get(path))
            fingerprint = offsets.get(_FP_PREFIX + path)
            chunk = _read(path, offset, fingerprint if isinstance(fingerprint, int) else None, budget)
            if chunk is None:
                continue
            rank, node = pattern.identity(path)
            for line_offset, raw in chunk.lines:
                lines.append(_make_line(path, rank, node, line_offset, raw))
            new_offsets[path] = chunk.offset
            if chunk.offset:
                new_offsets[_FP_PREFIX + path] = chunk.fingerprint
            else:
                new_offsets.pop(_FP_PREFIX + path, None)
        return lines, new_offsets

    def _matches(self) -> dict[str, _Pattern]:
        found: dict[str, _Pattern] = {}
        for pattern in self._patterns:
            try:
                paths = glob.glob(pattern.glob, recursive=True)
            except (OSError, ValueError):
                continue  # e.g. a NUL byte in the pattern: nothing can match it
            for path in paths:
                found.setdefault(path, pattern)  # the first pattern that names a file says what it is
        return found


class _Chunk(NamedTuple):
    lines: list[tuple[int, bytes]]
    offset: int
    fingerprint: int


def _read(path: str, offset: int, fingerprint: int | None, budget: int) -> _Chunk | None:
    """The complete lines of ``path`` after ``offset``, restarting at 0 if the file is not the one we read."""
    try:
        # O_NONBLOCK: a FIFO that matches a pattern must not block the activity; it is then skipped as non-regular.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if offset > info.st_size:
            offset, fingerprint = 0, None
        base = max(0, offset - _FP_WINDOW)
        data = os.pread(fd, budget + offset - base, base)
        if offset and fingerprint is not None:
            before = data[: offset - base]
            if len(before) != offset - base or zlib.crc32(before) != fingerprint:
                offset = base = 0
                data = os.pread(fd, budget, 0)
        return _split(data, base, offset, budget)
    except OSError:
        return None
    finally:
        os.close(fd)


def _split(data: bytes, base: int, offset: int, budget: int) -> _Chunk:
    """Cut ``data`` (file bytes from ``base``; new ones from ``offset``) into complete lines."""
    start = pos = offset - base
    lines: list[tuple[int, bytes]] = []
    for m in _EOL.finditer(data, start):
        if m.end() == len(data) and m.group() == b"\r":
            break  # maybe the first half of a \r\n: decide when the next byte is there
        if m.start() > pos:
            lines.append((base + pos, data[pos : m.start()]))
        pos = m.end()
    if pos == start and len(data) - start >= budget:
        # One line longer than the whole budget: hand it over in pieces rather than never advancing.
        lines.append((base + start, data[start:].rstrip(b"\r")))
        pos = len(data)
    window = data[max(0, base + pos - _FP_WINDOW) - base : pos]
    return _Chunk(lines, base + pos, zlib.crc32(window))


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


def _glob_to_regex(text: str) -> str:
    """Regex for the glob syntax in ``text``: ``*`` and ``?`` stop at ``/``, ``**`` does not, ``[...]`` sets."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "*":
            if text.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            out.append(r"[^/]*")
        elif ch == "?":
            out.append(r"[^/]")
        elif ch == "[":
            j = i + 1
            if j < len(text) and text[j] == "!":
                j += 1
            if j < len(text) and text[j] == "]":
                j += 1
            j = text.find("]", j)
            if j < 0:
                out.append(re.escape(ch))
            else:
                body = text[i + 1 : j].replace("\\", "\\\\")
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = j
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)
