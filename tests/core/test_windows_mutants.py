"""The analysis' input windows: every refusal's exact text, the limits at their exact values, the
representation documented for samples and histograms (issue 21)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from servelens.core.binned_quantiles import in_memory
from servelens.core.buckets import IslBuckets
from servelens.core.summary import CumulativeHistogram, RequestSample
from servelens.core.windows import (
    BinnedSampleWindow,
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

L2 = ("0-512", "513+")
INF = math.inf


def one(count: float = 1.0, total: float = 0.5) -> CumulativeHistogram:
    return CumulativeHistogram(((1.0, count), (INF, count)), total)


def refused(call: Callable[[], object]) -> str:
    with pytest.raises(ExplainError) as err:
        call()
    return str(err.value)


def test_every_refusal_text() -> None:
    samples = SampleWindow("TTFT", L2, (BucketSamples((0.1,)), BucketSamples((0.2,))))
    hists = HistogramWindow("TTFT", L2, (one(), one()))
    assert refused(lambda: SampleWindow("TTFT", (), ())) == "a window needs at least one ISL bucket"
    assert refused(lambda: SampleWindow("TTFT", ("a", "a"), (BucketSamples(()),) * 2)) == \
        "ISL bucket labels repeat: a, a"
    assert refused(lambda: SampleWindow("TTFT", L2, (BucketSamples(()),))) == \
        "2 ISL bucket labels but 1 buckets of data"
    assert refused(lambda: BucketSamples((-1.0,))) == "latency samples must be finite and >= 0 seconds"
    assert refused(lambda: Mix(L2, (1.0, -1.0))) == "mix shares must be finite and >= 0"
    assert refused(lambda: Mix(L2, (0.0, 0.0))) == "mix shares sum to 0: no bucket has any weight"
    assert refused(lambda: aligned_mix(Mix(("0-512", "x"), (1, 1)), L2)) == \
        "the reference mix does not match the ISL buckets 0-512, 513+: it lacks 513+ and has x"
    assert refused(lambda: aligned_mix(Mix(("0-512",), (1,)), L2)) == \
        "the reference mix does not match the ISL buckets 0-512, 513+: it lacks 513+"
    assert refused(lambda: aligned_mix(Mix((*L2, "x", "y"), (1, 1, 1, 1)), L2)) == \
        "the reference mix does not match the ISL buckets 0-512, 513+: it has x, y"
    assert refused(lambda: check_pair(samples, hists)) == \
        "both windows must come from the same kind of source (samples or histograms)"
    other = SampleWindow("TTFT", ("a", "b"), samples.buckets)
    assert refused(lambda: check_pair(samples, other)) == (
        "the ISL buckets differ between the windows (earlier: 0-512, 513+; later: a, b): "
        "re-run with the same --isl-buckets")
    empty = SampleWindow("TTFT", L2, (BucketSamples(()), BucketSamples(())))
    assert refused(lambda: window_mix(empty)) == "no TTFT observations in the window"
    assert refused(lambda: sample_window([], IslBuckets.parse("512"), "duration")) == \
        "unknown metric 'duration' (ttft or itl)"
    three = ("0-512", "513-1024", "1025+")
    other_edges = CumulativeHistogram(((2.0, 1.0), (INF, 1.0)), 0.5)
    assert refused(lambda: HistogramWindow("TTFT", three, (one(), one(), other_edges))) == \
        "TTFT le edges of bucket 1025+ differ from bucket 0-512's"
    nan = CumulativeHistogram(((1.0, math.nan), (INF, 1.0)), 0.5)
    assert refused(lambda: HistogramWindow("TTFT", L2, (one(), nan))) == (
        "TTFT bucket 513+: le counts are negative or not cumulative (a counter reset between the two scrapes?)")
    assert refused(lambda: HistogramWindow("TTFT", L2, (one(), one()), requests=(1.0, -1.0))) == \
        "requests must give one count >= 0 per ISL bucket"


def test_one_observation_is_enough() -> None:
    w = SampleWindow("TTFT", L2, (BucketSamples((0.1,)), BucketSamples(())))
    check_pair(w, w)
    assert window_mix(w) == Mix(L2, (1.0, 0.0))
    h = HistogramWindow("TTFT", L2, (one(), one(0.0, 0.0)), requests=(0.0, 0.0))  # 0 units is allowed
    assert list(h.units()) == [0.0, 0.0]


def test_request_sizes_are_ints_and_empty_requests_sum_to_zero() -> None:
    assert BucketSamples((0.1, 0.2)).request_sizes().dtype == np.int64
    sized = BucketSamples((0.1, 0.2, 0.3), (2, 0, 1))
    assert sized.request_sizes().dtype == np.int64 and list(sized.request_sums()) == pytest.approx([0.3, 0.0, 0.3])
    assert list(BucketSamples((), (0, 0)).request_sums()) == [0.0, 0.0]


def test_sample_window_skips_missing_ttfts_and_counts_unbucketed() -> None:
    buckets = IslBuckets.parse("512")
    samples = [
        RequestSample(100, True, 0.1, (0.01, 0.02)),
        RequestSample(100, True, None),  # no first token: no TTFT, no ITL
        RequestSample(None, True, 0.3, (0.03,)),
        RequestSample(None, True, 0.4, (0.04, 0.05)),
        RequestSample(600, False, 0.5, (0.06,)),  # a failure: left out
    ]
    ttft = sample_window(samples, buckets, "ttft")
    assert (ttft.metric, [b.values_s for b in ttft.buckets], ttft.unbucketed) == ("TTFT", [(0.1,), ()], 2)
    itl = sample_window(samples, buckets, "itl")
    assert ([b.values_s for b in itl.buckets], [b.sizes for b in itl.buckets], itl.unbucketed) == (
        [(0.01, 0.02), ()], [(2, 0), ()], 3)


def test_mix_from_a_mapping_keeps_its_order_without_buckets() -> None:
    assert Mix.from_mapping({"513+": 3.0, "0-512": 1.0}) == Mix(("513+", "0-512"), (0.75, 0.25))
    assert Mix.from_mapping({"513+": 3.0, "0-512": 1.0}, IslBuckets.parse("512")) == Mix(L2, (0.25, 0.75))


@pytest.mark.parametrize("as_array", [False, True])
def test_sample_window_sums_are_exactly_rounded_from_tuples_and_arrays(as_array: bool) -> None:
    # ten 0.1 s: 1.0 exactly rounded (a running float sum gives 0.9999999999999999); 0.5 s: 0.5 exactly
    tenths = np.full(10, 0.1) if as_array else (0.1,) * 10
    half = np.array([0.5]) if as_array else (0.5,)
    w = SampleWindow("TTFT", L2, (BucketSamples(tenths), BucketSamples(half)))
    got = w.sums()
    assert got.tolist() == [1.0, 0.5]
    got[0] = 99.0  # a copy: the next call gives the sums again
    assert w.sums().tolist() == [1.0, 0.5]


def test_sample_window_sums_an_array_longer_than_one_slice() -> None:
    # 2**20 + 1 values: the last one in a second slice of the exact sum
    values = np.full(2**20 + 1, 0.5)
    values[-1] = 0.25
    w = SampleWindow("ITL", ("0-512",), (BucketSamples(values),))
    assert w.sums().tolist() == [2**19 + 0.25]


def test_bucket_samples_equal_by_value_as_tuples_or_arrays() -> None:
    assert BucketSamples((0.5, 1.0)) == BucketSamples(np.array([0.5, 1.0]))
    assert BucketSamples((0.5, 1.0, 2.0), (1, 2)) == BucketSamples(np.array([0.5, 1.0, 2.0]), np.array([1, 2]))
    assert BucketSamples((0.5, 1.0), (1, 1)) != BucketSamples((0.5, 1.0))  # sizes given vs one each
    assert BucketSamples((0.5, 1.0)) != BucketSamples((0.5, 1.0), (1, 1))
    assert BucketSamples((0.5, 1.0, 2.0), (1, 2)) != BucketSamples((0.5, 1.0, 2.0), (2, 1))
    assert BucketSamples((0.5, 1.0)) != BucketSamples((0.5, 2.0))
    assert BucketSamples((0.5,)) != BucketSamples((0.5, 0.5))
    assert BucketSamples((0.5,)).__eq__((0.5,)) is NotImplemented  # other types: Python's own comparison
    assert BucketSamples((0.5,)) != (0.5,)
    with pytest.raises(TypeError):
        hash(BucketSamples((0.5,)))


def _binned(sizes: list[list[int]], sums: list[list[float]], values: list[list[float]],
            labels: tuple[str, ...] = L2) -> BinnedSampleWindow:
    return BinnedSampleWindow("ITL", labels, tuple(np.array(n, dtype=np.int64) for n in sizes),
                              tuple(np.array(s, dtype=float) for s in sums),
                              in_memory([np.array(v, dtype=float) for v in values]))


def test_binned_sample_window_figures() -> None:
    """Bucket 0-512: three requests of 2, 0 and 1 tokens (0.1 + 0.2, nothing, 0.5); bucket 513+: one of 3
    (0.1 + 0.2 + 0.3): counts 3 and 3, requests 3 and 1, a table row per request in bucket order."""
    w = _binned([[2, 0, 1], [3]], [[0.1 + 0.2, 0.0, 0.5], [0.6]], [[0.1, 0.2, 0.5], [0.1, 0.2, 0.3]])
    assert w.counts().dtype == np.float64 and w.counts().tolist() == [3.0, 3.0]
    assert w.units().dtype == np.float64 and w.units().tolist() == [3.0, 1.0]
    ks, n, s = w.request_table()
    assert (ks.dtype, n.dtype, s.dtype) == (np.int64, np.float64, np.float64)
    assert (ks.tolist(), n.tolist(), s.tolist()) == ([0, 0, 0, 1], [2.0, 0.0, 1.0, 3.0], [0.1 + 0.2, 0.0, 0.5, 0.6])
    assert w.sums().tolist() == [0.1 + 0.2 + 0.5, 0.6]  # 0.30000000000000004 + 0.5 rounds to 0.8
    assert w.binned is w.values and w.unbucketed == 0
    # an empty bucket, requests of no tokens with a sum of 0 and sizes of 0: all allowed
    empty = _binned([[], [0, 0]], [[], [0.0, 0.0]], [[], []])
    assert empty.counts().tolist() == [0.0, 0.0] and empty.units().tolist() == [0.0, 2.0]
    assert [a.tolist() for a in empty.request_table()] == [[1, 1], [0.0, 0.0], [0.0, 0.0]]


def test_samplewindow_units_are_floats_as_every_windows() -> None:
    w = SampleWindow("ITL", L2, (BucketSamples((0.1, 0.2, 0.3), (2, 1)), BucketSamples(())))
    assert w.units().dtype == np.float64 and w.units().tolist() == [2.0, 0.0]
    h = HistogramWindow("TTFT", L2, (one(), one(0.0, 0.0)))
    assert h.units().dtype == np.float64


def test_binned_sample_window_refusals() -> None:
    ok_sizes, ok_sums, ok_values = [[1], [2]], [[0.5], [0.75]], [[0.5], [0.25, 0.5]]
    assert refused(lambda: _binned(ok_sizes, ok_sums, ok_values, ())) == "a window needs at least one ISL bucket"
    assert refused(lambda: _binned(ok_sizes, ok_sums, ok_values, ("0-512",))) == \
        "1 ISL bucket labels but 2 buckets of data"
    per_bucket = "sizes, sums and value counts must have one entry per ISL bucket"
    assert refused(lambda: _binned(ok_sizes, [[0.5]], ok_values)) == per_bucket
    assert refused(lambda: _binned(ok_sizes, [*ok_sums, [0.0]], ok_values)) == per_bucket
    assert refused(lambda: _binned(ok_sizes, ok_sums, [[0.5]])) == per_bucket
    assert refused(lambda: _binned(ok_sizes, ok_sums, [*ok_values, []])) == per_bucket
    one_each = "each request needs one size >= 0 and one sum"
    assert refused(lambda: _binned([[1], [1, 1]], [[0.5], [0.75]], ok_values)) == one_each
    assert refused(lambda: _binned([[1], [2]], [[0.5], [0.25, 0.5]], ok_values)) == one_each
    assert refused(lambda: _binned([[1], [3, -1]], [[0.5], [0.25, 0.5]], ok_values)) == one_each
    finite = "latency samples must be finite and >= 0 seconds"
    assert refused(lambda: _binned(ok_sizes, [[0.5], [-0.25]], ok_values)) == finite
    assert refused(lambda: _binned(ok_sizes, [[0.5], [math.nan]], ok_values)) == finite
    assert refused(lambda: _binned(ok_sizes, [[math.inf], [0.75]], ok_values)) == finite
    assert refused(lambda: _binned([[1], [1]], ok_sums, ok_values)) == \
        "sizes add up to 1 observations, value counts to 2"
    assert refused(lambda: _binned([[2], [2]], ok_sums, ok_values)) == \
        "sizes add up to 2 observations, value counts to 1"
