"""The table's rows field by field on inputs small enough to work out by hand: exact rows from
samples, interpolated rows from histograms, the hit ratios, the one-``le``-bucket range (issue 21)."""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.summary import (
    BucketHistograms,
    BucketRow,
    CumulativeHistogram,
    RequestSample,
    hit_ratio,
    row_from_histograms,
    rows_from_histograms,
    rows_from_samples,
    summed_over_buckets,
    uncached_tokens,
)

INF = math.inf
B = IslBuckets.parse("512,1024")


def hist(counts: tuple[float, ...], total: float, edges: tuple[float, ...] = (1.0, 2.0)) -> CumulativeHistogram:
    return CumulativeHistogram(tuple(zip((*edges, INF), counts, strict=True)), total)


def test_rows_from_samples_every_field() -> None:
    samples = [
        RequestSample(100, True, 0.1, tuple(0.01 * k for k in range(1, 101)), cached_tokens=20),
        RequestSample(300, True, 0.3, (), cached_tokens=100),
        RequestSample(200, False, 0.9, (5.0,), cached_tokens=200),  # a failure: only in the counts
        RequestSample(600, True, 0.5),
        RequestSample(None, True, 0.7),  # no ISL: only in "all"
    ]
    rows = rows_from_samples(samples, B)
    assert [r.bucket for r in rows] == ["0-512", "513-1024", "1025+", "all"]
    first = rows[0]
    assert asdict(first) == dict(
        bucket="0-512", requests=3, errors=1,
        ttft_p50_s=pytest.approx(0.2), ttft_p95_s=pytest.approx(0.29), ttft_p99_s=pytest.approx(0.298),
        # ITL 0.01 .. 1.00 s: linear-interpolation percentiles
        itl_p50_s=pytest.approx(0.505), itl_p95_s=pytest.approx(0.9505), mean_cached_tokens=60.0,
        ttft_mean_s=pytest.approx(0.2), exact=True, itl_p99_s=pytest.approx(0.9901),
        cache_hit_ratio=pytest.approx(120 / 400), ttft_le_range_s=None, ttft_le_edges=None, itl_le_edges=None,
    )
    assert rows[1].requests == 1 and rows[1].cache_hit_ratio is None and rows[1].ttft_mean_s == 0.5
    assert rows[2] == BucketRow("1025+", 0, 0, None, None, None, None, None, None, None, True, None, None)
    assert rows[3].requests == 5 and rows[3].ttft_mean_s == pytest.approx(1.6 / 4)


def test_rows_by_uncached_tokens() -> None:
    samples = [RequestSample(1000, True, 0.1, cached_tokens=900), RequestSample(1000, True, 0.2)]
    rows = rows_from_samples(samples, B, by="uncached")
    assert [r.requests for r in rows] == [1, 0, 0, 2]  # 100 uncached tokens; the other has no cached tokens
    assert [r.requests for r in rows_from_samples(samples, B)] == [0, 2, 0, 2]
    with pytest.raises(ValueError) as err:
        rows_from_samples(samples, B, by="cached")
    assert str(err.value) == "by must be 'isl' or 'uncached', got 'cached'"


def test_uncached_tokens() -> None:
    assert uncached_tokens(RequestSample(100, True, None, cached_tokens=30)) == 70
    assert uncached_tokens(RequestSample(100, True, None, cached_tokens=130)) == 0
    assert uncached_tokens(RequestSample(100, True, None)) is None  # absent cached tokens: unknown
    assert uncached_tokens(RequestSample(None, True, None, cached_tokens=30)) is None


def test_hit_ratio_sums_over_the_successes_that_report_both() -> None:
    samples = [
        RequestSample(100, True, None, cached_tokens=20),
        RequestSample(300, True, None, cached_tokens=100),
        RequestSample(100, False, None, cached_tokens=100),  # failed
        RequestSample(100, True, None),  # no cached tokens
        RequestSample(None, True, None, cached_tokens=50),  # no prompt length
    ]
    assert hit_ratio(samples) == 120 / 400
    assert hit_ratio([RequestSample(1, True, None, cached_tokens=1)]) == 1.0
    assert hit_ratio([RequestSample(100, True, None)]) is None


def test_bucket_histograms_hit_ratio() -> None:
    cached = hist((1, 2, 2), 300.0, (100.0, 1000.0))
    assert BucketHistograms(None, None, None, cached, prompt_tokens=600.0).hit_ratio() == 0.5
    assert BucketHistograms(None, None, None, cached, prompt_tokens=1.0, hit_cached_tokens=1.0).hit_ratio() == 1.0
    assert BucketHistograms(None, None, None, cached, prompt_tokens=600.0, hit_cached_tokens=60.0).hit_ratio() == 0.1
    assert BucketHistograms(None, None, None, None, prompt_tokens=600.0).hit_ratio() is None
    assert BucketHistograms(None, None, None, cached).hit_ratio() is None
    assert BucketHistograms(None, None, None, cached, prompt_tokens=0.0).hit_ratio() is None


def test_row_from_histograms_every_field() -> None:
    # TTFT: 2 in (0, 1], 2 in (1, 2]; ITL: 4 in (0, 1]; duration: 5 requests (one failed before its first token)
    h = BucketHistograms(
        ttft=hist((2, 4, 4), 4.0), itl=hist((4, 4, 4), 1.0), duration=hist((0, 5, 5), 7.5),
        cached=hist((1, 2, 2), 30.0, (10.0, 100.0)), errors=1, prompt_tokens=300.0,
    )
    assert asdict(row_from_histograms("0-512", h)) == dict(
        bucket="0-512", requests=5, errors=1,
        ttft_p50_s=1.0, ttft_p95_s=pytest.approx(1.9), ttft_p99_s=pytest.approx(1.98),
        itl_p50_s=0.5, itl_p95_s=pytest.approx(0.95), mean_cached_tokens=15.0, ttft_mean_s=1.0, exact=False,
        itl_p99_s=pytest.approx(0.99), cache_hit_ratio=0.1, ttft_le_range_s=None,
        ttft_le_edges="other", itl_le_edges="other",  # edges (1, 2): neither servelens' nor Dynamo's
    )
    # without a duration histogram the TTFT count is the requests; without either, 0
    no_duration = BucketHistograms(ttft=hist((0, 3, 3), 4.5), itl=None, duration=None, cached=None)
    row = row_from_histograms("x", no_duration)
    assert (row.requests, row.itl_p50_s, row.itl_p95_s, row.itl_p99_s, row.ttft_le_range_s) == (
        3, None, None, None, (1.0, 2.0))
    assert row_from_histograms("x", BucketHistograms(None, None, None, None)).requests == 0


def test_rows_from_histograms_in_numeric_order_then_all() -> None:
    one = BucketHistograms(None, None, hist((1, 1, 1), 0.5), None)
    per = {"513-1024": one, "1025+": one, "0-512": one}
    assert [r.bucket for r in rows_from_histograms(per)] == ["0-512", "513-1024", "1025+"]
    assert [r.bucket for r in rows_from_histograms(per, one)][-1] == "all"


def test_summed_over_buckets_sums_every_family() -> None:
    a = BucketHistograms(hist((1, 1, 1), 0.5), hist((2, 2, 2), 0.2), hist((0, 1, 1), 1.5), hist((1, 1, 1), 5.0))
    b = BucketHistograms(hist((0, 2, 2), 3.0), hist((1, 1, 3), 4.0), hist((0, 2, 2), 3.0), hist((0, 1, 1), 7.0))
    s = summed_over_buckets({"0-512": a, "513+": b})
    assert s == BucketHistograms(hist((1, 3, 3), 3.5), hist((3, 3, 5), 4.2), hist((0, 3, 3), 4.5),
                                 hist((1, 2, 2), 12.0))
    no_itl = summed_over_buckets({"0-512": a, "513+": BucketHistograms(a.ttft, None, a.duration, a.cached)})
    assert no_itl is not None and no_itl.itl is None  # a family missing from one bucket
    assert no_itl.cached == hist((2, 2, 2), 10.0) and no_itl.ttft == hist((2, 2, 2), 1.0)
    assert summed_over_buckets({}) is None


def test_cumulative_histogram_mean_and_errors() -> None:
    assert hist((0, 0, 0), 0.0).mean() is None
    assert hist((1, 1, 1), 0.5).mean() == 0.5  # one observation
    with pytest.raises(ValueError) as err:
        hist((1, 1, 1), 0.5).minus(hist((1, 1), 0.5, (1.0,)))
    assert str(err.value) == "cannot subtract histograms with different le edges"
    with pytest.raises(ValueError) as err:
        hist((1, 1, 1), 0.5).plus(hist((1, 1), 0.5, (1.0,)))
    assert str(err.value) == "cannot add histograms with different le edges"


@pytest.mark.parametrize(
    ("counts", "want"),
    [
        ((0, 0, 0), None),  # no observations
        ((1, 1, 1), (0.0, 1.0)),  # one, in the first bucket: lower edge 0
        ((3, 3, 3), (0.0, 1.0)),
        ((0, 1, 1), (1.0, 2.0)),
        ((0, 0, 2), (2.0, INF)),
        ((1, 2, 2), None),  # spread over two
    ],
)
def test_single_bucket(counts: tuple[float, ...], want: tuple[float, float] | None) -> None:
    assert hist(counts, 1.0).single_bucket() == want
