import math

import numpy as np
import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.summary import CumulativeHistogram, RequestSample
from servelens.core.windows import (
    BucketSamples,
    ExplainError,
    HistogramWindow,
    Mix,
    SampleWindow,
    aligned_mix,
    check_pair,
    sample_window,
    window_mix,
)

INF = math.inf
LABELS = ("0-512", "513-1024", "1025+")


def hist(*cum: float, total: float = 1.0, edges: tuple[float, ...] = (0.1, 1.0)) -> CumulativeHistogram:
    return CumulativeHistogram(tuple(zip((*edges, INF), cum, strict=True)), total)


def hwin(*hs: CumulativeHistogram, labels: tuple[str, ...] = LABELS) -> HistogramWindow:
    return HistogramWindow("TTFT", labels, hs)


def one_line(exc: pytest.ExceptionInfo[ExplainError]) -> str:
    text = str(exc.value)
    assert text and "\n" not in text
    return text


def test_bucket_samples_validate_and_sum_per_request() -> None:
    b = BucketSamples((0.1, 0.2, 0.3, 0.4), (1, 0, 3))
    assert b.count == 4
    assert b.request_sizes().tolist() == [1, 0, 3]
    assert b.request_sums() == pytest.approx([0.1, 0.0, 0.9])
    assert BucketSamples((0.5, 0.7)).request_sums().tolist() == [0.5, 0.7]
    with pytest.raises(ExplainError) as e:
        BucketSamples((0.1, -0.2))
    assert ">= 0" in one_line(e)
    with pytest.raises(ExplainError):
        BucketSamples((0.1, math.nan))
    with pytest.raises(ExplainError) as e:
        BucketSamples((0.1, 0.2), (1, 2))
    assert "3 observations" in one_line(e)


def test_sample_window_checks_labels() -> None:
    with pytest.raises(ExplainError):
        SampleWindow("TTFT", ("a", "a"), (BucketSamples(()), BucketSamples(())))
    with pytest.raises(ExplainError):
        SampleWindow("TTFT", LABELS, (BucketSamples(()),))
    with pytest.raises(ExplainError):
        SampleWindow("TTFT", (), ())


def test_histogram_window_rejects_edges_that_differ_and_counter_resets() -> None:
    ok = hwin(hist(1, 2, 3), hist(0, 0, 0), hist(2, 2, 5))
    assert ok.counts().tolist() == [3, 0, 5] and ok.edges == (0.1, 1.0, INF)
    with pytest.raises(ExplainError) as e:
        hwin(hist(1, 2, 3), hist(1, 2, 3, edges=(0.2, 1.0)), hist(0, 0, 0))
    assert "bucket 513-1024" in one_line(e)
    with pytest.raises(ExplainError) as e:
        hwin(hist(1, -2, 3), hist(0, 0, 0), hist(0, 0, 0))
    assert "counter reset" in one_line(e)
    with pytest.raises(ExplainError):
        hwin(hist(3, 2, 3), hist(0, 0, 0), hist(0, 0, 0))  # not cumulative
    with pytest.raises(ExplainError) as e:
        HistogramWindow("TTFT", ("a",), (CumulativeHistogram(((0.1, 1.0), (1.0, 2.0)), 1.0),))
    assert "+Inf" in one_line(e)
    with pytest.raises(ExplainError):
        HistogramWindow("TTFT", LABELS, (hist(1, 2, 3),) * 3, requests=(1, 2))
    assert hwin(hist(1, 2, 3), hist(0, 0, 0), hist(0, 0, 1)).units().tolist() == [3, 0, 1]
    with_units = HistogramWindow("ITL", LABELS, (hist(1, 2, 30),) * 3, requests=(2, 2, 2))
    assert with_units.units().tolist() == [2, 2, 2]


def test_mix_normalises_and_must_match_the_buckets() -> None:
    m = Mix(LABELS, (2, 1, 1))
    assert m.shares == pytest.approx((0.5, 0.25, 0.25))
    got = Mix.from_mapping({"1025+": 1, "0-512": 3, "513-1024": 0}, IslBuckets.parse("512,1024"))
    assert got.labels == LABELS and got.shares == pytest.approx((0.75, 0.0, 0.25))
    with pytest.raises(ExplainError) as e:
        Mix.from_mapping({"0-512": 1, "513-2048": 1}, IslBuckets.parse("512,1024"))
    text = one_line(e)
    assert "lacks 513-1024, 1025+" in text and "has 513-2048" in text
    for bad in ((-1, 1, 1), (0, 0, 0), (math.nan, 1, 1)):
        with pytest.raises(ExplainError):
            Mix(LABELS, bad)
    assert aligned_mix(Mix(LABELS[::-1], (1, 1, 2)), LABELS).shares == pytest.approx((0.5, 0.25, 0.25))


def test_window_mix_and_check_pair_errors() -> None:
    a = SampleWindow("TTFT", LABELS, (BucketSamples((0.1, 0.2)), BucketSamples(()), BucketSamples((1.0,))))
    assert window_mix(a).shares == pytest.approx((2 / 3, 0, 1 / 3))
    empty = SampleWindow("TTFT", LABELS, (BucketSamples(()),) * 3)
    with pytest.raises(ExplainError) as e:
        window_mix(empty)
    one_line(e)
    check_pair(a, a)
    with pytest.raises(ExplainError) as e:
        check_pair(a, empty)
    assert "later window has no TTFT" in one_line(e)
    with pytest.raises(ExplainError) as e:
        check_pair(empty, a)
    assert "earlier window" in one_line(e)
    other = SampleWindow("TTFT", ("0-1024", "1025-2048", "2049+"), a.buckets)
    with pytest.raises(ExplainError) as e:
        check_pair(a, other)
    assert "ISL buckets differ" in one_line(e) and "--isl-buckets" in str(e.value)
    h = hwin(hist(1, 2, 3), hist(0, 0, 0), hist(0, 0, 1))
    with pytest.raises(ExplainError) as e:
        check_pair(a, h)
    assert "same kind" in one_line(e)
    h2 = hwin(*(hist(1, 2, 3, edges=(0.1, 2.0)),) * 3)
    with pytest.raises(ExplainError) as e:
        check_pair(h, h2)
    assert "le edges differ" in one_line(e)
    with pytest.raises(ExplainError) as e:
        check_pair(a, SampleWindow("ITL", LABELS, a.buckets))
    assert "different metrics" in one_line(e)


def test_sample_window_from_request_samples() -> None:
    b = IslBuckets.parse("512,1024")
    samples = [
        RequestSample(100, True, 0.1, itl_s=(0.01, 0.02)),
        RequestSample(600, True, 0.5, itl_s=(0.03,)),
        RequestSample(600, False, 0.7, itl_s=(0.04,)),  # failed: in no figure, as in the table
        RequestSample(None, True, 0.9, itl_s=(0.05, 0.06)),
        RequestSample(2000, True, 1.5, itl_s=()),
    ]
    ttft = sample_window(samples, b, "ttft")
    assert ttft.metric == "TTFT" and ttft.labels == b.labels
    assert [x.values_s for x in ttft.buckets] == [(0.1,), (0.5,), (1.5,)]
    assert ttft.unbucketed == 1
    itl = sample_window(samples, b, "itl")
    assert [x.values_s for x in itl.buckets] == [(0.01, 0.02), (0.03,), ()]
    assert [x.sizes for x in itl.buckets] == [(2,), (1,), (0,)]
    assert itl.unbucketed == 2
    assert np.allclose(itl.sums(), [0.03, 0.03, 0.0])
    with pytest.raises(ExplainError):
        sample_window(samples, b, "duration")
