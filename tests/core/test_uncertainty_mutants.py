"""core/uncertainty against figures worked out by hand: histogram variances on paper, the normal
approximation's intervals from the module docstring's formulas written out per bucket (fill-ins,
borrowed variances, units, the per-bucket level), the bootstrap's percentile intervals from its
resampled counts and sums, and the thresholds and messages (issue 21)."""

from __future__ import annotations

import math
import warnings
from statistics import NormalDist

import numpy as np
import pytest

from servelens.core.summary import CumulativeHistogram
from servelens.core.uncertainty import (
    bootstrap_split,
    delta_split,
    histogram_variance,
    normal_split,
    resampled_counts_sums,
    split_arrays,
    split_intervals,
    z_value,
)
from servelens.core.windows import BucketSamples, HistogramWindow, SampleWindow
from servelens.testing.latency_windows import central_difference_variance

INF = math.inf
LABELS5 = ("b0", "b1", "b2", "b3", "b4")


def hist(below: float, above: float, total_sum: float, edge: float = 2.0) -> CumulativeHistogram:
    """``below`` observations in (0, edge], ``above`` beyond it, ``total_sum`` their sum."""
    return CumulativeHistogram(((edge, below), (INF, below + above)), total_sum)


def z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


# ------------------------------------------------------------------ histogram_variance on paper
# One edge at 2 s: an observation in (0, 2] sits at 1 s with the uniform variance 2**2 / 12 = 1/3.


def test_histogram_variance_with_a_wide_bucket_and_two_above_the_last_edge() -> None:
    # 2 at 1 s, 2 above 2 s placed by the sum 12 s: (12 - 2) / 2 = 5 s each; mean 3 s
    want = (2 * ((1 - 3) ** 2 + 1 / 3) + 2 * (5 - 3) ** 2) / 3  # = 50/9
    assert histogram_variance(hist(2, 2, 12.0)) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(50 / 9)


def test_histogram_variance_of_a_negative_first_edge() -> None:
    # le = -1 holds exactly -1 (width 0); the next bucket (-1, 1] is centred at 0 with width 2.
    # One observation each, sum -1: mean -0.5; (0.25 + 0) + (0.25 + 4/12), over n - 1 = 1.
    h = CumulativeHistogram(((-1.0, 1.0), (1.0, 2.0), (INF, 2.0)), -1.0)
    assert histogram_variance(h) == pytest.approx(0.25 + 0.25 + 4 / 12, rel=1e-12)


# ------------------------------------------------------------------ split_arrays


def test_split_arrays_with_single_and_fractional_counts_and_a_bucket_gone_later() -> None:
    # counts may be fractions (deltas of rates): 0.5 observations summing to 0.25 s is a mean of 0.5 s
    n_a, s_a = np.array([1.0, 0.5, 2.0]), np.array([0.3, 0.25, 1.0])
    n_b, s_b = np.array([1.0, 0.5, 0.0]), np.array([0.5, 0.5, 0.0])
    _, lat, m_a, m_b = split_arrays(n_a, s_a, n_b, s_b)
    assert m_a.tolist() == pytest.approx([0.3, 0.5, 0.5])
    assert m_b.tolist() == pytest.approx([0.5, 1.0, 0.5])  # the third borrows the earlier mean
    # w_b = 2/3, 1/3, 0
    assert lat.tolist() == pytest.approx([2 / 3 * 0.2, 1 / 3 * 0.5, 0.0])


# ------------------------------------------------------------------ normal_split from the formulas


def cov_quad(w: list[float], units: float, g: list[float]) -> float:
    """Var of sum(w_k g_k) for multinomial shares w of ``units`` units: (sum w g^2 - (sum w g)^2) / U."""
    return (sum(wk * gk * gk for wk, gk in zip(w, g, strict=True))
            - sum(wk * gk for wk, gk in zip(w, g, strict=True)) ** 2) / units


def around(value: float, var: float, zz: float) -> tuple[float, float]:
    return value - zz * math.sqrt(var), value + zz * math.sqrt(var)


def test_normal_split_by_hand() -> None:
    # Five buckets. b0, b1 in both windows; b2 only later; b3 in neither; b4 only earlier.
    # Earlier window, units given (b1: exactly 2, the least with a known variance):
    #   b0: 4 at 1 s (mean 1, s^2 = 4 * (1/3) / 3 = 4/9), units 4
    #   b1: 2 at 1 s, 2 placed at 5 s (mean 3, s^2 = 50/9), units 2
    #   b4: 3 at 1 s, sum 2.4 (mean 0.8, s^2 = 3 * (0.2^2 + 1/3) / 2 = 0.56), units 3
    # Later window, units = counts:
    #   b0: 2 at 1 s (mean 1, s^2 = 2 * (1/3) / 1 = 2/3)
    #   b1: 2 at 1 s, 2 placed at 4 s (mean 2.5, s^2 = (2 * (1.5^2 + 1/3) + 2 * 1.5^2) / 3 = 29/9)
    #   b2: 2 at 1 s, sum 3 (mean 1.5, s^2 = 2 * (0.5^2 + 1/3) / 1 = 7/6)
    empty = hist(0, 0, 0.0)
    before = HistogramWindow("TTFT", LABELS5, (hist(4, 0, 4.0), hist(2, 2, 12.0), empty, empty, hist(3, 0, 2.4)),
                             requests=(4.0, 2.0, 0.0, 0.0, 3.0))
    after = HistogramWindow("TTFT", LABELS5, (hist(2, 0, 2.0), hist(2, 2, 10.0), hist(2, 0, 3.0), empty, empty))
    s2_a = [4 / 9, 50 / 9, None, None, 0.56]
    s2_b = [2 / 3, 29 / 9, 7 / 6, None, None]
    for h, s2 in zip(before.histograms + after.histograms, s2_a + s2_b, strict=True):
        if s2 is not None:
            assert histogram_variance(h) == pytest.approx(s2, rel=1e-12)

    w_a = [4 / 11, 4 / 11, 0.0, 0.0, 3 / 11]
    w_b = [2 / 8, 4 / 8, 2 / 8, 0.0, 0.0]
    m_a = [1.0, 3.0, 1.5, 0.0, 0.8]  # b2 borrows the later mean; b3 is 0 in both
    m_b = [1.0, 2.5, 1.5, 0.0, 0.8]  # b4 borrows the earlier mean
    d = [b - a for a, b in zip(m_a, m_b, strict=True)]
    # variance of each mean, s^2 / units; b2's earlier one borrowed from the later window
    v_a = [4 / 9 / 4, 50 / 9 / 2, 7 / 6 / 2, 0.0, 0.56 / 3]
    v_b = [2 / 3 / 2, 29 / 9 / 4, 7 / 6 / 2, 0.0, 0.56 / 3]
    both = [True, True, False, False, False]
    v_change = [a + b if ok else 0.0 for a, b, ok in zip(v_a, v_b, both, strict=True)]
    units_a, units_b = 9.0, 8.0

    mix = sum((wb - wa) * ma for wa, wb, ma in zip(w_a, w_b, m_a, strict=True))
    var_mix = (cov_quad(w_a, units_a, m_a) + cov_quad(w_b, units_b, m_a)
               + sum((wb - wa) ** 2 * va for wa, wb, va in zip(w_a, w_b, v_a, strict=True)))
    lat = sum(wb * dk for wb, dk in zip(w_b, d, strict=True))
    var_lat = cov_quad(w_b, units_b, d) + sum(wb**2 * vc for wb, vc in zip(w_b, v_change, strict=True))

    got = normal_split(before, after, confidence=0.9, bucket_confidence=0.99)
    assert got.mix == pytest.approx(around(mix, var_mix, z(0.9)), rel=1e-9)
    assert got.latency == pytest.approx(around(lat, var_lat, z(0.9)), rel=1e-9)
    for k in range(5):
        var_k = d[k] ** 2 * w_b[k] * (1 - w_b[k]) / units_b + w_b[k] ** 2 * v_change[k]
        assert got.bucket_latency[k] == pytest.approx(around(w_b[k] * d[k], var_k, z(0.99)), rel=1e-9, abs=1e-12)
        if both[k]:
            assert got.bucket_change[k] == pytest.approx(around(d[k], v_change[k], z(0.99)), rel=1e-9)
        else:
            assert all(math.isnan(x) for x in got.bucket_change[k])
    assert got.method == "normal approximation from histogram counts, 90% intervals (99.00% per bucket)"
    assert normal_split(before, after).method == "normal approximation from histogram counts, 95% intervals"


def test_one_unit_is_an_unknown_variance_and_no_numpy_warning() -> None:
    # b0 holds one observation in one window: its variance is unknown, so is its change. The mix
    # effect weighs the earlier means only: infinite when the earlier b0 is the unknown one (its shares
    # are 1/4 in both windows: 0 times an infinite variance, no warning), finite otherwise.
    for one, four, mix_known in (((1, 3), (2, 6), False), ((2, 6), (1, 3), True)):
        before = HistogramWindow("TTFT", ("b0", "b1"), (hist(one[0], 0, 1.0 * one[0]), hist(one[1], 0, 1.2 * one[1])))
        after = HistogramWindow("TTFT", ("b0", "b1"),
                                (hist(four[0], 0, 1.0 * four[0]), hist(four[1], 0, 1.2 * four[1])))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = normal_split(before, after)
        assert got.bucket_change[0] == (-INF, INF)
        assert all(math.isfinite(x) for x in got.bucket_change[1])
        assert all(math.isfinite(x) for x in got.mix) is mix_known


def test_no_bucket_in_both_windows_has_no_latency_effect_even_with_one_unit() -> None:
    before = HistogramWindow("TTFT", ("b0", "b1"), (hist(4, 0, 4.0), hist(0, 0, 0.0)))
    after = HistogramWindow("TTFT", ("b0", "b1"), (hist(0, 0, 0.0), hist(1, 0, 1.5)))
    got = normal_split(before, after)
    assert got.latency == (0.0, 0.0)
    assert all(math.isnan(x) for ci in got.bucket_change for x in ci)


def test_a_later_window_without_units_has_an_unknown_mix_variance() -> None:
    # three buckets of the same mean (0.1 s): the shares' variance is 0 on paper, a rounding error below
    # 0 in floats (-1.7e-18 with shares 1/7, 2/7, 4/7); with no units it is unknown: infinite
    before = HistogramWindow("TTFT", ("b0", "b1", "b2"), (hist(2, 0, 0.2), hist(2, 0, 0.2), hist(2, 0, 0.2)))
    after = HistogramWindow("TTFT", ("b0", "b1", "b2"), (hist(1, 0, 0.1), hist(2, 0, 0.2), hist(4, 0, 0.4)),
                            requests=(0.0, 0.0, 0.0))
    assert normal_split(before, after).mix == (-INF, INF)


# ------------------------------------------------------------------ the bootstrap from its resamples


def one_resample(n_a: np.ndarray, s_a: np.ndarray, n_b: np.ndarray,
                 s_b: np.ndarray) -> tuple[float, float, list[float], list[float | None]]:
    """mix, latency, per-bucket latency and change of one resample, from the docstring's definitions
    (a bucket empty in one window takes the other's mean; a change needs both)."""
    ta, tb = float(n_a.sum()), float(n_b.sum())
    mix = lat = 0.0
    lats: list[float] = []
    changes: list[float | None] = []
    for na, sa, nb, sb in zip(n_a, s_a, n_b, s_b, strict=True):
        ma = sa / na if na > 0 else (sb / nb if nb > 0 else 0.0)
        mb = sb / nb if nb > 0 else ma
        mix += (nb / tb - na / ta) * ma
        lat += nb / tb * (mb - ma)
        lats.append(nb / tb * (mb - ma))
        changes.append(mb - ma if na > 0 and nb > 0 else None)
    return mix, lat, lats, changes


def percentile_interval(values: list[float], alpha: float) -> tuple[float, float]:
    lo, hi = np.quantile(np.array(values), [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


# b2 has one request before (often drawn 0 times or twice), none... b3 none before: its change is unknown
BEFORE = SampleWindow("TTFT", ("b0", "b1", "b2", "b3"), (
    BucketSamples(tuple(0.1 + 0.01 * i for i in range(12))), BucketSamples(tuple(0.5 + 0.03 * i for i in range(6))),
    BucketSamples((0.9,)), BucketSamples(())))
AFTER = SampleWindow("TTFT", ("b0", "b1", "b2", "b3"), (
    BucketSamples(tuple(0.12 + 0.01 * i for i in range(6))), BucketSamples(tuple(0.6 + 0.03 * i for i in range(9))),
    BucketSamples((1.1, 1.3)), BucketSamples((2.0,))))


@pytest.mark.parametrize(("kwargs", "resamples", "seed", "conf", "bucket_conf"), [
    ({}, 2000, 0, 0.95, 0.95),
    ({"resamples": 300, "seed": 4, "confidence": 0.9, "bucket_confidence": 0.98}, 300, 4, 0.9, 0.98),
])
def test_bootstrap_intervals_are_the_percentiles_of_the_resampled_split(
        kwargs: dict[str, float], resamples: int, seed: int, conf: float, bucket_conf: float) -> None:
    rng = np.random.default_rng(seed)
    n_a, s_a = resampled_counts_sums(BEFORE, resamples, rng)
    n_b, s_b = resampled_counts_sums(AFTER, resamples, rng)
    per = [one_resample(n_a[r], s_a[r], n_b[r], s_b[r]) for r in range(resamples)]
    got = bootstrap_split(BEFORE, AFTER, **kwargs)  # type: ignore[arg-type]
    assert got.mix == pytest.approx(percentile_interval([p[0] for p in per], 1 - conf), rel=1e-9)
    assert got.latency == pytest.approx(percentile_interval([p[1] for p in per], 1 - conf), rel=1e-9)
    for k in range(3):
        lats = [p[2][k] for p in per]
        assert got.bucket_latency[k] == pytest.approx(percentile_interval(lats, 1 - bucket_conf), rel=1e-9, abs=1e-12)
        changes = [c for p in per if (c := p[3][k]) is not None]
        assert len(changes) < resamples or k < 2  # b2 is missing from some resamples of the earlier window
        assert got.bucket_change[k] == pytest.approx(percentile_interval(changes, 1 - bucket_conf), rel=1e-9)
    assert all(math.isnan(x) for x in got.bucket_change[3])  # never in the earlier window


def test_bootstrap_method_line_and_resamples_bounds() -> None:
    assert bootstrap_split(BEFORE, AFTER, resamples=1).method == (
        "bootstrap over requests, 1 resamples, seed 0, 95% percentile intervals")
    assert bootstrap_split(BEFORE, AFTER, resamples=5, seed=3, confidence=0.9, bucket_confidence=0.995).method == (
        "bootstrap over requests, 5 resamples, seed 3, 90% percentile intervals (99.50% per bucket)")
    with pytest.raises(ValueError) as e:
        bootstrap_split(BEFORE, AFTER, resamples=0)
    assert str(e.value) == "resamples must be >= 1, got 0"


def test_resampled_counts_weigh_requests_by_their_tokens_when_none_has_one() -> None:
    # every request has 2 tokens: a resample's count is twice the requests drawn into the bucket
    w = SampleWindow("ITL", ("a", "b"), (BucketSamples((1.0, 1.0, 1.0, 1.0), (2, 2)), BucketSamples((3.0, 3.0), (2,))))
    counts, sums = resampled_counts_sums(w, 200, np.random.default_rng(1))
    assert (counts.sum(axis=1) == 6).all()  # 3 requests drawn, 2 tokens each
    assert set(np.unique(counts[:, 1])) == {0.0, 2.0, 4.0, 6.0}
    assert sums[:, 1].tolist() == (3 * counts[:, 1]).tolist()


def test_z_value_bounds_word_for_word() -> None:
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError) as e:
            z_value(bad)
        assert str(e.value) == f"confidence must be within (0, 1), got {bad}"


# ------------------------------------------------------------------ the normal approximation from per-request sums

L5 = ("a", "b", "c", "d", "e")
# ITL windows, requests of different sizes (so a request's sum moves with its size: P != 0), and every
# edge of the fill-ins: b one observation earlier, e one later, c earlier only, d later only
EARLIER = SampleWindow("ITL", L5, (
    BucketSamples((0.01, 0.02, 0.03, 0.05, 0.04, 0.2), (3, 2, 1)), BucketSamples((0.1,), (1,)),
    BucketSamples((0.3, 0.5, 0.4), (1, 2)), BucketSamples((), ()), BucketSamples((0.07, 0.09, 0.08, 0.02), (2, 0, 2))))
LATER = SampleWindow("ITL", L5, (
    BucketSamples((0.02, 0.03, 0.01, 0.06), (1, 3)), BucketSamples((0.15, 0.25, 0.05), (2, 1)),
    BucketSamples((), ()), BucketSamples((0.6, 0.2, 0.4), (2, 1)), BucketSamples((0.05,), (1,))))


def _split_weighted(wa: np.ndarray, wb: np.ndarray) -> np.ndarray:
    """mix, latency, each bucket's latency term, each bucket's change, with request i weighted w[i]."""
    cols = []
    for w, win in ((wa, EARLIER), (wb, LATER)):
        k, sizes, sums = win.request_table()
        cols.append((np.bincount(k, w * sizes, 5), np.bincount(k, w * sums, 5)))
    (n_a, s_a), (n_b, s_b) = cols
    mix, lat, m_a, m_b = split_arrays(n_a, s_a, n_b, s_b)
    return np.concatenate(([mix.sum(), lat.sum()], lat, m_b - m_a))


def test_delta_split_on_every_fill_in_with_sizes_that_differ() -> None:
    """Each statistic's variance is the sum over both windows' requests of its squared derivative by the
    request's weight (delta_split's docstring: the infinitesimal jackknife), here by central differences
    of the split itself; the intervals are value +- z sd at 90 % (the split) and 99 % (per bucket)."""
    wa, wb = np.ones(EARLIER.units().sum().astype(int)), np.ones(LATER.units().sum().astype(int))
    base = _split_weighted(wa, wb)
    var = central_difference_variance(_split_weighted, wa, wb)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # empty buckets divide 0 by 0 under numpy's errstate: no warning
        got = delta_split(EARLIER, LATER, confidence=0.9, bucket_confidence=0.99)
    sd = np.sqrt(var)
    want = [(base[0], z(0.9) * sd[0]), (base[1], z(0.9) * sd[1]),
            *[(base[2 + b], z(0.99) * sd[2 + b]) for b in range(5)],
            *[(base[7 + b], z(0.99) * sd[7 + b]) for b in (0, 1, 4)]]
    have = [got.mix, got.latency, *got.bucket_latency, *[got.bucket_change[b] for b in (0, 1, 4)]]
    for (centre, half), (low, high) in zip(want, have, strict=True):
        assert (low + high) / 2 == pytest.approx(centre, rel=1e-9, abs=1e-15)
        assert (high - low) / 2 == pytest.approx(half, rel=1e-5, abs=1e-12)
    assert min(sd[[0, 1, 2, 3, 6, 7, 8, 11]]) > 1e-4  # every one of them has a variance to get wrong
    # c and d are seen in one window only: no change of their mean to judge, no latency term
    assert all(math.isnan(x) for b in (2, 3) for x in got.bucket_change[b])
    assert got.bucket_latency[2] == got.bucket_latency[3] == (0.0, 0.0)
    assert got.method == ("normal approximation from per-request sums (delta method, requests as units), 90% "
                          "intervals (99.00% per bucket)")
    assert delta_split(EARLIER, LATER).method == (
        "normal approximation from per-request sums (delta method, requests as units), 95% intervals")


def test_split_intervals_passes_its_levels_and_defaults_on() -> None:
    hb = HistogramWindow("TTFT", ("b0", "b1"), (hist(4, 0, 4.0), hist(6, 0, 7.2)))
    ha = HistogramWindow("TTFT", ("b0", "b1"), (hist(6, 0, 6.6), hist(3, 0, 3.3)))
    assert split_intervals(hb, ha, bucket_confidence=0.99).method == (
        "normal approximation from histogram counts, 95% intervals (99.00% per bucket)")
    assert split_intervals(EARLIER, LATER, "normal", confidence=0.9, bucket_confidence=0.99).method == (
        "normal approximation from per-request sums (delta method, requests as units), 90% intervals "
        "(99.00% per bucket) (as asked)")
    assert split_intervals(EARLIER, LATER, "bootstrap").method == (
        "bootstrap over requests, 2000 resamples, seed 0, 95% percentile intervals (as asked)")
    assert split_intervals(EARLIER, LATER, "bootstrap") == split_intervals(EARLIER, LATER, "bootstrap", 2000, 0)


def test_split_intervals_refusals_word_for_word() -> None:
    hb = HistogramWindow("TTFT", ("b0",), (hist(4, 0, 4.0),))
    one = SampleWindow("TTFT", ("b0",), (BucketSamples((1.0,)),))
    with pytest.raises(ValueError) as e:
        split_intervals(one, one, "jackknife")
    assert str(e.value) == "intervals must be one of auto, bootstrap, normal, got 'jackknife'"
    for before, after in ((hb, hb), (hb, one), (one, hb)):  # a histogram on either side has no bootstrap
        with pytest.raises(ValueError) as e:
            split_intervals(before, after, "bootstrap")
        assert str(e.value) == ("the bootstrap needs per-request samples (bench results); histograms have the "
                                "normal approximation from counts")


def test_split_intervals_over_the_bootstrap_limit_says_why() -> None:
    # 10,001 requests in the later window: one over BOOTSTRAP_MAX_REQUESTS
    small = SampleWindow("TTFT", ("b0",), (BucketSamples((0.5, 0.7)),))
    large = SampleWindow("TTFT", ("b0",), (BucketSamples(np.full(10_001, 0.5)),))
    assert split_intervals(small, large).method == (
        "normal approximation from per-request sums (delta method, requests as units), 95% intervals; not the "
        "bootstrap: a window has 10,001 requests, over 10,000, where the central limit theorem holds and the "
        "bootstrap's draws would cost resamples x requests")
