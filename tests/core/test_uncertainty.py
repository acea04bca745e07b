"""How the split's uncertainty is estimated: bootstrap over requests, normal approximation from per-request sums
(delta method) and from histogram counts; which one, and that the two for samples agree."""

import math
from dataclasses import replace

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
from servelens.core.windows import BucketSamples, SampleWindow
from servelens.testing.latency_windows import (
    EARLY_MIX,
    LATE_MIX,
    binned,
    central_difference_variance,
    clustered_window,
    sample_window,
    varied_window,
)

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


# ---------------------------------------------------------------- normal approximation from per-request sums


def _split_at(a: SampleWindow, b: SampleWindow, wa: np.ndarray, wb: np.ndarray) -> np.ndarray:
    """Every statistic of the split with the requests weighted ``wa``, ``wb`` (1: as drawn once):
    mix, latency, then per bucket its latency term and its mean's change."""
    out = []
    for w, win in ((wa, a), (wb, b)):
        k, sizes, sums = win.request_table()
        out.append((np.bincount(k, w * sizes, len(win.labels)), np.bincount(k, w * sums, len(win.labels))))
    (n_a, s_a), (n_b, s_b) = out
    mix, lat, m_a, m_b = split_arrays(n_a, s_a, n_b, s_b)
    return np.concatenate(([mix.sum(), lat.sum()], lat, m_b - m_a))


def test_delta_split_is_the_infinitesimal_jackknife_of_the_split() -> None:
    """By definition: the variance of each statistic is the sum over both windows' requests of the
    squared derivative of the statistic by that request's weight (the bootstrap's multinomial weights,
    at 1; the split is scale free in them, so their covariance adds nothing). Derivatives here by
    central differences, with a bucket seen in the later window only and requests of 0 observations."""
    a = clustered_window(11, EARLY_MIX, 60, 3)
    a = replace(a, buckets=(*a.buckets[:6], BucketSamples((), ())))  # the last bucket: later window only
    b = varied_window(12, LATE_MIX, 70)
    b = replace(b, buckets=(BucketSamples((0.5, 0.7), (0, 2, 0)), *b.buckets[1:]))
    wa, wb = np.ones(a.units().sum().astype(int)), np.ones(b.units().sum().astype(int))
    base = _split_at(a, b, wa, wb)
    var = central_difference_variance(lambda x, y: _split_at(a, b, x, y), wa, wb)
    z = z_value(0.95)
    got = delta_split(a, b)
    k = len(a.labels)
    half = [got.mix[1] - got.mix[0], got.latency[1] - got.latency[0],
            *[hi - lo for lo, hi in got.bucket_latency], *[hi - lo for lo, hi in got.bucket_change]]
    want = 2 * z * np.sqrt(var)
    seen = np.r_[True, True, np.ones(k, bool), [not math.isnan(c[0]) for c in got.bucket_change]]
    assert np.allclose(np.array(half)[seen], want[seen], rtol=1e-5, atol=1e-12)
    assert math.isnan(got.bucket_change[-1][0]) and got.bucket_latency[-1] == (0.0, 0.0)  # borrowed mean
    centre = [(lo + hi) / 2 for lo, hi in (got.mix, got.latency, *got.bucket_latency)]
    assert np.allclose(centre, base[:2 + k])
    assert got.method.startswith("normal approximation from per-request sums")


def _close(boot: tuple[float, float], norm: tuple[float, float], tol: float) -> bool:
    width = norm[1] - norm[0]
    return abs(boot[0] - norm[0]) <= tol * width and abs(boot[1] - norm[1]) <= tol * width


@pytest.mark.parametrize("kind", ["TTFT", "ITL"])
def test_normal_and_bootstrap_intervals_agree_on_thousands_of_requests(kind: str) -> None:
    """Seeded, 4,000 requests a window, every interval (the split's at 95 %, each bucket's at the
    Bonferroni level 99.29 %): each bound of the bootstrap's within 10 % of the normal interval's
    width of the normal bound. Why 10 %: with 2,000 resamples a percentile bound is itself an estimate
    whose standard error is sqrt(p (1 - p) / 2000) / phi(z) standard deviations of the statistic:
    0.06 sd at 95 %, 0.125 sd at 99.29 %; 10 % of the width (2 z sd) is 0.39 sd and 0.54 sd, 4 to 6 of
    those standard errors, and leaves room for the skewness the bootstrap sees in a bucket of ~100
    requests (its percentile bounds move by about skew / sqrt(n) * (z**2 - 1) / 6 sd, 0.13 sd there)."""
    make = (lambda s, mix, slow=None: sample_window(s, mix, 4000, slow)) if kind == "TTFT" else (
        lambda s, mix, slow=None: varied_window(s, mix, 4000, slow))
    a, b = make(21, EARLY_MIX), make(22, LATE_MIX, {4: 1.15})
    k = len(a.labels)
    level = 1 - 0.05 / k
    boot = bootstrap_split(a, b, resamples=2000, seed=3, bucket_confidence=level)
    norm = delta_split(a, b, bucket_confidence=level)
    assert _close(boot.mix, norm.mix, 0.1) and _close(boot.latency, norm.latency, 0.1)
    for i in range(k):
        assert _close(boot.bucket_latency[i], norm.bucket_latency[i], 0.1), i
        assert _close(boot.bucket_change[i], norm.bucket_change[i], 0.1), i
    widths = [width(x) / width(y) for x, y in zip(boot.bucket_change, norm.bucket_change, strict=True)]
    assert 0.9 < float(np.median(widths)) < 1.1


@pytest.mark.parametrize("kind", ["TTFT", "ITL"])
@pytest.mark.parametrize("later, slow, verdict", [
    (EARLY_MIX, None, "none"), (LATE_MIX, None, "mix"), (EARLY_MIX, {3: 1.6, 4: 1.6}, "latency"),
    (LATE_MIX, {4: 1.8, 5: 1.5}, "both"),
])
def test_normal_and_bootstrap_give_the_same_verdicts(kind: str, later: tuple[int, ...], slow: dict[int, float] | None,
                                                      verdict: str) -> None:
    from servelens.core.decompose import explain

    make = sample_window if kind == "TTFT" else varied_window
    a, b = make(31, EARLY_MIX, 4000), make(32, later, 4000, slow)
    boot = explain(a, b, intervals="bootstrap", seed=5)
    norm = explain(a, b, intervals="normal")
    assert boot.verdict == norm.verdict == verdict
    assert [c.change for c in boot.buckets] == [c.change for c in norm.buckets]
    assert boot.quantiles == norm.quantiles and boot.mix_effect_s == norm.mix_effect_s  # only the intervals differ


def test_the_switch_rule_and_what_the_method_line_says(monkeypatch: pytest.MonkeyPatch) -> None:
    from servelens.core import uncertainty

    a, b = sample_window(41, EARLY_MIX, 300), sample_window(42, LATE_MIX, 301)
    monkeypatch.setattr(uncertainty, "BOOTSTRAP_MAX_REQUESTS", 301)
    got = split_intervals(a, b, resamples=50)
    assert got.method.startswith("bootstrap") and "at most 301 requests" in got.method
    monkeypatch.setattr(uncertainty, "BOOTSTRAP_MAX_REQUESTS", 300)
    got = split_intervals(a, b, resamples=50)
    assert got.method.startswith("normal approximation from per-request sums")
    assert "a window has 301 requests, over 300" in got.method and "central limit theorem" in got.method
    assert split_intervals(a, b, "bootstrap", resamples=50).method.endswith("(as asked)")
    assert split_intervals(a, b, "normal").method.endswith("(as asked)")
    with pytest.raises(ValueError, match="intervals must be one of"):
        split_intervals(a, b, "jackknife")
    with pytest.raises(ValueError, match="needs per-request samples"):
        split_intervals(binned(a), binned(b), "bootstrap")
    assert split_intervals(binned(a), binned(b), "normal").method.startswith("normal approximation from histogram")
