"""Quantile math that mutation testing found unchecked (scripts/mutation.py, docs/mutation.md)."""

from __future__ import annotations

import math

import pytest

from servelens.core.quantiles import (
    bucket_bounds,
    histogram_quantile,
    percentile,
    weighted_quantile,
    weighted_quantiles,
)

INF = math.inf
B = [(1.0, 2.0), (2.0, 4.0), (INF, 4.0)]


def test_histogram_quantile_at_zero_and_one_is_finite_and_outside_is_infinite() -> None:
    assert histogram_quantile(0.0, B) == 0.0  # the lower bound of the first bucket
    assert histogram_quantile(1.0, B) == 2.0  # the highest finite le holding observations
    assert histogram_quantile(-0.01, B) == -INF
    assert histogram_quantile(1.01, B) == INF
    assert histogram_quantile(1.5, B) == INF


def test_histogram_quantile_of_fractional_or_single_counts() -> None:
    # counts may be rates or deltas: a total of 1 or below 1 is still a distribution
    assert histogram_quantile(0.5, [(1.0, 1.0), (INF, 1.0)]) == pytest.approx(0.5)
    assert histogram_quantile(0.5, [(1.0, 0.5), (INF, 0.5)]) == pytest.approx(0.5)
    # a bucket holding one observation interpolates inside it
    assert histogram_quantile(0.75, [(1.0, 1.0), (2.0, 2.0), (INF, 2.0)]) == pytest.approx(1.5)


def test_histogram_quantile_in_inf_returns_the_highest_finite_le_not_its_count() -> None:
    assert histogram_quantile(0.5, [(2.0, 1.0), (INF, 10.0)]) == 2.0


def test_histogram_quantile_with_a_negative_first_le_returns_that_le_without_interpolating() -> None:
    b = [(-1.0, 5.0), (1.0, 10.0), (INF, 10.0)]
    assert histogram_quantile(0.2, b) == -1.0
    assert histogram_quantile(0.8, b) == pytest.approx(-1.0 + 2.0 * (3.0 / 5.0))


def test_histogram_quantile_needs_an_inf_bucket() -> None:
    assert math.isnan(histogram_quantile(0.5, []))
    assert math.isnan(histogram_quantile(0.5, [(1.0, 2.0), (2.0, 4.0)]))
    assert math.isnan(histogram_quantile(0.5, [(INF, 4.0)]))


@pytest.mark.parametrize(
    ("value", "edges", "bounds"),
    [
        (0.5, (1.0, 2.0), (0.0, 1.0)),  # a first positive edge: the first bucket starts at 0
        (0.1, (0.5, 1.0), (0.0, 0.5)),
        (3.0, (1.0, 2.0), (2.0, INF)),
        (-5.0, (-1.0, 2.0), (-INF, -1.0)),  # a first edge <= 0: the first bucket is open below
        (0.5, (-1.0, 2.0), (-1.0, 2.0)),
        (-1.0, (0.0, 1.0), (-INF, 0.0)),
        (0.5, (1.0,), (0.0, 1.0)),
        (0.5, (), (-INF, INF)),
    ],
)
def test_bucket_bounds_lower_bound(value: float, edges: tuple[float, ...], bounds: tuple[float, float]) -> None:
    assert bucket_bounds(value, edges) == bounds


def test_percentile_accepts_the_closed_range_only() -> None:
    vals = [1.0, 2.0, 3.0]
    assert percentile(vals, 0) == 1.0 and percentile(vals, 100) == 3.0
    assert percentile(vals, 0.5) == pytest.approx(1.01)
    for q in (-0.1, 100.5, 101):
        with pytest.raises(ValueError, match=r"^percentile must be within \[0, 100\], got "):
            percentile(vals, q)


def test_weighted_quantile_error_messages() -> None:
    with pytest.raises(ValueError, match=r"^quantile must be within \[0, 1\], got 1.5$"):
        weighted_quantile([1.0], [1.0], 1.5)
    with pytest.raises(ValueError, match=r"^values and weights differ in length: 2 and 1$"):
        weighted_quantile([1.0, 2.0], [1.0], 0.5)
    for bad in ([-1.0], [math.nan], [INF]):
        with pytest.raises(ValueError, match=r"^weights must be finite and >= 0$"):
            weighted_quantile([1.0], bad, 0.5)


def test_weighted_quantiles_unit_weights_at_exact_ranks() -> None:
    # inverted CDF: the smallest value whose cumulative share reaches q; q * n whole lands on a value
    vals, ones = [4.0, 1.0, 3.0, 2.0], [1.0] * 4
    assert weighted_quantiles(vals, ones, [0.0, 0.25, 0.5, 0.75, 1.0]) == (1.0, 1.0, 2.0, 3.0, 4.0)
    assert weighted_quantiles(vals, ones, [0.26, 0.51]) == (2.0, 3.0)
    # the same values through the weighted path (weights 2: cumulative 2, 4, 6, 8) give the same floats
    assert weighted_quantiles(vals, [2.0] * 4, [0.0, 0.25, 0.5, 0.75, 1.0]) == (1.0, 1.0, 2.0, 3.0, 4.0)


def test_weighted_quantiles_of_one_and_of_no_value() -> None:
    assert weighted_quantiles([7.0], [1.0], [0.0, 0.5, 1.0]) == (7.0, 7.0, 7.0)
    none = weighted_quantiles([], [], [0.5, 0.99])
    assert len(none) == 2 and all(math.isnan(x) for x in none)
    zero = weighted_quantiles([1.0, 2.0], [0.0, 0.0], [0.5])
    assert len(zero) == 1 and math.isnan(zero[0])
