"""How the split's uncertainty is estimated: bootstrap over requests, normal approximation from counts."""

import math
from dataclasses import replace

import numpy as np
import pytest

from servelens.core.summary import CumulativeHistogram
from servelens.core.uncertainty import (
    bootstrap_split,
    histogram_variance,
    normal_split,
    resampled_counts_sums,
    split_arrays,
    z_value,
)
from servelens.core.windows import BucketSamples, SampleWindow
from servelens.testing.latency_windows import EARLY_MIX, LATE_MIX, binned, clustered_window, sample_window

INF = math.inf


def width(ci: tuple[float, float]) -> float:
    return ci[1] - ci[0]


def test_split_arrays_fill_in_a_bucket_seen_once() -> None:
    n_a, s_a = np.array([2.0, 0.0]), np.array([2.0, 0.0])
    n_b, s_b = np.array([1.0, 1.0]), np.array([3.0, 5.0])
    mix, lat, m_a, m_b = split_arrays(n_a, s_a, n_b, s_b)
    assert m_a.tolist() == [1.0, 5.0] and m_b.tolist() == [3.0, 5.0]  # bucket 1 borrows the later mean
    assert lat.tolist() == [1.0, 0.0] and mix.tolist() == [-0.5, 2.5]
    assert mix.sum() + lat.sum() == pytest.approx(4.0 - 1.0)


def test_histogram_variance_known_answer() -> None:
    # 2 at 0 (edge 0 holds exactly 0), 2 in (0, 1] (midpoint 0.5, width 1), 1 above 1 placed by the sum
    h = CumulativeHistogram(((0.0, 2.0), (1.0, 4.0), (INF, 5.0)), 1.0 + 3.0)
    mean = 4.0 / 5
    top = 4.0 - 1.0  # the sum minus the finite buckets' midpoints
    want = (2 * mean**2 + 2 * ((0.5 - mean) ** 2 + 1 / 12) + (top - mean) ** 2) / 4
    assert histogram_variance(h) == pytest.approx(want)
    # a top value the sum would place below the last edge sits at the edge
    low = CumulativeHistogram(((1.0, 1.0), (INF, 2.0)), 0.5 + 0.2)
    assert histogram_variance(low) == pytest.approx(((0.5 - 0.35) ** 2 + 1 / 12 + (1.0 - 0.35) ** 2) / 1)
    assert math.isnan(histogram_variance(CumulativeHistogram(((1.0, 1.0), (INF, 1.0)), 0.5)))


def test_histogram_variance_approaches_the_sample_variance_with_fine_edges() -> None:
    w = sample_window(1, EARLY_MIX, 4000)
    fine = tuple(float(x) for x in np.geomspace(0.001, 100, 400))
    for b, h in zip(w.buckets, binned(w, fine).histograms, strict=True):
        if b.count > 100:
            assert histogram_variance(h) == pytest.approx(np.var(b.values_s, ddof=1), rel=0.01)


def test_normal_approximation_matches_the_bootstrap_with_fine_edges() -> None:
    a, b = sample_window(2, EARLY_MIX, 3000), sample_window(3, LATE_MIX, 3000, {4: 2.0})
    fine = tuple(float(x) for x in np.geomspace(0.001, 100, 400))
    boot = bootstrap_split(a, b, resamples=2000, seed=1)
    norm = normal_split(binned(a, fine), binned(b, fine))
    assert 0.85 < width(norm.mix) / width(boot.mix) < 1.18
    assert 0.85 < width(norm.latency) / width(boot.latency) < 1.18
    assert 0.8 < width(norm.bucket_change[4]) / width(boot.bucket_change[4]) < 1.25
    # coarse le edges only add within-bucket variance: wider, never narrower
    coarse = normal_split(binned(a), binned(b))
    assert width(coarse.latency) > width(norm.latency)
    assert "normal approximation" in norm.method and "bootstrap" in boot.method


def test_cluster_bootstrap_keeps_a_requests_tokens_together() -> None:
    a, b = clustered_window(4, EARLY_MIX, 400, 20), clustered_window(5, EARLY_MIX, 400, 20)
    flat_a = replace(a, buckets=tuple(BucketSamples(x.values_s) for x in a.buckets))
    flat_b = replace(b, buckets=tuple(BucketSamples(x.values_s) for x in b.buckets))
    clustered = bootstrap_split(a, b, resamples=1000)
    naive = bootstrap_split(flat_a, flat_b, resamples=1000)
    # 20 near-identical tokens per request: the honest interval is about sqrt(20) = 4.5x wider
    assert width(clustered.latency) > 3 * width(naive.latency)


def test_resampled_counts_sums_draw_whole_requests() -> None:
    w = SampleWindow("ITL", ("a", "b"), (BucketSamples((1.0, 1.0, 1.0), (3,)), BucketSamples((2.0, 4.0), (1, 1))))
    counts, sums = resampled_counts_sums(w, 500, np.random.default_rng(0))
    assert counts.shape == (500, 2) and (counts.sum(axis=1) >= 2).all()
    assert set(np.unique(counts[:, 0])) <= {0.0, 3.0, 6.0, 9.0}  # multiples of the request's 3 tokens
    assert np.allclose(sums[:, 0], counts[:, 0])  # every token is 1.0
    assert counts[:, 0].mean() == pytest.approx(3 * 3 / 3, rel=0.15)  # 1 of 3 requests drawn per pick


def test_z_value() -> None:
    assert z_value(0.95) == pytest.approx(1.959964)
    with pytest.raises(ValueError):
        z_value(1.0)
