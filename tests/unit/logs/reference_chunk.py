# The chunk splitter before issue 12's fourth pass, kept verbatim: the oracle of test_tail_equivalence.
"""Complete lines out of a log file's new bytes: the fingerprint check that detects a replaced or rewritten file,
line ends (``\\n``, ``\\r\\n``, a bare ``\\r``), over-long lines handed over in pieces cut between UTF-8 characters."""

from __future__ import annotations

import os
import re
import zlib
from typing import NamedTuple

__all__ = ["Chunk", "read_chunk"]

# Enough bytes to tell two log files apart (timestamps, pids) while costing nothing to re-read every poll.
_FP_WINDOW = 64
_EOL = re.compile(rb"\r\n|\r|\n")


class Chunk(NamedTuple):
    """The complete lines of one read, as (offset, bytes), and the offset and fingerprint to continue from."""

    lines: list[tuple[int, bytes]]
    offset: int
    fingerprint: int
    read: int
    """New bytes read (past the offset, or from 0 after a reset), what the call's budget counts."""


def read_chunk(fd: int, size: int, offset: int, fingerprint: int | None, budget: int, piece: int, count: int) -> Chunk:
    """At most ``count`` complete lines of ``fd`` after ``offset`` within ``budget`` bytes.

    Read from 0 instead when the file shrank below ``offset`` or ``fingerprint`` (the crc32 of the bytes before
    ``offset``) no longer matches: the file was replaced or rewritten.
    """
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


def _split(data: bytes, base: int, offset: int, piece: int, count: int) -> Chunk:
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
    return Chunk(lines, base + pos, zlib.crc32(window), len(data) - start)


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
