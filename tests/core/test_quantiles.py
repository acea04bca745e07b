import math

import numpy as np
import pytest

from servelens.core.quantiles import bucket_bounds, histogram_quantile, percentile


def test_percentile_exact() -> None:
    vals = list(range(1, 101))
    assert percentile(vals, 50) == pytest.approx(50.5)
    assert percentile(vals, 99) == pytest.approx(np.percentile(vals, 99))
    assert percentile([3.0], 95) == 3.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(vals, 101)


def test_histogram_quantile_matches_prometheus_rules() -> None:
    inf = math.inf
    b = [(0.1, 10.0), (0.2, 30.0), (0.5, 40.0), (inf, 40.0)]
    # rank 20 lies in (0.1, 0.2]: 0.1 + 0.1 * (10/20)
    assert histogram_quantile(0.5, b) == pytest.approx(0.15)
    assert histogram_quantile(0.25, b) == pytest.approx(0.1)  # rank 10 ends the first bucket
    assert histogram_quantile(0.1, b) == pytest.approx(0.04)  # first bucket starts at 0
    # a quantile in +Inf returns the highest finite le
    assert histogram_quantile(0.99, [(1.0, 1.0), (inf, 10.0)]) == 1.0
    assert math.isnan(histogram_quantile(0.5, [(1.0, 0.0), (inf, 0.0)]))
    assert histogram_quantile(0.5, [(0.0, 5.0), (1.0, 5.0), (inf, 5.0)]) == 0.0


def test_bucket_bounds() -> None:
    assert bucket_bounds(0.15, (0.1, 0.2)) == (0.1, 0.2)
    assert bucket_bounds(0.2, (0.1, 0.2)) == (0.1, 0.2)
    assert bucket_bounds(5, (0.1, 0.2)) == (0.2, math.inf)


def test_weighted_quantile_is_the_inverted_cdf() -> None:
    from servelens.core.quantiles import weighted_quantile

    rng = np.random.default_rng(3)
    vals = rng.lognormal(0, 1, 101)
    for q in (0.0, 0.1, 0.5, 0.95, 0.99, 1.0):
        assert weighted_quantile(vals, np.ones(vals.size), q) == np.quantile(vals, q, method="inverted_cdf")
    # integer weights read as repeated values; zero weights drop a value
    w = rng.integers(0, 4, vals.size)
    for q in (0.25, 0.5, 0.9):
        assert weighted_quantile(vals, w, q) == np.quantile(np.repeat(vals, w), q, method="inverted_cdf")
    # the smallest value whose cumulative share reaches q: 1 holds 0.5, 2 holds 0.3, 3 holds 0.2
    v, wt = [3.0, 1.0, 2.0], [0.2, 0.5, 0.3]
    assert weighted_quantile(v, wt, 0.5) == 1.0
    assert weighted_quantile(v, wt, 0.5000001) == 2.0
    assert weighted_quantile(v, wt, 0.8) == 2.0
    assert weighted_quantile(v, wt, 0.81) == 3.0
    assert math.isnan(weighted_quantile([1.0], [0.0], 0.5))
    with pytest.raises(ValueError):
        weighted_quantile(v, wt, 1.5)
    with pytest.raises(ValueError):
        weighted_quantile(v, [0.2, -0.5, 0.3], 0.5)
    with pytest.raises(ValueError):
        weighted_quantile(v, [1.0], 0.5)
