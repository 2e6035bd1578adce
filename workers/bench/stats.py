"""Summary statistics for benchmark samples (pure: no I/O, no clocks).

Percentiles interpolate linearly between the closest ranks (numpy's default ``linear`` method): for ``n`` sorted
values, percentile ``q`` sits at position ``(n - 1) * q / 100``. With three samples, p50 is the middle one and
p95 lies 90 % of the way from the middle to the largest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from workflows.policy.stats import mean, percentile

__all__ = ["Summary", "mean", "percentile", "summarize"]


class Summary(BaseModel):
    """Mean, median and 95th percentile of a sample."""

    model_config = ConfigDict(frozen=True)

    mean: float
    p50: float
    p95: float


def _finite(values: Iterable[float | int | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


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
