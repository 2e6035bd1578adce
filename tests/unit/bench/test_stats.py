"""Percentile and summary maths of the benchmark (pure)."""

from __future__ import annotations

import math

import pytest

from workers.bench.stats import Summary, mean, percentile, summarize


def test_percentile_interpolates_linearly_between_closest_ranks() -> None:
    values = [10.0, 20.0, 30.0]
    assert percentile(values, 0) == 10.0
    assert percentile(values, 50) == 20.0
    assert percentile(values, 100) == 30.0
    # position (3 - 1) * 0.95 = 1.9: 90 % of the way from 20 to 30
    assert percentile(values, 95) == pytest.approx(29.0)


def test_percentile_ignores_input_order_and_matches_numpy_linear() -> None:
    values = [7.0, 1.0, 3.0, 5.0]
    # numpy.percentile([1, 3, 5, 7], [50, 95]) == [4.0, 6.7]
    assert percentile(values, 50) == pytest.approx(4.0)
    assert percentile(values, 95) == pytest.approx(6.7)


def test_percentile_of_one_value_is_that_value() -> None:
    assert percentile([4.2], 95) == 4.2
    assert percentile([4.2], 0) == 4.2


@pytest.mark.parametrize("q", [-1, 100.5])
def test_percentile_rejects_out_of_range(q: float) -> None:
    with pytest.raises(ValueError):
        percentile([1.0], q)


def test_percentile_and_mean_reject_empty() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        mean([])


def test_summarize_skips_missing_and_rounds() -> None:
    s = summarize([1.0, None, 2.0, float("nan"), 4.0])
    assert s == Summary(mean=2.333, p50=2.0, p95=3.8)


def test_summarize_nothing_is_none() -> None:
    assert summarize([]) is None
    assert summarize([None, None]) is None
    assert summarize([math.inf]) is None


def test_summarize_ints() -> None:
    s = summarize([12, 8, 10])
    assert s is not None
    assert (s.mean, s.p50, s.p95) == (10.0, 10.0, 11.8)
