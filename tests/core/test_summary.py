import math

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.summary import (
    BucketHistograms,
    CumulativeHistogram,
    RequestSample,
    row_from_histograms,
    rows_from_samples,
    summed_over_buckets,
)


def test_rows_exact_percentiles_with_known_answers() -> None:
    b = IslBuckets.parse("512,1024")
    samples = [RequestSample(100, True, t / 1000, itl_s=[0.01], cached_tokens=0) for t in range(1, 101)]
    samples += [RequestSample(600, True, 0.5, itl_s=[0.02, 0.04], cached_tokens=512),
                RequestSample(600, False, None), RequestSample(None, True, 0.9)]
    rows = rows_from_samples(samples, b)
    assert [r.bucket for r in rows] == ["0-512", "513-1024", "1025+", "all"]
    low = rows[0]
    assert low.requests == 100 and low.errors == 0
    assert low.ttft_p50_s == pytest.approx(0.0505)
    assert low.ttft_p99_s == pytest.approx(0.09901)
    assert not low.low_count
    mid = rows[1]
    assert (mid.requests, mid.errors) == (2, 1)
    assert mid.ttft_p95_s == 0.5 and mid.itl_p50_s == pytest.approx(0.03)
    assert mid.itl_p99_s == pytest.approx(0.0398) and low.itl_p99_s == pytest.approx(0.01)
    assert mid.mean_cached_tokens == 512 and mid.low_count
    assert rows[2].requests == 0 and rows[2].ttft_p50_s is None
    assert rows[3].requests == 103 and rows[3].errors == 1


def test_cumulative_histogram_ops() -> None:
    a = CumulativeHistogram(((1.0, 2.0), (math.inf, 4.0)), 6.0)
    b = CumulativeHistogram(((1.0, 1.0), (math.inf, 1.0)), 0.5)
    d = a.minus(b)
    assert d.buckets == ((1.0, 1.0), (math.inf, 3.0)) and d.sum == 5.5
    assert a.plus(b).count == 5.0
    assert d.mean() == pytest.approx(5.5 / 3)
    assert CumulativeHistogram(((1.0, 0.0), (math.inf, 0.0)), 0).quantile(0.5) is None
    with pytest.raises(ValueError):
        a.minus(CumulativeHistogram(((2.0, 0.0), (math.inf, 0.0)), 0))


def test_row_from_histograms_has_itl_p99() -> None:
    itl = CumulativeHistogram(((0.01, 90.0), (0.02, 100.0), (math.inf, 100.0)), 1.2)
    row = row_from_histograms("0-512", BucketHistograms(None, itl, None, None))
    assert row.itl_p99_s == pytest.approx(0.019) and row.itl_p50_s == pytest.approx(0.01 * 50 / 90)
    assert not row.exact


def test_summed_over_buckets_adds_each_family_by_le() -> None:
    a = CumulativeHistogram(((1.0, 2.0), (math.inf, 4.0)), 6.0)
    b = CumulativeHistogram(((1.0, 1.0), (math.inf, 1.0)), 0.5)
    total = summed_over_buckets({"0-512": BucketHistograms(a, a, a, None), "513+": BucketHistograms(b, b, b, b)})
    assert total is not None and total.ttft == a.plus(b) and total.duration is not None
    assert total.duration.count == 5.0 and total.duration.sum == 6.5
    assert total.cached is None  # missing from a bucket: no sum
    assert summed_over_buckets({}) is None
    with pytest.raises(ValueError, match="different le edges"):
        summed_over_buckets({"x": BucketHistograms(a, None, None, None),
                             "y": BucketHistograms(CumulativeHistogram(((2.0, 0.0), (math.inf, 0.0)), 0), None, None,
                                                   None)})
