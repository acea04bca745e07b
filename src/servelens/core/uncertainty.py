"""Uncertainty of the shift-share split of a mean latency change (see :mod:`servelens.core.decompose`).

Three methods, by the kind of data and its size (:func:`split_intervals` chooses, and says why):

**Per-request samples (bench results), up to** :data:`BOOTSTRAP_MAX_REQUESTS` **requests a window:
bootstrap.** Each window is resampled on its own, whole requests with replacement, as many as it has
(not per bucket: the bucket counts, hence the mix, vary between resamples as they would between
runs). For ITL a request's tokens travel together. Every resample recomputes the split; an interval
is the percentile interval of the resamples (``confidence``, default 95%). Seeded
(``numpy.random.default_rng(seed)``): the same input and seed give the same intervals.

**Per-request samples, larger windows: normal approximation from per-request sums** (:func:`delta_split`).
The variance the bootstrap estimates, to first order, from exact per-bucket sums of squares of the
requests' sums and sizes (delta method with the requests as units: a ratio estimator with
cluster-robust variance for ITL); no draws, so a million requests cost one pass.

**Histogram state (scrapes, Prometheus): normal approximation from counts.** The mean of bucket
``b`` is exact (``_sum / _count``); its variance is ``s_b**2 / u_b``, where ``u_b`` is the number of
independent units (the observation count, or the requests for ITL, see
:class:`~servelens.core.windows.HistogramWindow`) and ``s_b**2`` is estimated from the ``le``
counts: every observation sits at its ``le`` bucket's midpoint (the first bucket starts at 0, as
in ``histogram_quantile``; an edge <= 0 holds exactly that value), plus the uniform
within-bucket variance ``width**2 / 12``; the observations above the last finite edge sit at the
one value that makes the histogram's mean equal ``_sum / _count`` (at least that edge). The bucket
shares are multinomial proportions of ``U = sum(u_b)``: ``Cov(w) = (diag(w) - w w^T) / U``. Windows,
buckets, and shares and means are taken as independent; the effects' variances follow by the delta
method (first order), and an interval is ``value +- z * sd`` with ``z`` the normal quantile.

Per-bucket intervals are asked for at their own level: explain uses a Bonferroni level
``1 - (1 - confidence) / K`` over the ``K`` buckets seen in both windows, so that with an
unchanged engine all buckets read "no significant change" together with probability ``confidence``.
A bucket with fewer than 2 units has an unknown variance: its intervals are infinite.
Counts that came from ``rate()`` or ``increase()`` are extrapolated, not counted: give exact
deltas (two scrapes, or :func:`servelens.report.sources.exact_counts`) for honest intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

from servelens.core.summary import CumulativeHistogram
from servelens.core.windows import HistogramWindow, PerRequestWindow

Interval = tuple[float, float]
"""``(low, high)`` in seconds; ``(nan, nan)`` where undefined (a bucket seen in one window only)."""

_CHUNK_CELLS = 2_000_000  # resample indices held at once (16 MB)


@dataclass(frozen=True)
class SplitIntervals:
    """Intervals for the split, at one confidence level.

    Attributes:
        mix: the total mix effect (s).
        latency: the total latency effect (s).
        bucket_latency: per bucket, its latency effect ``wB * (mB - mA)`` (s).
        bucket_change: per bucket, the change of its mean ``mB - mA`` (s).
        method: one line naming the method and its parameters.
    """

    mix: Interval
    latency: Interval
    bucket_latency: tuple[Interval, ...]
    bucket_change: tuple[Interval, ...]
    method: str


def split_arrays(
    n_a: np.ndarray, s_a: np.ndarray, n_b: np.ndarray, s_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The shift-share terms per bucket from counts ``n`` and sums ``s`` (shape ``(..., buckets)``,
    earlier ``a``, later ``b``): ``(mix, latency, m_a, m_b)`` with ``mix = (wB - wA) * mA`` and
    ``latency = wB * (mB - mA)``, ``w = n / n.sum()``, ``m = s / n``.

    A bucket empty in one window gets the other window's mean (no latency change: its latency
    term is 0 and the split stays exact); ``m_a``/``m_b`` are returned with those fill-ins (0 where
    both are empty). Every window must have observations.
    """
    w_a = n_a / n_a.sum(axis=-1, keepdims=True)
    w_b = n_b / n_b.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        m_a = np.where(n_a > 0, s_a / np.where(n_a > 0, n_a, 1), np.nan)
        m_b = np.where(n_b > 0, s_b / np.where(n_b > 0, n_b, 1), np.nan)
    m_a = np.where(n_a > 0, m_a, m_b)
    m_b = np.where(n_b > 0, m_b, m_a)
    m_a, m_b = np.nan_to_num(m_a), np.nan_to_num(m_b)
    return (w_b - w_a) * m_a, w_b * (m_b - m_a), m_a, m_b


def z_value(confidence: float) -> float:
    """Two-sided normal quantile for ``confidence`` in (0, 1) (1.96 for 0.95). Raises ValueError."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


# ---------------------------------------------------------------- bootstrap (samples)


def resampled_counts_sums(
    w: PerRequestWindow, resamples: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap resamples of a window's per-bucket observation counts and sums, each of shape
    ``(resamples, buckets)``: whole requests drawn with replacement, as many as the window has."""
    k, sizes, sums = w.request_table()
    n_req, n_k = k.size, len(w.labels)
    counts = np.zeros((resamples, n_k))
    totals = np.zeros((resamples, n_k))
    chunk = max(1, min(resamples, _CHUNK_CELLS // max(n_req, 1)))
    ones = bool(np.all(sizes == 1))  # one observation a request: counts need no weights (the same floats)
    for start in range(0, resamples, chunk):
        r = min(chunk, resamples - start)
        idx = rng.integers(0, n_req, size=(r, n_req))
        cell = (np.arange(r)[:, None] * n_k + k[idx]).ravel()
        got = np.bincount(cell, None if ones else sizes[idx].ravel(), r * n_k)
        counts[start:start + r] = got.reshape(r, n_k)
        totals[start:start + r] = np.bincount(cell, sums[idx].ravel(), r * n_k).reshape(r, n_k)
    return counts, totals


def _per_bucket(level: float, confidence: float) -> str:
    return "" if math.isclose(level, confidence) else f" ({level:.2%} per bucket)"


def _pct(x: np.ndarray, alpha: float) -> list[Interval]:
    """Percentile intervals along axis 0, NaN resamples left out; (nan, nan) where all are NaN."""
    out: list[Interval] = []
    for col in np.atleast_2d(x.T):
        col = col[np.isfinite(col)]
        if col.size == 0:
            out.append((math.nan, math.nan))
        else:
            lo, hi = np.quantile(col, [alpha / 2, 1 - alpha / 2])
            out.append((float(lo), float(hi)))
    return out


def bootstrap_split(
    before: PerRequestWindow,
    after: PerRequestWindow,
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    bucket_confidence: float | None = None,
) -> SplitIntervals:
    """Percentile-bootstrap intervals for the split (module docstring); the per-bucket ones at
    ``bucket_confidence`` (default ``confidence``). Windows must be non-empty.

    Raises ValueError for ``resamples`` < 1 or a confidence outside (0, 1).
    """
    z_value(confidence)
    bucket_alpha = 1 - (confidence if bucket_confidence is None else bucket_confidence)
    z_value(1 - bucket_alpha)
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = np.random.default_rng(seed)
    n_a, s_a = resampled_counts_sums(before, resamples, rng)
    n_b, s_b = resampled_counts_sums(after, resamples, rng)
    mix, lat, m_a, m_b = split_arrays(n_a, s_a, n_b, s_b)
    change = np.where((n_a > 0) & (n_b > 0), m_b - m_a, np.nan)
    alpha = 1 - confidence
    return SplitIntervals(
        mix=_pct(mix.sum(axis=1), alpha)[0],
        latency=_pct(lat.sum(axis=1), alpha)[0],
        bucket_latency=tuple(_pct(lat, bucket_alpha)),
        bucket_change=tuple(_pct(change, bucket_alpha)),
        method=f"bootstrap over requests, {resamples} resamples, seed {seed}, {confidence:.0%} percentile intervals"
        + _per_bucket(1 - bucket_alpha, confidence),
    )


# ---------------------------------------------------------------- normal approximation (samples)


@dataclass(frozen=True)
class _Moments:
    """One window's sufficient statistics per bucket: observations ``S``, requests, and, with
    ``s_i`` a request's observations and ``r_i = y_i - m_b * s_i`` its sum's residual from the bucket
    mean, ``Q = sum s_i**2``, ``P = sum s_i * r_i``, ``R = sum r_i**2`` (shape (buckets,) each)."""

    s: np.ndarray
    q: np.ndarray
    p: np.ndarray
    r: np.ndarray

    @classmethod
    def of(cls, w: PerRequestWindow, means: np.ndarray) -> _Moments:
        k, sizes, sums = w.request_table()
        n_k = len(w.labels)
        resid = sums - means[k] * sizes
        return cls(np.bincount(k, sizes, n_k), np.bincount(k, sizes * sizes, n_k),
                   np.bincount(k, sizes * resid, n_k), np.bincount(k, resid * resid, n_k))

    def variance(self, g: np.ndarray, h: np.ndarray) -> float:
        """First-order variance of a statistic whose derivatives are ``g`` (by each bucket's share)
        and ``h`` (by each bucket's mean): the sum over requests of their squared influence."""
        total = float(self.s.sum())
        if total <= 0:
            return 0.0
        w = self.s / total
        gc = g - float(w @ g)  # a share moves at the others' expense
        with np.errstate(invalid="ignore", divide="ignore"):
            per = (gc**2 * self.q / total**2 + 2 * gc * h * self.p / (total * self.s) + h**2 * self.r / self.s**2)
        return float(np.where(self.s > 0, per, 0.0).sum())


def delta_split(
    before: PerRequestWindow,
    after: PerRequestWindow,
    confidence: float = 0.95,
    bucket_confidence: float | None = None,
) -> SplitIntervals:
    """Normal-approximation intervals for the split from per-request sums (delta method); the
    per-bucket ones at ``bucket_confidence`` (default ``confidence``). Windows must be non-empty.

    The requests are the independent units (as the bootstrap resamples them): a bucket's mean is the
    ratio ``Y_b / S_b`` of its requests' summed latency to their observations (one each for TTFT and
    duration, a request's tokens for ITL), its share ``S_b / S``. Each request ``i`` of bucket ``b``
    moves a statistic with derivatives ``G`` (by the shares) and ``H`` (by the means) by its
    influence ``u_i = s_i (G_b - sum_c w_c G_c) / S + H_b r_i / S_b``, ``r_i = y_i - m_b s_i``; the
    statistic's variance is the sum of ``u_i**2`` over both windows' requests (independent windows).
    That is the variance the bootstrap estimates, to first order (the infinitesimal jackknife), with
    exact per-bucket sums of squares (:class:`_Moments`) and no draws: cluster-robust for ITL, whose
    tokens of one request move together. An interval is ``value +- z * sd``.

    Raises ValueError for a confidence outside (0, 1).
    """
    z = z_value(confidence)
    zb = z if bucket_confidence is None else z_value(bucket_confidence)
    n_a, n_b = before.counts(), after.counts()
    mix, lat, m_a, m_b = split_arrays(n_a, before.sums(), n_b, after.sums())
    w_a, w_b = n_a / n_a.sum(), n_b / n_b.sum()
    mom_a, mom_b = _Moments.of(before, m_a), _Moments.of(after, m_b)
    d = m_b - m_a
    zero = np.zeros(len(n_a))

    def var(g_a: np.ndarray, h_a: np.ndarray, g_b: np.ndarray, h_b: np.ndarray) -> float:
        # a bucket seen in one window borrows the other's mean: the derivative by it goes to the window with the data
        own_a = np.where(n_a > 0, h_a, 0.0) + np.where(n_b > 0, 0.0, h_b)
        own_b = np.where(n_b > 0, h_b, 0.0) + np.where(n_a > 0, 0.0, h_a)
        return mom_a.variance(g_a, own_a) + mom_b.variance(g_b, own_b)

    def around(value: float, variance: float, z: float) -> Interval:
        sd = math.sqrt(max(variance, 0.0))
        return value - z * sd, value + z * sd

    var_mix = var(-m_a, w_b - w_a, m_a, zero)
    var_lat = var(zero, -w_b, d, w_b)
    both = (n_a > 0) & (n_b > 0)
    bucket_latency, bucket_change = [], []
    for b in range(len(n_a)):
        one = np.zeros(len(n_a))
        one[b] = 1.0
        bucket_latency.append(around(float(lat[b]), var(zero, -w_b * one, d[b] * one, w_b * one), zb))
        bucket_change.append(around(float(d[b]), var(zero, -one, zero, one), zb) if both[b] else (math.nan, math.nan))
    return SplitIntervals(
        mix=around(float(mix.sum()), var_mix, z),
        latency=around(float(lat.sum()), var_lat, z),
        bucket_latency=tuple(bucket_latency),
        bucket_change=tuple(bucket_change),
        method=f"normal approximation from per-request sums (delta method, requests as units), {confidence:.0%} "
        "intervals" + _per_bucket(confidence if bucket_confidence is None else bucket_confidence, confidence),
    )


# ---------------------------------------------------------------- which method


BOOTSTRAP_MAX_REQUESTS = 10_000
"""``intervals="auto"`` bootstraps while each window has at most this many requests and uses the
normal approximation (:func:`delta_split`) above. Why there: the bootstrap's work is
``resamples x requests`` draws per window and metric (2e7 at 10,000 requests: ~1.5 s for the three
metrics of two windows here, 3 s at 20,000) and grows with the requests, while the normal approximation costs
one pass over the per-request sums; and at 10,000 requests the central limit theorem holds for a mean
of latencies with a finite variance, so the two agree (measured in the tests on 4,000 requests a
window: within the bootstrap's own resampling noise). Small windows keep the bootstrap, which needs
no normality."""

INTERVALS = ("auto", "bootstrap", "normal")
"""How the split's intervals are made for per-request samples (:func:`split_intervals`)."""


def split_intervals(
    before: PerRequestWindow | HistogramWindow,
    after: PerRequestWindow | HistogramWindow,
    intervals: str = "auto",
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    bucket_confidence: float | None = None,
) -> SplitIntervals:
    """The split's intervals by the method ``intervals`` asks for: for per-request samples
    ``bootstrap``, ``normal`` (:func:`delta_split`) or ``auto`` (the bootstrap while each window has at
    most :data:`BOOTSTRAP_MAX_REQUESTS` requests, the normal approximation above); histograms have
    only the normal approximation from counts (``auto`` or ``normal``). ``method`` says which, and why.

    Raises ValueError for an unknown ``intervals``, or ``bootstrap`` asked of histograms (and as the
    methods raise).
    """
    if intervals not in INTERVALS:
        raise ValueError(f"intervals must be one of {', '.join(INTERVALS)}, got {intervals!r}")
    if isinstance(before, HistogramWindow) or isinstance(after, HistogramWindow):
        if intervals == "bootstrap":
            raise ValueError("the bootstrap needs per-request samples (bench results); histograms have the "
                             "normal approximation from counts")
        assert isinstance(before, HistogramWindow) and isinstance(after, HistogramWindow)
        return normal_split(before, after, confidence, bucket_confidence)
    largest = int(max(before.units().sum(), after.units().sum()))
    if intervals == "auto":
        use = "bootstrap" if largest <= BOOTSTRAP_MAX_REQUESTS else "normal"
        why = (f"; the bootstrap, each window having at most {BOOTSTRAP_MAX_REQUESTS:,} requests" if use == "bootstrap"
               else f"; not the bootstrap: a window has {largest:,} requests, over {BOOTSTRAP_MAX_REQUESTS:,}, where "
               "the central limit theorem holds and the bootstrap's draws would cost resamples x requests")
    else:
        use, why = intervals, " (as asked)"
    if use == "bootstrap":
        got = bootstrap_split(before, after, resamples, seed, confidence, bucket_confidence)
    else:
        got = delta_split(before, after, confidence, bucket_confidence)
    return replace(got, method=got.method + why)


# ---------------------------------------------------------------- normal approximation (histograms)


def histogram_variance(h: CumulativeHistogram) -> float:
    """Estimated variance of the observations behind a histogram (s^2; module docstring for the
    placement rule), with ``n - 1`` in the denominator. NaN with fewer than 2 observations."""
    les = [le for le, _ in h.buckets]
    cum = np.array([c for _, c in h.buckets], dtype=float)
    counts = np.diff(cum, prepend=0.0)
    n = float(cum[-1])
    if n < 2:
        return math.nan
    mean = h.sum / n
    lows = [0.0 if les[0] > 0 else les[0], *les[:-1]]
    mids = np.array([(lo + hi) / 2 for lo, hi in zip(lows[:-1], les[:-1], strict=True)])
    widths = np.array([hi - lo for lo, hi in zip(lows[:-1], les[:-1], strict=True)])
    finite = counts[:-1]
    top = counts[-1]
    last = les[-2]
    rep_top = max(last, (h.sum - float(finite @ mids)) / top) if top > 0 else last
    ss = float(finite @ ((mids - mean) ** 2 + widths**2 / 12)) + top * (rep_top - mean) ** 2
    return ss / (n - 1)


def normal_split(
    before: HistogramWindow, after: HistogramWindow, confidence: float = 0.95, bucket_confidence: float | None = None
) -> SplitIntervals:
    """Normal-approximation intervals for the split from histogram counts (module docstring); the
    per-bucket ones at ``bucket_confidence`` (default ``confidence``). Windows must be non-empty.
    Raises ValueError for a confidence outside (0, 1)."""
    z = z_value(confidence)
    zb = z if bucket_confidence is None else z_value(bucket_confidence)
    n_a, n_b = before.counts(), after.counts()
    mix_b, lat_b, m_a, m_b = split_arrays(n_a, before.sums(), n_b, after.sums())
    w_a, w_b = n_a / n_a.sum(), n_b / n_b.sum()
    u_a, u_b = before.units(), after.units()

    def var_mean(w: HistogramWindow, u: np.ndarray) -> np.ndarray:
        v = np.array([histogram_variance(h) for h in w.histograms])
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(u >= 2, v / np.where(u > 0, u, 1), np.inf)
        return np.where(w.counts() > 0, out, 0.0)  # an empty bucket's mean is a fill-in (no variance of its own)

    v_a, v_b = var_mean(before, u_a), var_mean(after, u_b)
    # a bucket seen in one window borrows the other's mean, and with it that mean's variance
    v_a, v_b = np.where(n_a > 0, v_a, v_b), np.where(n_b > 0, v_b, v_a)
    both = (n_a > 0) & (n_b > 0)
    v_change = np.where(both, v_a + v_b, 0.0)

    def cov_quad(w: np.ndarray, units: float, g: np.ndarray) -> float:
        if units <= 0:
            return math.inf
        return float(w @ g**2 - (w @ g) ** 2) / units

    d = m_b - m_a
    with np.errstate(invalid="ignore"):
        var_mix = cov_quad(w_a, u_a.sum(), m_a) + cov_quad(w_b, u_b.sum(), m_a) + float(((w_b - w_a) ** 2 * v_a).sum())
        var_lat = cov_quad(w_b, u_b.sum(), d) + float((w_b**2 * v_change).sum())
        var_bucket = d**2 * w_b * (1 - w_b) / max(u_b.sum(), 1e-300) + w_b**2 * v_change

    def around(value: float, var: float, z: float = z) -> Interval:
        sd = math.sqrt(var) if var == var else math.inf
        return (value - z * sd, value + z * sd) if math.isfinite(sd) else (-math.inf, math.inf)

    return SplitIntervals(
        mix=around(float(mix_b.sum()), var_mix),
        latency=around(float(lat_b.sum()), var_lat),
        bucket_latency=tuple(around(float(x), float(v), zb) for x, v in zip(lat_b, var_bucket, strict=True)),
        bucket_change=tuple(
            around(float(x), float(v), zb) if ok else (math.nan, math.nan)
            for x, v, ok in zip(d, v_change, both, strict=True)
        ),
        method=f"normal approximation from histogram counts, {confidence:.0%} intervals"
        + _per_bucket(confidence if bucket_confidence is None else bucket_confidence, confidence),
    )
