"""Heartbeat files: files a rank touches while it is alive; their mtimes are progress without a log line.

A job names them in its opt-in comment (``heartbeat=/runs/x/ranks/rank-%t.hb``). The rank of a file comes from
``%t`` in the pattern or, failing that, from a ``rank<N>``/``rank-<N>``/``rank_<N>`` in its name: a file that
names no rank is ignored (the time of "some rank" cannot tell a hang from a straggler). Only ``stat`` is used:
the files are never read.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable
from datetime import UTC, datetime

from activities.logs.tail import expand_patterns

__all__ = ["MAX_HEARTBEAT_FILES", "heartbeat_times"]

#: Files looked at per call, at most: a pattern matching a whole file system must not stall the watch.
MAX_HEARTBEAT_FILES = 10_000
_PLACEHOLDER = re.compile(r"%%|%\d*[A-Za-z]")
_NAME_RANK = re.compile(r"(?<![a-z])rank[-_.]?(\d{1,9})(?!\d)", re.IGNORECASE)


def heartbeat_times(patterns: Iterable[str], job_id: int) -> dict[int, datetime]:
    """The newest mtime of each rank's heartbeat file(s); ranks with no readable file are absent.

    Args:
        patterns: Absolute glob patterns; ``%j`` is the job id, ``%t`` the rank, other placeholders match anything.
        job_id: The Slurm job id.
    """
    times: dict[int, datetime] = {}
    seen = 0
    for pattern in expand_patterns(patterns, job_id):
        rank_at = _rank_position(pattern)
        for path in glob.iglob(_PLACEHOLDER.sub(lambda m: "%" if m.group(0) == "%%" else "*", pattern)):
            seen += 1
            if seen > MAX_HEARTBEAT_FILES:
                return times
            rank = _rank_of(path, rank_at)
            if rank is None:
                continue
            try:
                mtime = os.stat(path).st_mtime
            except OSError:
                continue  # deleted between glob and stat, or unreadable: no sign of life
            at = datetime.fromtimestamp(mtime, UTC)
            if rank not in times or at > times[rank]:
                times[rank] = at
    return times


def _rank_position(pattern: str) -> re.Pattern[str] | None:
    """A regex whose ``rank`` group reads ``%t`` back from a path, when the pattern's file name has one."""
    name = os.path.basename(pattern)
    if "%t" not in name:
        return None
    parts = re.split(r"(%%|%\d*[A-Za-z]|\*|\?)", name)
    out, used = [], False
    for part in parts:
        if part == "%t" and not used:
            out.append(r"(?P<rank>\d+)")
            used = True
        elif part == "%%":
            out.append("%")
        elif part and (part in ("*", "?") or _PLACEHOLDER.fullmatch(part)):
            out.append(".*?" if part != "?" else ".")
        else:
            out.append(re.escape(part))
    return re.compile("".join(out))


def _rank_of(path: str, rank_at: re.Pattern[str] | None) -> int | None:
    name = os.path.basename(path)
    if rank_at is not None:
        m = rank_at.fullmatch(name)
        return int(m.group("rank")) if m else None
    found = _NAME_RANK.search(name)
    return int(found.group(1)) if found else None
