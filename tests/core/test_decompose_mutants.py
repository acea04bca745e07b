"""The decomposition on windows small enough to work out by hand: every field of the explanation,
the thresholds at their exact values, the texts of the limitations and errors (issue 21)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from servelens.core.decompose import (
    ONLY_BEFORE,
    SLOWER,
    TOO_FEW,
    UNCHANGED,
    BucketChange,
    counterfactual,
    decide_verdict,
    excludes_zero,
    explain,
    observed_quantiles,
)
from servelens.core.summary import CumulativeHistogram
from servelens.core.windows import BucketSamples, ExplainError, HistogramWindow, Mix, SampleWindow
from servelens.testing.latency_windows import EARLY_MIX, LATE_MIX, binned, sample_window

L2 = ("0-512", "513+")
L3 = ("0-512", "513-1024", "1025+")


def window(labels: tuple[str, ...], *buckets: tuple[float, ...], unbucketed: int = 0) -> SampleWindow:
    return SampleWindow("TTFT", labels, tuple(BucketSamples(b) for b in buckets), unbucketed)


def hist_window(*buckets: tuple[tuple[float, float], ...], sums: tuple[float, ...]) -> HistogramWindow:
    return HistogramWindow("TTFT", L2, tuple(CumulativeHistogram(b, s) for b, s in zip(buckets, sums, strict=True)))


def test_every_field_of_a_hand_computed_explanation() -> None:
    # earlier: 5 x 1 s, 5 x 2 s, one 4 s request in 1025+ (11); later: 5 x 1 s, 5 x 3 s, none in 1025+ (10)
    a = window(L3, (1.0,) * 5, (2.0,) * 5, (4.0,), unbucketed=2)
    b = window(L3, (1.0,) * 5, (3.0,) * 5, (), unbucketed=3)
    e = explain(a, b, quantiles=(0.5, 0.9))
    assert (e.metric, e.labels, e.exact, e.confidence) == ("TTFT", L3, True, 0.95)
    assert (e.count_before, e.count_after, e.unbucketed_before, e.unbucketed_after) == (11.0, 10.0, 2.0, 3.0)
    assert (e.mean_before_s, e.mean_after_s) == pytest.approx((19 / 11, 2.0))
    # wA = (5, 5, 1) / 11, wB = (1/2, 1/2, 0), mA = (1, 2, 4), mB = (1, 3, 4 filled in)
    assert [c.mix_effect_s for c in e.buckets] == pytest.approx([1 / 22, 2 / 22, -8 / 22])
    assert [c.latency_effect_s for c in e.buckets] == pytest.approx([0.0, 0.5, 0.0])
    assert (e.mix_effect_s, e.latency_effect_s, e.interaction_s) == pytest.approx((-5 / 22, 0.5, 1 / 22))
    # the later latency at the earlier mix, 1025+ at its earlier 4 s: 5/11 * 1 + 5/11 * 3 + 1/11 * 4
    assert e.counterfactual_mean_s == pytest.approx(24 / 11)
    # inverted-CDF quantiles: earlier 1 1 1 1 1 2 2 2 2 2 4; later 1 x5, 3 x5; counterfactual 1 (5/11) 3 (5/11) 4
    assert [(s.q, s.before_s, s.after_s, s.counterfactual_s) for s in e.quantiles] == [
        (0.5, 2.0, 1.0, 3.0), (0.9, 2.0, 3.0, 3.0)]
    assert [(c.label, c.count_before, c.count_after) for c in e.buckets] == [
        ("0-512", 5.0, 5.0), ("513-1024", 5.0, 5.0), ("1025+", 1.0, 0.0)]
    assert [(c.mean_before_s, c.mean_after_s) for c in e.buckets] == [(1.0, 1.0), (2.0, 3.0), (4.0, None)]
    assert [c.share_before for c in e.buckets] == pytest.approx([5 / 11, 5 / 11, 1 / 11])
    # five requests each side is enough to be judged; constant latencies: the bootstrap interval is the change
    assert [c.change for c in e.buckets] == [UNCHANGED, SLOWER, ONLY_BEFORE]
    assert [c.mean_change_ci_s for c in e.buckets] == [(0.0, 0.0), (1.0, 1.0), None]
    assert [(c.quantiles_before_s, c.quantiles_after_s) for c in e.buckets] == [
        ((1.0, 1.0), (1.0, 1.0)), ((2.0, 2.0), (3.0, 3.0)), ((4.0, 4.0), (None, None))]
    assert e.limitations == (
        "bucket 1025+ has no TTFT observations in the later window: its latency change is unknown, so all of its "
        "effect counts as mix and the counterfactual uses its earlier latency",
        "2 TTFT observations in no ISL bucket in the earlier window are left out",
        "3 TTFT observations in no ISL bucket in the later window are left out",
    )
    # defaults: 2000 resamples, seed 0; two buckets seen in both windows: Bonferroni 1 - 0.05 / 2 per bucket
    assert e.uncertainty == ("bootstrap over requests, 2000 resamples, seed 0, 95% percentile intervals "
                             "(97.50% per bucket); the bootstrap, each window having at most 10,000 requests")
    with pytest.raises(KeyError) as err:
        e.quantile(0.95)
    assert err.value.args == ("quantile 0.95 was not computed (have 0.5, 0.9)",)


def test_a_bucket_only_in_the_later_window_and_too_few_requests_are_stated() -> None:
    a = window(L2, (1.0,) * 3, ())
    b = window(L2, (1.0,) * 3, (2.0,))
    e = explain(a, b, resamples=50)
    assert e.limitations == (
        "bucket 0-512 has fewer than 5 requests in a window: its latency change is not judged",
        "bucket 513+ has no TTFT observations in the earlier window: its latency change is unknown, so all of its "
        "effect counts as mix",
    )
    assert e.buckets[0].change == TOO_FEW
    assert e.buckets[1].mean_change_ci_s is None and e.buckets[1].quantiles_before_s == (None, None, None)
    # one bucket in both windows: the per-bucket level is the overall one (no Bonferroni suffix)
    assert e.uncertainty.split(";")[0] == "bootstrap over requests, 50 resamples, seed 0, 95% percentile intervals"


def test_buckets_of_one_observation_count_as_seen() -> None:
    # one request per window in 0-512: it is seen in both (judged for Bonferroni, has a mean and a change interval)
    a = window(L2, (1.0,), (2.0,) * 5)
    b = window(L2, (1.5,), (2.0,) * 5)
    e = explain(a, b, resamples=50)
    assert e.uncertainty.split(";")[0].endswith("95% percentile intervals (97.50% per bucket)")
    first = e.buckets[0]
    assert (first.mean_before_s, first.mean_after_s, first.change) == (1.0, 1.5, TOO_FEW)
    assert first.mean_change_ci_s == (0.5, 0.5)
    assert (first.quantiles_before_s, first.quantiles_after_s) == ((1.0,) * 3, (1.5,) * 3)


def test_a_bucket_in_neither_window_is_not_stated() -> None:
    a = window(L3, (1.0,) * 5, (2.0,) * 5, ())
    b = window(L3, (1.0,) * 5, (2.0,) * 5, ())
    e = explain(a, b, resamples=50)
    assert e.limitations == ()
    assert e.uncertainty.split(";")[0].endswith("(97.50% per bucket)")  # the empty bucket is not judged


def test_histogram_windows_use_the_normal_split_with_bonferroni() -> None:
    a, b = binned(sample_window(1, EARLY_MIX, 300)), binned(sample_window(2, LATE_MIX, 300))
    e = explain(a, b, confidence=0.9)
    assert e.uncertainty == "normal approximation from histogram counts, 90% intervals (98.57% per bucket)"
    assert not e.exact and e.confidence == 0.9


def test_an_interval_touching_zero_does_not_exclude_it() -> None:
    assert not excludes_zero((0.0, 1.0)) and not excludes_zero((-1.0, 0.0)) and not excludes_zero(None)
    assert excludes_zero((1e-300, 1.0)) and excludes_zero((-1.0, -1e-300))
    # 0-512: one later request of 2 s among 1 s ones; 513+: one of 0 s. Resamples without it (about a third)
    # put the change interval's end at exactly 0: no significant change either way
    a = window(L2, (1.0,) * 5, (1.0,) * 5)
    b = window(L2, (1.0,) * 4 + (2.0,), (1.0,) * 4 + (0.0,))
    e = explain(a, b, resamples=400)
    (low0, high0), (low1, high1) = (c.mean_change_ci_s or (math.nan, math.nan) for c in e.buckets)
    assert low0 == 0.0 < high0 and low1 < 0.0 == high1
    assert [c.change for c in e.buckets] == [UNCHANGED, UNCHANGED]


def test_interaction_note_threshold_is_strict() -> None:
    # earlier: 2 x 1 s, 2 x 2 s; later: one 2 s in 0-512, 3 x 2 s: mix 0.25, latency 0.25, interaction -0.25
    a, b = window(L2, (1.0, 1.0), (2.0, 2.0)), window(L2, (2.0,), (2.0, 2.0, 2.0))

    def noted(min_share: float) -> bool:
        e = explain(a, b, resamples=50, min_share=min_share)
        assert (e.mix_effect_s, e.latency_effect_s, e.interaction_s) == (0.25, 0.25, -0.25)
        return any("also changed share" in line for line in e.limitations)

    assert not noted(0.5)  # |interaction| = 0.5 x (|mix| + |latency|) exactly: not over it
    assert noted(0.4)


def test_explain_passes_min_share_to_the_verdict() -> None:
    # the shift-and-slowdown case of test_decompose: latency is about 22 % of |mix| + |latency|
    a, b = sample_window(1, EARLY_MIX, 2000), sample_window(51, LATE_MIX, 2000, {4: 3.0})
    assert explain(a, b, resamples=300, seed=1).verdict == "both"
    assert explain(a, b, resamples=300, seed=1, min_share=0.3).verdict == "mix"


@pytest.mark.parametrize(
    ("mix", "lat", "min_share", "want"),
    [
        (0.25, 0.75, 0.25, "both"),  # each exactly at the threshold: counts
        (0.75, 0.25, 0.25, "both"),
        (0.3, 3.7, 0.1, "latency"),  # 0.3 < 0.1 x 4
        (1.0, 0.1, 0.1, "mix"),  # 0.1 < 0.1 x 1.1
        (1.0, 0.5, 0.5, "mix"),  # min_share 0.5 is allowed
    ],
)
def test_verdict_thresholds(mix: float, lat: float, min_share: float, want: str) -> None:
    ci = (1.0, 2.0)  # both intervals exclude 0
    assert decide_verdict(mix, ci, lat, ci, min_share) == want


def test_verdict_min_share_message() -> None:
    with pytest.raises(ValueError) as err:
        decide_verdict(1.0, (0.8, 1.2), 0.05, (0.03, 0.07), min_share=0.7)
    assert str(err.value) == "min_share must be within [0, 0.5], got 0.7"


@pytest.mark.parametrize("kind", ["samples", "histograms"])
def test_counterfactual_returns_the_mix_aligned_and_the_quantiles_asked(kind: str) -> None:
    w = window(L2, (1.0, 1.0), (3.0, 3.0))
    x = w if kind == "samples" else binned(w, (2.0, 4.0))
    cf = counterfactual(x, Mix(("513+", "0-512"), (3.0, 1.0)), quantiles=(0.5, 0.9))
    assert cf.mix == Mix(L2, (0.25, 0.75))
    assert cf.quantiles == (0.5, 0.9)
    assert cf.mean_s == pytest.approx(2.5)
    if kind == "histograms":
        assert cf.histogram is not None  # scaled to the window's 4 observations: sum = count x mean
        assert (cf.histogram.count, cf.histogram.sum) == pytest.approx((4.0, 10.0))
        assert [c for _, c in cf.histogram.buckets] == pytest.approx([1.0, 4.0, 4.0])


def test_counterfactual_skips_zero_shares_and_uses_single_observations() -> None:
    w = window(L2, (0.1,), (0.3, 0.5))
    assert counterfactual(w, Mix(L2, (0.0, 1.0))).mean_s == pytest.approx(0.4)  # a zero share first
    assert counterfactual(w, Mix(L2, (0.5, 0.5))).mean_s == pytest.approx(0.25)  # one observation is data
    h = hist_window(((1.0, 1.0), (math.inf, 1.0)), ((1.0, 0.0), (math.inf, 0.0)), sums=(0.5, 0.0))
    back = hist_window(((1.0, 0.0), (math.inf, 0.0)), ((1.0, 2.0), (math.inf, 2.0)), sums=(0.0, 1.5))
    cf = counterfactual(h, Mix(L2, (0.5, 0.5)), fallback=back)
    assert cf.mean_s == pytest.approx(0.5 * 0.5 + 0.5 * 0.75)
    assert cf.histogram is not None and cf.histogram.sum == pytest.approx(cf.mean_s * 1.0)


def test_counterfactual_without_data_in_either_window_is_refused() -> None:
    w = window(L2, (0.1, 0.2), ())
    for fallback in (None, window(L2, (0.4,), ())):
        with pytest.raises(ExplainError) as err:
            counterfactual(w, Mix(L2, (0.5, 0.5)), fallback=fallback)
        assert str(err.value) == "bucket 513+ has a 50.0% share in the mix but no TTFT observations to weight"


def test_observed_quantiles_of_one_bucket() -> None:
    w = window(L2, (1.0, 2.0), (5.0, 6.0, 7.0))
    assert observed_quantiles(w, (0.5, 1.0)) == (5.0, 7.0)
    assert observed_quantiles(w, (0.5, 1.0), 0) == (1.0, 2.0)
    assert observed_quantiles(window(L2, (1.0,), ()), (0.5,), 1) == (None,)  # empty: None, not NaN
    h = binned(w, (2.0, 4.0, 8.0))
    assert observed_quantiles(h, (0.5,), 0) == (1.0,)  # the first le bucket (0, 2], interpolated
    assert observed_quantiles(h, (0.5,), 1) == (6.0,)  # the third (4, 8], half of it


INF = math.inf


def cum(*counts: float) -> tuple[tuple[float, float], ...]:
    """Cumulative counts at the edges 1 s, 2 s and +Inf."""
    return tuple(zip((1.0, 2.0, INF), counts, strict=True))


def test_histogram_windows_bucket_quantiles_and_le_ranges_by_hand() -> None:
    """Earlier: 4 observations in (0, 1] (sum 2 s) and 4 in (1, 2] (sum 6 s); later: 2 in (0, 1] (1 s) and 6 in
    (1, 2] (9 s). histogram_quantile interpolates linearly in the le bucket holding the rank q * count:
    per bucket p50 and p90 are 0.5 and 0.9 s (bucket 0-512), 1.5 and 1.9 s (513+) in both windows; all
    requests: earlier ranks 4 and 7.2 of 8 -> 1.0 s and 1 + 3.2/4 = 1.8 s, later 1 + 2/6 and 1 + 5.2/6 s;
    at the earlier mix (later buckets scaled to 4 and 4 of 8: cumulative 4, 8, 8) 1.0 and 1.8 s."""
    a = hist_window(cum(4, 4, 4), cum(0, 4, 4), sums=(2.0, 6.0))
    b = hist_window(cum(2, 2, 2), cum(0, 6, 6), sums=(1.0, 9.0))
    e = explain(a, b, quantiles=(0.5, 0.9))
    assert [(x.q, x.before_s, x.after_s, x.counterfactual_s) for x in e.quantiles] == [
        (0.5, 1.0, pytest.approx(1 + 2 / 6), 1.0),
        (0.9, pytest.approx(1.8), pytest.approx(1 + 5.2 / 6), pytest.approx(1.8))]
    assert [(c.quantiles_before_s, c.quantiles_after_s) for c in e.buckets] == [
        ((0.5, pytest.approx(0.9)), (0.5, pytest.approx(0.9))),
        ((1.5, pytest.approx(1.9)), (1.5, pytest.approx(1.9)))]
    # each bucket's observations in one le bucket: its quantiles are interpolations there
    assert [(c.le_range_before_s, c.le_range_after_s) for c in e.buckets] == [((0.0, 1.0), (0.0, 1.0)),
                                                                             ((1.0, 2.0), (1.0, 2.0))]
    assert all(c.interpolated() for c in e.buckets)
    # all requests: two le buckets in each window and at the earlier mix
    assert (e.le_range_before_s, e.le_range_after_s, e.le_range_counterfactual_s) == (None, None, None)


def test_histogram_windows_whole_windows_in_one_le_bucket() -> None:
    """Earlier: every observation in (1, 2] (4 and 4, sums 5 and 7 s); later: every one in (0, 1] (2 and 6,
    sums 1 and 3 s): at the earlier mix too, the later buckets' observations are all in (0, 1]. A bucket
    with observations in one window only names its range there."""
    a = hist_window(cum(0, 4, 4), cum(0, 4, 4), sums=(5.0, 7.0))
    b = hist_window(cum(2, 2, 2), cum(6, 6, 6), sums=(1.0, 3.0))
    e = explain(a, b, quantiles=(0.5,))
    assert (e.le_range_before_s, e.le_range_after_s, e.le_range_counterfactual_s) == ((1.0, 2.0), (0.0, 1.0),
                                                                                      (0.0, 1.0))
    assert [(c.le_range_before_s, c.le_range_after_s) for c in e.buckets] == [((1.0, 2.0), (0.0, 1.0))] * 2
    gone = hist_window(cum(2, 2, 2), cum(0, 0, 0), sums=(1.0, 0.0))
    e = explain(a, gone, quantiles=(0.5,))
    assert [(c.le_range_before_s, c.le_range_after_s) for c in e.buckets] == [((1.0, 2.0), (0.0, 1.0)),
                                                                             ((1.0, 2.0), None)]
    assert e.buckets[1].quantiles_after_s == (None,) and e.buckets[1].quantiles_before_s == (1.5,)


def test_bucket_interpolated_in_either_window() -> None:
    e = explain(window(L2, (1.0,) * 5, (2.0,) * 5), window(L2, (1.0,) * 5, (2.0,) * 5), resamples=20)
    plain = e.buckets[0]
    assert plain.le_range_before_s is None and plain.le_range_after_s is None and not plain.interpolated()
    assert replace(plain, le_range_before_s=(0.0, 1.0)).interpolated()
    assert replace(plain, le_range_after_s=(0.0, 1.0)).interpolated()
    assert replace(plain, le_range_before_s=(0.0, 1.0), le_range_after_s=(1.0, 2.0)).interpolated()
    assert isinstance(plain, BucketChange)
