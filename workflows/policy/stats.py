"""Small statistics shared by the audit report and the benchmarks. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["mean", "percentile"]


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
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)
