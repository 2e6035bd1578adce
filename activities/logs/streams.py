"""Whole logs as lines, for readers that get a file or stdin rather than a tailed pattern (``rebound diagnose``).

``read_lines`` decodes a byte stream in bounded chunks, line by line, as ``LogTail`` does; ``file_rank`` is the
rank a file's name gives its lines, by ``LogTail``'s rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

from activities.logs.tail import DEFAULT_MAX_BYTES_PER_FILE

__all__ = ["file_rank", "read_lines", "split_text"]

_CHUNK = 1 << 16
_EOL = re.compile(rb"\r\n|\r|\n")
# The file-name rule of LogTail (rank-3.log, rank_3, rank.3, rank3; never local_rank).
_NAME_RANK = re.compile(r"(?<![a-z])(?<!local_)(?<!local-)rank[-_.]?(\d+)(?!\d)", re.IGNORECASE)


def file_rank(path: str) -> int | None:
    """The rank a file's name gives its lines (``rank-3.log``), by ``LogTail``'s rule; None without one."""
    base = path.replace("\\", "/").rsplit("/", 1)[-1]
    m = _NAME_RANK.search(base)
    return int(m.group(1)) if m else None


def read_lines(stream: BinaryIO, *, max_line: int = DEFAULT_MAX_BYTES_PER_FILE) -> Iterator[str]:
    """The lines of a binary stream, decoded (U+FFFD for bad bytes), read in chunks: memory stays bounded.

    Lines end at ``\\n``, ``\\r\\n`` or ``\\r``; empty lines are skipped; a line longer than ``max_line`` bytes is
    returned in pieces of that size, like ``LogTail`` does.
    """
    max_line = max(1, max_line)
    pending = b""
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        data = pending + chunk
        pos = 0
        for m in _EOL.finditer(data):
            if m.end() == len(data) and m.group() == b"\r":
                break  # maybe the first half of a \r\n
            yield from _pieces(data[pos : m.start()], max_line)
            pos = m.end()
        pending = data[pos:]
        while len(pending) > max_line:
            yield pending[:max_line].decode("utf-8", errors="replace")
            pending = pending[max_line:]
    yield from _pieces(pending.rstrip(b"\r"), max_line)


def split_text(text: str) -> Iterator[str]:
    """The non-empty lines of a log given as one string (the benchmark's corpus cases, tests)."""
    return (line for line in re.split(r"\r\n|\r|\n", text) if line)


def _pieces(raw: bytes, max_line: int) -> Iterator[str]:
    for start in range(0, len(raw), max_line):
        yield raw[start : start + max_line].decode("utf-8", errors="replace")
