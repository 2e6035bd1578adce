"""Summary statistics for benchmark samples (pure: no I/O, no clocks).

Percentiles interpolate linearly between the closest ranks (numpy's default ``linear`` method): for ``n`` sorted
values, percentile ``q`` sits at position ``(n - 1) * q / 100``. With three samples, p50 is the middle one and
p95 lies 90 % of the way from the middle to the largest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

__all__ = ["Summary", "mean", "percentile", "summarize"]


class Summary(BaseModel):
    """Mean, median and 95th percentile of a sample."""

    model_config = ConfigDict(frozen=True)

    mean: float
    p50: float
    p95: float


def _finite(values: Iterable[float | int | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean.

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks.

    Raises:
        ValueError: no values, or ``q`` outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, not {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    fraction = position - lower
    return ordered[lower] + (ordered[upper] - ordered[lower]) * fraction


def summarize(values: Iterable[float | int | None], *, digits: int = 3) -> Summary | None:
    """Mean, p50 and p95 of the values that are present (``None`` and non-finite ones are skipped);
    ``None`` when nothing is left."""
    present = _finite(values)
    if not present:
        return None
    return Summary(
        mean=round(mean(present), digits),
        p50=round(percentile(present, 50), digits),
        p95=round(percentile(present, 95), digits),
    )
