"""The audit's measuring helpers: times in UTC, seconds between two times, latency statistics, histograms and
count tables. Pure."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from workflows.domain.audit import CountRow, LatencyStats
from workflows.policy.stats import percentile

__all__ = ["count_rows", "histogram", "latency_stats", "seconds_between", "utc"]


def utc(t: datetime) -> datetime:
    """``t`` as an aware UTC datetime (naive times are taken as UTC, as everywhere in Rebound)."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def seconds_between(start: datetime, end: datetime) -> float:
    """``end - start`` in seconds, naive times taken as UTC."""
    return (utc(end) - utc(start)).total_seconds()


def latency_stats(values: Sequence[float | None]) -> LatencyStats:
    """Count, p50, p95, mean and max of the known values (rounded to ms); ``None`` values count as unknown."""
    known = sorted(round(v, 3) for v in values if v is not None and math.isfinite(v))
    unknown = len(values) - len(known)
    if not known:
        return LatencyStats(unknown=unknown)
    return LatencyStats(
        count=len(known),
        unknown=unknown,
        p50=round(percentile(known, 50), 3),
        p95=round(percentile(known, 95), 3),
        mean=round(math.fsum(known) / len(known), 3),
        max=known[-1],
        values=tuple(known),
    )


def histogram(values: Sequence[float], bins: int = 12) -> tuple[tuple[float, float, int], ...]:
    """``(low, high, count)`` bins of equal width from 0 to the largest value; the last bin includes its top.

    Latencies are never negative, so bars start at 0 and the charts of two reports compare by eye. Empty input:
    no bins; all zeros: one bin ``(0, 0, n)``.

    Raises:
        ValueError: ``bins`` < 1 or a negative value.
    """
    if bins < 1:
        raise ValueError(f"need at least one bin, not {bins}")
    if not values:
        return ()
    if min(values) < 0:
        raise ValueError(f"latencies cannot be negative: {min(values)}")
    top = max(values)
    if top == 0:
        return ((0.0, 0.0, len(values)),)
    width = top / bins
    counts = [0] * bins
    for v in values:
        counts[min(int(v / width), bins - 1)] += 1
    return tuple((i * width, (i + 1) * width, counts[i]) for i in range(bins))


def count_rows(keys: Iterable[str]) -> tuple[CountRow, ...]:
    """How often each key occurs, most frequent first (ties by key)."""
    counted = Counter(keys)
    return tuple(CountRow(key=k, count=n) for k, n in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0])))
