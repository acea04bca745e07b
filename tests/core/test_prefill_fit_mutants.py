"""core/prefill_fit on data whose fit is worked out by hand: the Theil-Sen slope, intercept and 95 %
interval (Sen 1968, eq. 2.6, as scipy computes it), the subset above FIT_MAX_POINTS, the weighted
least squares over bucket means, every threshold met exactly and every note word for word (issue 21)."""

from __future__ import annotations

import math
import warnings

import pytest

from servelens.core.prefill_fit import FIT_MAX_POINTS, MIN_FIT_REQUESTS, PrefillFit, fit_bucket_means, fit_prefill

LOOSE_NOTE = ("prefill throughput: a loose fit (95% interval {}-{} tokens/s): TTFT here is mostly waiting, "
              "not prefill")

# Two prompt lengths: 10 requests at 0 uncached tokens (TTFT 0.125 s), 10 at 1000 (TTFT 0.125 s plus
# 0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 1, 1, 1.5, 1.5 s). Only pairs across the two lengths have a slope:
# 100 of them, each of the five rises / 1000 twenty times, sorted 0.25 (0-19), 0.5 (20-39), 0.75
# (40-59), 1 (60-79), 1.5 (80-99) ms/token. Median (slots 49, 50): 0.75 ms/token = 1333.3 tokens/s.
# Intercept: median of TTFT - slope * x = twelve values of 0.125 among twenty: 0.125 s.
# Interval: sigma^2 = (20*19*45 - 2 x-ties of 10 (2250 each) - a y-tie of 10 (2250) - five y-ties of 2
# (18 each)) / 18 = 570, 1.96 sigma = 46.8: slots round((100 - 46.8) / 2) - 1 = 26 (0.5 ms/token) and
# round((100 + 46.8) / 2) = 73 (1 ms/token): 1000-2000 tokens/s, exactly LOOSE_FIT apart.
TWO_LENGTHS_X = [0.0] * 10 + [1000.0] * 10
TWO_LENGTHS_Y = [0.125] * 10 + [0.125 + d for d in (0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 1.0, 1.0, 1.5, 1.5)]


def test_two_prompt_lengths_are_enough_and_an_interval_exactly_loose_fit_wide_is_not_loose() -> None:
    fit, note = fit_prefill(TWO_LENGTHS_X, TWO_LENGTHS_Y)
    assert note is None and fit is not None
    assert fit.requests == 20 == MIN_FIT_REQUESTS
    assert fit.throughput_tps == pytest.approx(4000 / 3, rel=1e-12)
    assert fit.throughput_low_tps == pytest.approx(1000, rel=1e-12)
    assert fit.throughput_high_tps == pytest.approx(2000, rel=1e-12)
    assert fit.throughput_low_tps is not None
    assert fit.throughput_high_tps == 2 * fit.throughput_low_tps  # exact: halving a float is exact
    assert fit.intercept_s == pytest.approx(0.125, abs=1e-12)
    assert (fit.x, fit.method) == ("uncached", "theil-sen")


def test_x_is_passed_through() -> None:
    fit, _ = fit_prefill(TWO_LENGTHS_X, TWO_LENGTHS_Y, "isl")
    assert fit is not None and fit.x == "isl"


def test_nineteen_requests_are_one_too_few_and_the_note_says_so() -> None:
    fit, note = fit_prefill(TWO_LENGTHS_X[1:], TWO_LENGTHS_Y[1:])
    assert fit is None
    assert note == ("prefill throughput: 19 request(s) with a TTFT and known prompt tokens, a fit needs at "
                    "least 20")


def test_one_prompt_length_note() -> None:
    fit, note = fit_prefill([1000.0] * 20, [0.1 * i for i in range(20)])
    assert fit is None
    assert note == ("prefill throughput: every request has the same uncached token count: nothing to fit a "
                    "slope to")


def test_a_slope_of_exactly_zero_is_refused() -> None:
    # TTFT the same for every length: every pairwise slope is 0, so is their median
    fit, note = fit_prefill([float(i) for i in range(1, 21)], [0.5] * 20)
    assert fit is None
    assert note == ("prefill throughput: TTFT does not grow with the uncached tokens (the fitted slope is 0 "
                    "s/token): waiting swamps prefill, no throughput can be read")


def test_a_lower_slope_of_zero_is_an_open_interval() -> None:
    # x = 1..20, TTFT 0 for the first ten, 1 s for the last ten: 90 slopes of 0 (pairs on one side) and
    # 100 of 1/d (d = 1..19, min(d, 20 - d) pairs each). Sorted: 0 in slots 0-89, 1/19 at 90, 1/18 at
    # 91-92, 1/17 at 93-95, 1/16 at 96-99, 1/15 at 100-104, 1/14 at 105-110, 1/13 at 111-117, 1/12 at
    # 118-125. Median (slots 94, 95): 1/17. sigma^2 = (17100 - two y-ties of 10) / 18 = 700, 1.96
    # sigma = 51.9: slots 68 (0) and 121 (1/12). Intercept: the median of -x/17 (x <= 10) and
    # 1 - x/17 (x > 10): slots 9 and 10 of the twenty are both -2/17.
    fit, note = fit_prefill([float(i) for i in range(1, 21)], [0.0] * 10 + [1.0] * 10)
    assert fit is not None
    assert fit.throughput_tps == pytest.approx(17, rel=1e-12)
    assert fit.intercept_s == pytest.approx(-2 / 17, rel=1e-12)
    assert fit.throughput_low_tps == pytest.approx(12, rel=1e-12)
    assert fit.throughput_high_tps == math.inf
    assert note == LOOSE_NOTE.format("12", "inf")


def test_an_interval_scipy_cannot_make_reads_zero_to_inf_and_loose() -> None:
    # one request at 0 tokens and 0 s, nineteen at 1000 tokens and 1 s: 19 slopes, all 1 ms/token, but
    # the ties (x and y: groups of 1 and 19) make Sen's sigma^2 negative, and scipy gives a nan interval
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy's sqrt of the negative variance
        fit, note = fit_prefill([0.0] + [1000.0] * 19, [0.0] + [1.0] * 19)
    assert fit is not None
    assert fit.throughput_tps == pytest.approx(1000, rel=1e-12)
    assert (fit.throughput_low_tps, fit.throughput_high_tps) == (0.0, math.inf)
    assert note == LOOSE_NOTE.format("0", "inf")


def test_above_the_point_cap_every_kth_request_in_order_is_fitted() -> None:
    # 3999 requests, x = 0..3998: the 2000 kept are linspace(0, 3998, 2000), the even indices exactly.
    # Even requests lie on TTFT = 0.5 + x / 1024 (exact in binary), odd ones twice as steep: the subset
    # is an exact line (slope, interval and intercept exactly), the whole set would not be.
    n = 2 * FIT_MAX_POINTS - 1
    xs = [float(i) for i in range(n)]
    ys = [0.5 + i / 1024 if i % 2 == 0 else 0.5 + i / 512 for i in range(n)]
    fit, note = fit_prefill(xs, ys)
    assert note is None
    assert fit == PrefillFit(n, 1024.0, 1024.0, 1024.0, 0.5, "uncached", "theil-sen")


def test_bucket_means_are_weighted_by_request_counts() -> None:
    # mean TTFT 0, 1, 3 s at 0, 1000, 2000 tokens, 1, 1, 2 requests. Weighted normal equations:
    # 4a + 5000b = 7, 5000a + 9e6 b = 13000 -> b = 17/11000 s/token, a = -2/11 s
    # (unweighted it would be b = 1.5/1000, a = -1/6).
    fit, note = fit_bucket_means([0.0, 1000.0, 2000.0], [0.0, 1.0, 3.0], [1, 1, 2])
    assert note is None and fit is not None
    assert fit.throughput_tps == pytest.approx(11000 / 17, rel=1e-9)
    assert fit.intercept_s == pytest.approx(-2 / 11, rel=1e-9)
    assert (fit.requests, fit.throughput_low_tps, fit.throughput_high_tps) == (3, None, None)
    assert (fit.x, fit.method) == ("uncached", "wls-bucket-means")
    isl, _ = fit_bucket_means([0.0, 1000.0, 2000.0], [0.0, 1.0, 3.0], [1, 1, 2], "isl")
    assert isl is not None and isl.x == "isl"


def test_buckets_without_requests_are_left_out_and_counted_out() -> None:
    # the empty bucket's mean (and its zero weight) is not a point: three buckets fitted of four
    fit, note = fit_bucket_means([0.0, 500.0, 1000.0, 2000.0], [0.0, 9.0, 1.0, 3.0], [1, 0, 1, 2])
    assert note is None and fit is not None
    assert fit.requests == 3
    assert fit.throughput_tps == pytest.approx(11000 / 17, rel=1e-9)
    fit, note = fit_bucket_means([0.0, 1000.0, 2000.0], [0.0, 1.0, 3.0], [1, 0, 2])
    assert fit is None
    assert note == "prefill throughput: 2 bucket(s) with requests, a fit over bucket means needs 3"


def test_bucket_means_of_different_lengths_are_an_error() -> None:
    with pytest.raises(ValueError):
        fit_bucket_means([0.0, 1000.0, 2000.0], [0.0, 1.0, 3.0], [1, 1])
    with pytest.raises(ValueError):
        fit_bucket_means([0.0, 1000.0, 2000.0, 3000.0], [0.0, 1.0, 3.0, 4.0], [1, 1, 1])


def test_bucket_means_less_than_a_token_apart_are_still_fitted() -> None:
    unc = [100.0, 100.25, 100.5]
    fit, note = fit_bucket_means(unc, [0.2 + u / 1000 for u in unc], [1, 1, 1])
    assert note is None and fit is not None
    assert fit.throughput_tps == pytest.approx(1000, rel=1e-6)


def test_bucket_means_notes() -> None:
    fit, note = fit_bucket_means([100.0] * 3, [0.2, 0.3, 0.4], [1, 1, 1])
    assert fit is None
    assert note == "prefill throughput: every bucket has the same mean uncached tokens: nothing to fit"
    # a flat TTFT of 0: the weighted fit's slope is exactly 0
    fit, note = fit_bucket_means([0.0, 1000.0, 2000.0], [0.0, 0.0, 0.0], [1, 1, 2])
    assert fit is None
    assert note == ("prefill throughput: mean TTFT does not grow with the buckets' uncached tokens: waiting "
                    "swamps prefill, no throughput can be read")
