"""What the parts of the Fleet's policy share: closed time windows, how a window reads for people, node lists.

Windows are closed: an event exactly ``window_s`` old still counts (the safe side of every limit).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from workflows.domain.progress import aware

__all__ = ["age_s", "span", "unique", "within"]


def age_s(now: datetime, at: datetime) -> float:
    """Seconds from ``at`` to ``now`` (negative when ``at`` is later); a naive time is taken as UTC."""
    return (aware(now) - aware(at)).total_seconds()


def within(at: datetime, now: datetime, window_s: float) -> bool:
    """``at`` is at most ``window_s`` before ``now`` (closed window; a time after ``now`` counts too)."""
    return age_s(now, at) <= window_s


def span(seconds: float) -> str:
    """A window for people: ``7d``, ``1h``, ``5m``, ``90s``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def unique(names: Iterable[str]) -> list[str]:
    """Names without blanks and repeats, first occurrence kept (the first implicated node is the likeliest)."""
    seen: dict[str, None] = {}
    for name in names:
        if name and name not in seen:
            seen[name] = None
    return list(seen)
