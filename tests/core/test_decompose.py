"""The shift-share split, the counterfactual and the verdict, on synthetic windows whose truth is known."""

import math
import re
from dataclasses import replace

import numpy as np
import pytest

from servelens.core.decompose import (
    FASTER,
    NO_DATA,
    ONLY_AFTER,
    ONLY_BEFORE,
    SLOWER,
    TOO_FEW,
    UNCHANGED,
    counterfactual,
    decide_verdict,
    explain,
    observed_quantiles,
)
from servelens.core.quantiles import bucket_bounds, weighted_quantile
from servelens.core.summary import CumulativeHistogram
from servelens.core.units import format_in
from servelens.core.windows import BucketSamples, ExplainError, HistogramWindow, Mix, SampleWindow, Window, window_mix
from servelens.testing.latency_windows import BUCKETS, EARLY_MIX, LATE_MIX, binned, sample_window, true_split

KINDS = ("samples", "histograms")
N = 2000


def as_kind(w: SampleWindow, kind: str) -> Window:
    return w if kind == "samples" else binned(w)


def tiny(*buckets: tuple[float, ...]) -> SampleWindow:
    return SampleWindow("TTFT", ("0-512", "513+"), tuple(BucketSamples(b) for b in buckets))


def test_shift_share_known_answer() -> None:
    # earlier: shares 1/2, 1/2, means 1 and 3 (mean 2); later: shares 1/4, 3/4, means 2 and 3 (mean 2.75)
    a, b = tiny((1.0,) * 6, (3.0,) * 6), tiny((2.0,) * 4, (3.0,) * 12)
    for x, y in ((a, b), (binned(a, (1.5, 2.5)), binned(b, (1.5, 2.5)))):
        e = explain(x, y, resamples=200)
        assert (e.mean_before_s, e.mean_after_s) == pytest.approx((2.0, 2.75))
        assert e.mix_effect_s == pytest.approx(0.5)  # (1/4 - 1/2) * 1 + (3/4 - 1/2) * 3
        assert e.latency_effect_s == pytest.approx(0.25)  # 1/4 * (2 - 1) + 3/4 * 0
        assert [c.mix_effect_s for c in e.buckets] == pytest.approx([-0.25, 0.75])
        assert [c.latency_effect_s for c in e.buckets] == pytest.approx([0.25, 0.0])
        assert e.interaction_s == pytest.approx(-0.25)
        assert e.counterfactual_mean_s == pytest.approx(2.5)  # 1/2 * 2 + 1/2 * 3
        assert [c.share_before for c in e.buckets] == pytest.approx([0.5, 0.5])
        assert [c.share_after for c in e.buckets] == pytest.approx([0.25, 0.75])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_split_is_exact_and_counterfactual_mean_consistent(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = sample_window(seed, rng.dirichlet(np.ones(7)) * 100, 500)
    b = sample_window(seed + 100, rng.dirichlet(np.ones(7)) * 100, 700, {2: 1.5, 6: 0.5})
    for x, y in ((a, b), (binned(a), binned(b))):
        e = explain(x, y, resamples=50)
        assert e.mix_effect_s + e.latency_effect_s == pytest.approx(e.mean_after_s - e.mean_before_s, abs=1e-12)
        assert sum(c.mix_effect_s for c in e.buckets) == pytest.approx(e.mix_effect_s, abs=1e-12)
        assert sum(c.latency_effect_s for c in e.buckets) == pytest.approx(e.latency_effect_s, abs=1e-12)
        # the counterfactual's latency term is the split's, at the earlier mix: they differ by the interaction
        assert e.counterfactual_mean_s - e.mean_before_s == pytest.approx(e.latency_effect_s - e.interaction_s)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_pure_mix_shift_is_mix_with_no_bucket_changed(kind: str, seed: int) -> None:
    a = as_kind(sample_window(seed, EARLY_MIX, N), kind)
    b = as_kind(sample_window(seed + 50, LATE_MIX, N), kind)
    e = explain(a, b, seed=seed)
    assert e.verdict == "mix"
    assert e.mix_effect_ci_s[0] > 0 and e.latency_effect_ci_s[0] < 0 < e.latency_effect_ci_s[1]
    assert [c.change for c in e.buckets] == [UNCHANGED] * 7 and e.ranked() == ()
    true_mix, true_lat = true_split(EARLY_MIX, LATE_MIX)
    assert e.mix_effect_ci_s[0] <= true_mix <= e.mix_effect_ci_s[1] and true_lat == 0
    # at the earlier mix the later window reads like the earlier one, not like itself
    p95 = e.quantile(0.95)
    assert p95.before_s is not None and p95.after_s is not None and p95.counterfactual_s is not None
    assert abs(p95.counterfactual_s - p95.before_s) < 0.2 * (p95.after_s - p95.before_s)
    assert e.exact is (kind == "samples") and e.limitations == ()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_pure_slowdown_is_latency_in_the_slowed_buckets(kind: str, seed: int) -> None:
    slow = {4: 2.0, 5: 2.0}  # prefill cost doubled for 4097-16384
    a = as_kind(sample_window(seed, EARLY_MIX, N), kind)
    b = as_kind(sample_window(seed + 50, EARLY_MIX, N, slow), kind)
    e = explain(a, b, seed=seed)
    assert e.verdict == "latency"
    assert {c.label for c in e.ranked()} == {"4097-8192", "8193-16384"}
    assert all(c.change == SLOWER for c in e.ranked())
    assert [c.change for c in e.buckets if c.label not in ("4097-8192", "8193-16384")] == [UNCHANGED] * 5
    _, true_lat = true_split(EARLY_MIX, EARLY_MIX, slow)
    assert e.latency_effect_ci_s[0] <= true_lat <= e.latency_effect_ci_s[1]
    # the mix did not move, so the counterfactual is (nearly) the later window itself
    p95 = e.quantile(0.95)
    assert p95.counterfactual_s == pytest.approx(p95.after_s, rel=0.1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_shift_and_slowdown_together_are_apportioned(kind: str, seed: int) -> None:
    slow = {4: 3.0}
    a = as_kind(sample_window(seed, EARLY_MIX, N), kind)
    b = as_kind(sample_window(seed + 50, LATE_MIX, N, slow), kind)
    e = explain(a, b, seed=seed)
    assert e.verdict == "both"
    assert [c.label for c in e.ranked()][:1] == ["4097-8192"] and e.ranked()[0].change == SLOWER
    true_mix, true_lat = true_split(EARLY_MIX, LATE_MIX, slow)
    assert e.mix_effect_ci_s[0] <= true_mix <= e.mix_effect_ci_s[1]
    assert e.latency_effect_ci_s[0] <= true_lat <= e.latency_effect_ci_s[1]
    assert e.mix_effect_s > 2 * e.latency_effect_s > 0  # truth: about 1.04 s and 0.29 s


EDGE_SETS = {
    "dynamo": (0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1, 2.2, 4.7, 10, 22),
    "coarse": (0.0, 0.5, 2.0, 8.0),
    "short": (0.05, 0.1, 0.2),  # p95+ lands past the last finite edge
}


@pytest.mark.parametrize("edges", list(EDGE_SETS))
@pytest.mark.parametrize("seed", [4, 5, 6])
def test_counterfactual_histogram_quantile_within_its_le_bucket_of_the_exact_one(edges: str, seed: int) -> None:
    le = EDGE_SETS[edges]
    rng = np.random.default_rng(seed)
    b = sample_window(seed, rng.dirichlet(np.ones(7)) * 100, 3000, {3: 1.7})
    hb = binned(b, le)
    mix = Mix(BUCKETS.labels, tuple(rng.dirichlet(np.ones(7))))
    qs = (0.1, 0.5, 0.9, 0.95, 0.99)
    exact, approx = counterfactual(b, mix, qs), counterfactual(hb, mix, qs)
    # exact: the weighted quantile of the reweighted samples
    values = [v for x in b.buckets for v in x.values_s]
    weights = [s / x.count for s, x in zip(mix.shares, b.buckets, strict=True) for _ in x.values_s]
    for q, x, h in zip(qs, exact.quantiles_s, approx.quantiles_s, strict=True):
        assert x == weighted_quantile(values, weights, q)
        assert x is not None and h is not None
        lo, hi = bucket_bounds(x, le)
        if math.isinf(hi):
            assert h == le[-1] <= x  # past the last edge Prometheus returns that edge
        else:
            assert lo <= h <= hi, (q, x, h, lo, hi)
    # the mixed histogram itself is exact: its cumulative share at every edge is the reweighted one
    assert approx.histogram is not None
    total = approx.histogram.count
    for edge, c in approx.histogram.buckets[:-1]:
        assert c / total == pytest.approx(sum(w for v, w in zip(values, weights, strict=True) if v <= edge), abs=1e-9)
    assert approx.mean_s == pytest.approx(exact.mean_s, rel=1e-12)
    assert total == pytest.approx(hb.counts().sum())


def test_counterfactual_at_the_own_mix_is_the_observed_figure() -> None:
    w = sample_window(7, LATE_MIX, 800)
    qs = (0.5, 0.95, 0.99)
    got = counterfactual(w, window_mix(w), qs)
    assert got.quantiles_s == observed_quantiles(w, qs)
    values = np.concatenate([x.values_s for x in w.buckets])
    assert got.mean_s == pytest.approx(values.mean())
    assert observed_quantiles(w, qs) == tuple(np.quantile(values, qs, method="inverted_cdf"))
    h = binned(w)
    assert counterfactual(h, window_mix(h), qs).quantiles_s == pytest.approx(observed_quantiles(h, qs))


def test_counterfactual_errors_are_one_line() -> None:
    w = tiny((0.1, 0.2), ())
    with pytest.raises(ExplainError) as e:
        counterfactual(w, Mix(("0-512", "513+"), (0.5, 0.5)))
    assert "513+" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ExplainError) as e:
        counterfactual(w, Mix(("0-1024", "1025+"), (0.5, 0.5)))
    assert "reference mix does not match" in str(e.value)
    assert counterfactual(w, Mix(("0-512", "513+"), (1.0, 0.0))).mean_s == pytest.approx(0.15)
    assert counterfactual(w, Mix(("0-512", "513+"), (0.5, 0.5)), fallback=tiny((1.0,), (0.3,))).mean_s == \
        pytest.approx(0.5 * 0.15 + 0.5 * 0.3)


@pytest.mark.parametrize("kind", KINDS)
def test_bucket_seen_in_one_window_is_mix_only_and_stated(kind: str) -> None:
    a = sample_window(8, EARLY_MIX, 1000)
    b = sample_window(9, LATE_MIX, 1000)
    # the earlier window never saw 16385+; the later one never saw 0-512
    a = replace(a, buckets=(*a.buckets[:6], BucketSamples(())))
    b = replace(b, buckets=(BucketSamples(()), *b.buckets[1:]))
    x, y = as_kind(a, kind), as_kind(b, kind)
    e = explain(x, y, resamples=500)
    first, last = e.buckets[0], e.buckets[6]
    assert (first.change, last.change) == (ONLY_BEFORE, ONLY_AFTER)
    assert first.latency_effect_s == 0 and last.latency_effect_s == 0
    assert last.mean_after_s is not None
    assert last.mix_effect_s == pytest.approx(last.share_after * last.mean_after_s)  # all of its effect is mix
    assert first.mean_after_s is None and last.mean_before_s is None and last.mean_change_ci_s is None
    assert e.mix_effect_s + e.latency_effect_s == pytest.approx(e.mean_after_s - e.mean_before_s)
    text = " | ".join(e.limitations)
    assert "bucket 16385+ has no TTFT observations in the earlier window" in text
    assert "bucket 0-512 has no TTFT observations in the later window" in text and "counterfactual" in text
    assert all("\n" not in line for line in e.limitations)
    # the counterfactual borrows 0-512's earlier latency rather than dropping its share
    m = [c.mean_after_s if c.mean_after_s is not None else c.mean_before_s or 0.0 for c in e.buckets]
    want = math.fsum(c.share_before * v for c, v in zip(e.buckets, m, strict=True))
    assert e.counterfactual_mean_s == pytest.approx(want)


@pytest.mark.parametrize("kind", KINDS)
def test_bucket_empty_in_both_windows_has_no_data(kind: str) -> None:
    """It was labelled "only in the later window" (table: "later only")."""
    a = sample_window(8, EARLY_MIX, 1000)
    b = sample_window(9, EARLY_MIX, 1000)
    a, b = (replace(w, buckets=(*w.buckets[:6], BucketSamples(()))) for w in (a, b))
    e = explain(as_kind(a, kind), as_kind(b, kind), resamples=200)
    top = e.buckets[6]
    assert (top.label, top.change, top.count_before, top.count_after) == ("16385+", NO_DATA, 0.0, 0.0)
    assert (top.mean_before_s, top.mean_after_s, top.mix_effect_s, top.latency_effect_s) == (None, None, 0.0, 0.0)
    assert not any("16385+" in note for note in e.limitations)  # nothing to say of a bucket nobody used


def test_too_few_requests_and_unbucketed_are_stated() -> None:
    a = sample_window(10, EARLY_MIX, 1000)
    b = sample_window(11, EARLY_MIX, 1000, {6: 5.0})
    b = replace(b, buckets=(*b.buckets[:6], BucketSamples(b.buckets[6].values_s[:3])), unbucketed=4)
    e = explain(a, b, resamples=300)
    assert e.buckets[6].change == TOO_FEW and e.unbucketed_after == 4
    text = " | ".join(e.limitations)
    assert "bucket 16385+ has fewer than 5 requests" in text and "4 TTFT observations in no ISL bucket" in text


def test_explain_errors() -> None:
    a = sample_window(1, EARLY_MIX, 100)
    empty = replace(a, buckets=(BucketSamples(()),) * 7)
    with pytest.raises(ExplainError, match="earlier window has no TTFT"):
        explain(empty, a)
    with pytest.raises(ExplainError, match="ISL buckets differ"):
        explain(a, SampleWindow("TTFT", tuple(f"b{i}" for i in range(7)), a.buckets))
    with pytest.raises(ExplainError, match="same kind"):
        explain(a, binned(a))
    with pytest.raises(ValueError):
        explain(a, a, confidence=1.5)
    with pytest.raises(ValueError):
        explain(a, a, resamples=0)
    with pytest.raises(KeyError):
        explain(a, a, resamples=10).quantile(0.9)


def test_bootstrap_is_seeded() -> None:
    a, b = sample_window(1, EARLY_MIX, 500), sample_window(2, LATE_MIX, 500)
    one, two, other = explain(a, b, seed=3, resamples=300), explain(a, b, seed=3, resamples=300), explain(
        a, b, seed=4, resamples=300)
    assert one == two
    assert one.mix_effect_ci_s != other.mix_effect_ci_s and one.mix_effect_s == other.mix_effect_s
    assert "seed 3" in one.uncertainty and "300 resamples" in one.uncertainty


def test_ranked_orders_changed_buckets_by_contribution() -> None:
    a = sample_window(12, EARLY_MIX, N)
    b = sample_window(13, EARLY_MIX, N, {0: 3.0, 5: 2.0, 3: 0.5})
    e = explain(a, b)
    ranked = e.ranked()
    assert [c.label for c in ranked] == sorted((c.label for c in ranked), key=lambda lab: -abs(
        next(x.latency_effect_s for x in e.buckets if x.label == lab)))
    assert {c.label: c.change for c in ranked} == {"8193-16384": SLOWER, "2049-4096": FASTER, "0-512": SLOWER}
    assert ranked[0].label == "8193-16384"


@pytest.mark.parametrize(
    ("mix", "mix_ci", "lat", "lat_ci", "want"),
    [
        (1.0, (0.8, 1.2), 0.0, (-0.1, 0.1), "mix"),
        (0.0, (-0.1, 0.1), 1.0, (0.8, 1.2), "latency"),
        (1.0, (0.8, 1.2), 0.5, (0.3, 0.7), "both"),
        (1.0, (0.8, 1.2), -0.5, (-0.7, -0.3), "both"),  # opposite signs still both
        (1.0, (0.8, 1.2), 0.05, (0.03, 0.07), "mix"),  # significant but under 10% of the gross
        (0.01, (-0.1, 0.12), 0.02, (-0.01, 0.05), "none"),
        (math.nan, (math.nan, math.nan), 0.0, (-0.1, 0.1), "none"),
    ],
)
def test_verdict_rule(mix: float, mix_ci: tuple[float, float], lat: float, lat_ci: tuple[float, float],
                      want: str) -> None:
    assert decide_verdict(mix, mix_ci, lat, lat_ci) == want


def test_verdict_rule_min_share() -> None:
    assert decide_verdict(1.0, (0.8, 1.2), 0.05, (0.03, 0.07), min_share=0.0) == "both"
    with pytest.raises(ValueError):
        decide_verdict(1.0, (0.8, 1.2), 0.05, (0.03, 0.07), min_share=0.7)


def test_histogram_per_bucket_counts_need_honest_units() -> None:
    """For ITL the tokens of a request are not independent: giving the requests per bucket widens
    the normal approximation's intervals by about sqrt(tokens per request)."""
    a, b = sample_window(14, EARLY_MIX, N), sample_window(15, EARLY_MIX, N, {4: 1.2})
    ha, hb = binned(a), binned(b)
    plain = explain(ha, hb)
    units = explain(replace(ha, requests=tuple(ha.counts() / 16)), replace(hb, requests=tuple(hb.counts() / 16)))
    width = plain.latency_effect_ci_s[1] - plain.latency_effect_ci_s[0]
    wide = units.latency_effect_ci_s[1] - units.latency_effect_ci_s[0]
    assert wide == pytest.approx(4 * width, rel=0.01)
    assert isinstance(ha, HistogramWindow) and isinstance(plain.buckets[0].latency_effect_ci_s, tuple)


def test_histogram_of_one_observation_has_no_variance() -> None:
    h = CumulativeHistogram(((1.0, 1.0), (math.inf, 1.0)), 0.5)
    a = HistogramWindow("TTFT", ("0-512", "513+"), (h, CumulativeHistogram(((1.0, 10.0), (math.inf, 10.0)), 5.0)))
    e = explain(a, a)
    assert e.buckets[0].latency_effect_ci_s == (-math.inf, math.inf) and e.buckets[0].change == TOO_FEW


def test_material_interaction_is_stated() -> None:
    # 4097-8192 gets 4x slower while its share falls from 30% to 3%: weighed at the later mix the
    # slowdown is small, at the earlier mix (the counterfactual's) it is large
    a = sample_window(16, (20, 10, 10, 10, 30, 10, 10), N)
    b = sample_window(17, (20, 10, 10, 10, 3, 10, 37), N, {4: 4.0})
    e = explain(a, b)
    assert e.interaction_s < 0
    note = [line for line in e.limitations if "also changed share" in line]
    would, was, inter = (format_in(x, "ms", signed=True)  # the three in one unit (was "+0.878 s, not +0.047 s")
                         for x in (e.latency_effect_s - e.interaction_s, e.latency_effect_s, e.interaction_s))
    assert note == [f"the buckets that changed latency also changed share: at the earlier mix the latency effect "
                    f"would be {would}, not {was} (interaction {inter})"]
    assert re.fullmatch(r"\+\d+ ms", would), would
    assert e.counterfactual_mean_s - e.mean_before_s == pytest.approx(e.latency_effect_s - e.interaction_s)
