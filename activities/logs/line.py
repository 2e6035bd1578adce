"""One line of a log file and what its start says: srun label, PyTorch rank prefix, leading timestamp, rank token.

An srun ``--label`` prefix (``3: ...``) names the Slurm *task* that wrote the line (``LogLine.task``). It is the
job's rank only when the job runs one Slurm task per rank (srun per rank, Lightning's Slurm environment); under a
launcher that starts the ranks itself (torchrun under ``srun --ntasks-per-node=1``) the task is the node's index
and the ranks are in PyTorch's ``[rankN]:`` prefix. So the rank of a line, when the file's name gives none
(``activities.logs.patterns``), is the first that gives one of:

1. a PyTorch ``[rank3]:`` prefix (the global rank, whatever the launcher);
2. the srun label (``rank_is_task``: true only for one task per rank; a reader that knows the job's launcher
   places the line by its task instead, ``workflows.domain.ranks.RankMap.node_of_task``);
3. a ``rank=3``, ``[rank 3]``/``[Rank 3]`` or ``rank 3/8`` token in the line (not ``local_rank=``).

Leading timestamps (``LogLine.at``): ISO 8601 with ``T`` or a space, ``.`` or ``,`` before the fraction,
optionally in brackets and with a zone (``2026-11-30T03:40:01.123Z``, ``[2026-11-30 03:40:01,123]``); a time
without a zone is taken as UTC. Lines without one (traceback lines) get None.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import NamedTuple

from pydantic import field_validator

from activities.logs.terminal import strip_terminal_codes
from workflows.domain.base import Frozen

__all__ = [
    "CLOCK_SKEW",
    "Line",
    "LinePrefix",
    "LogLine",
    "MAX_RANK_DIGITS",
    "ZONELESS_SLACK",
    "decode",
    "decode_line",
    "has_zone",
    "predates",
    "rank_token",
    "split_prefix",
    "to_model",
]

# Larger numbers are not ranks: a rank fits in an int32, and int() of a long digit string is slow (Python caps
# it at 4300 digits with a ValueError).
MAX_RANK_DIGITS = 9
_LABEL = re.compile(r"^\s*(\d{1,6}): ")
# PyTorch prefixes a rank's stderr with ``[rank3]:``; torchrun --tee with ``[default3]:``, whose number is the
# local rank, so it is stripped but never used as the rank.
_TORCH_PREFIX = re.compile(r"^\[(rank|default)(\d{1,6})\]:\s?")
_TS_CORE = (
    r"(?P<date>\d{4}-\d\d-\d\d)[T ](?P<time>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d{1,9}))?"
    r"\s?(?P<tz>Z|UTC|[+-]\d\d:?\d\d)?"
)
_TIMESTAMP = re.compile(rf"^\s*(?:\[{_TS_CORE}\]|{_TS_CORE.replace('?P<', '?P<b_')})\s*")
# The end of a stamp that names its zone: ``Z``, ``UTC``, ``+02:00``, ``-0500`` (``split_prefix`` parsed it).
_ZONE_END = re.compile(r"(?:Z|UTC|[+-]\d\d:?\d\d)\]?\s*$")
_ESC = "\x1b"
CLOCK_SKEW = timedelta(seconds=60)
"""A stamped line counts as the attempt's unless it predates the anchor by more than this: the ranks' clocks and
slurmctld's may differ a little, and dropping a line of the current attempt costs more than keeping an old one."""
ZONELESS_SLACK = timedelta(hours=14)
"""A stamp without a zone is local time of a zone Rebound does not know (UTC-12 to UTC+14): it predates the anchor
for sure only when it is this much older (Python's ``logging`` writes such stamps by default)."""
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
    task: int | None = None
    """The Slurm task id of an srun ``--label`` prefix: the task's node is a fact Slurm knows, its rank is not."""
    rank_is_task: bool = False
    """``rank`` is only the srun label's task id (no file name, ``[rankN]:`` prefix or token gave one): a rank
    under srun per rank, a node's index under torchrun."""

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
    return int(digits) if len(digits) <= MAX_RANK_DIGITS else None


class Line(NamedTuple):
    """One line as ``decode`` reads it, in plain values: what the watch reads on every poll (``LogLine`` is the
    same as a model, for callers that keep or send lines)."""

    path: str
    rank: int | None
    text: str
    offset: int
    at: datetime | None
    node: str | None
    task: int | None
    rank_is_task: bool
    prefix: LinePrefix
    """``split_prefix(strip_terminal_codes(text), parse_time=False)``: the prefixes and the body that the progress
    and signature readers start from (found once, here)."""


def decode(path: str, file_rank: int | None, node: str | None, offset: int, raw: bytes) -> Line:
    """The ``Line`` of ``raw`` (bytes without their terminator): the file's rank, else the line's own (module
    docstring), and the srun label's task."""
    text = raw.decode("utf-8", errors="replace")
    prefix = split_prefix(text)
    rank = file_rank if file_rank is not None else prefix.torch_rank
    rank_is_task = rank is None and prefix.label is not None
    if rank_is_task:
        rank = prefix.label
    if rank is None:
        rank = rank_token(prefix.body)
    if _ESC in text or (prefix.at is None and _TIMESTAMP.match(prefix.body)):
        bare = split_prefix(strip_terminal_codes(text), parse_time=False)  # codes, or a stamp that did not parse
    else:
        bare = LinePrefix(prefix.label, prefix.torch_rank, None, prefix.body)  # the same peeling
    return Line(path, rank, text, offset, prefix.at, node, prefix.label, rank_is_task, bare)


def decode_line(path: str, file_rank: int | None, node: str | None, offset: int, raw: bytes) -> LogLine:
    """The ``LogLine`` of ``raw`` (``decode``'s reading as a model)."""
    line = decode(path, file_rank, node, offset, raw)
    return to_model(line)


def to_model(line: Line) -> LogLine:
    """``line`` as a ``LogLine``."""
    return LogLine(
        path=line.path,
        rank=line.rank,
        node=line.node,
        text=line.text,
        offset=line.offset,
        at=line.at,
        task=line.task,
        rank_is_task=line.rank_is_task,
    )


def predates(line: LogLine | Line, since: datetime) -> bool:
    """Whether ``line``'s own timestamp says it was written before ``since``: by more than ``CLOCK_SKEW`` for a stamp
    with a zone, by more than ``ZONELESS_SLACK`` for one without (``activities.logs.tail``)."""
    if line.at is None or line.at >= since - min(CLOCK_SKEW, ZONELESS_SLACK):
        return False  # not early by either margin (every live line): no need to look for a zone
    return line.at < since - (CLOCK_SKEW if has_zone(line) else ZONELESS_SLACK)


def has_zone(line: LogLine | Line) -> bool:
    """Whether the leading timestamp of ``line`` names its zone (else ``LogLine.at`` is local time read as UTC)."""
    body = split_prefix(line.text).body
    stamp = line.text[: len(line.text) - len(body)] if body else line.text
    return _ZONE_END.search(stamp) is not None


def _parse_timestamp(m: re.Match[str]) -> datetime | None:
    date, clock, frac, tz, b_date, b_clock, b_frac, b_tz = m.group(*_TS_GROUPS)
    if date is None:  # the unbracketed form
        date, clock, frac, tz = b_date, b_clock, b_frac, b_tz
    try:
        zone = UTC if tz is None or tz == "Z" or tz == "UTC" else _zone(tz)
        micros = int(frac[:6].ljust(6, "0")) if frac else 0
        return datetime(
            int(date[:4]), int(date[5:7]), int(date[8:]), int(clock[:2]), int(clock[3:5]), int(clock[6:]), micros, zone
        )
    except ValueError:
        return None  # 2026-13-45 is not a timestamp: leave the text as it is


@functools.lru_cache(maxsize=64)
def _zone(tz: str) -> timezone:
    """The zone of ``+05:30``, ``-0500``; ValueError for an offset no zone has (a day or more)."""
    sign = -1 if tz[0] == "-" else 1
    digits = tz[1:].replace(":", "")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))


_TS_GROUPS = tuple(
    _TIMESTAMP.groupindex[g] for g in ("date", "time", "frac", "tz", "b_date", "b_time", "b_frac", "b_tz")
)
