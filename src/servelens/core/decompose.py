"""Slower, or did the traffic shift? The split of a latency change between two windows into a
bucket-mix effect and a per-bucket latency effect, and the counterfactual "the later window's
per-bucket latency at the earlier window's bucket mix".

**Shift-share of the mean** (the standard decomposition of a change in a weighted average, as in
shift-share analysis in regional economics): with ``w`` a bucket's share of the observations and
``m`` its mean, earlier ``A`` and later ``B``,
``mean_B - mean_A = sum_b (wB - wA) * mA  [mix]  +  sum_b wB * (mB - mA)  [latency]``, exactly.
A bucket seen in only one window has no latency change to measure: it gets the other window's
mean, so its latency term is 0 (all of its effect is mix) and the split stays exact; the
explanation lists it in ``limitations``. ``interaction_s = sum_b (wB - wA) * (mB - mA)`` is the
difference between this latency term (at the later mix) and the one at the earlier mix
(``counterfactual_mean_s - mean_before_s``); when it is material (over ``min_share`` of
``|mix| + |latency|``: the buckets that changed latency also changed share) ``limitations`` says so,
since the verdict and the counterfactual then weigh the change differently.

**Counterfactual.** From histograms, each bucket's later histogram scaled to the earlier share
(``sum_b wA_b * H_b / n_b``, scaled to the later window's count): exact as a histogram, since the
by-ISL histograms share ``le`` edges; its quantiles by Prometheus ``histogram_quantile``
interpolation. From samples, every later sample of bucket ``b`` weighted ``wA_b / nB_b``; its
quantiles are exact weighted quantiles (the inverted CDF of
:func:`~servelens.core.quantiles.weighted_quantile`), found by selection over value bins
(:func:`~servelens.core.binned_quantiles.mixture_quantiles`) so that samples too many to hold
(a million requests' ITL) need not be held; :func:`explain` asks for every quantile at once.
**Bound**: the histogram counterfactual's cumulative share at each ``le`` edge
equals the reweighted samples' exactly, so both quantiles fall in the same ``le`` bucket
``(lo, hi]``: they differ by at most ``hi - lo``; past the last finite edge the histogram returns
that edge, at or below the exact value. Sample quantiles here are all inverted-CDF (observed,
per bucket and counterfactual), so at an unchanged mix the counterfactual equals the observed
figure; the report's table uses linear interpolation, at most one gap between adjacent samples away.

**Verdict** (of the mean; intervals from :mod:`servelens.core.uncertainty`): an effect *counts*
when its interval excludes 0 and it is at least ``min_share`` (default 10%) of ``|mix| +
|latency|``. Both count: ``both``; one: ``mix`` or ``latency``; neither: ``none``. A bucket's own
latency changed (``slower``/``faster``) when the interval of ``mB - mA`` excludes 0 and it has at
least :data:`MIN_BUCKET_REQUESTS` requests in each window (fewer: ``too few requests``); the
per-bucket intervals are Bonferroni-adjusted over the ``K`` buckets seen in both windows (level
``1 - (1 - confidence) / K``), so an unchanged engine shows no changed bucket at ``confidence``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np

from servelens.core.binned_quantiles import Part, mixture_quantiles
from servelens.core.summary import CumulativeHistogram
from servelens.core.uncertainty import Interval, SplitIntervals, split_arrays, split_intervals
from servelens.core.units import format_times
from servelens.core.windows import (
    PER_REQUEST,
    ExplainError,
    HistogramWindow,
    Mix,
    PerRequestWindow,
    Window,
    aligned_mix,
    check_pair,
    window_mix,
)

VERDICTS = ("mix", "latency", "both", "none")
"""The verdict of an explanation."""

SLOWER, FASTER, UNCHANGED, TOO_FEW = "slower", "faster", "no significant change", "too few requests"
ONLY_BEFORE, ONLY_AFTER = "only in the earlier window", "only in the later window"
NO_DATA = "no data in either window"

MIN_BUCKET_REQUESTS = 5
"""A bucket's own latency change is judged only with at least this many requests in each window
(a bootstrap of 1-4 requests, or a variance from them, understates the spread)."""

DEFAULT_QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class Counterfactual:
    """A window's per-bucket latency at another bucket mix.

    Attributes:
        mix: the mix applied (numeric bucket order).
        mean_s: the mean at that mix (s): ``sum_b mix_b * m_b``.
        quantiles: the ``q`` values (0.95 for p95).
        quantiles_s: the quantiles at that mix (s; None without observations).
        histogram: the mixed histogram (histogram windows only), scaled to the window's count.
    """

    mix: Mix
    mean_s: float
    quantiles: tuple[float, ...]
    quantiles_s: tuple[float | None, ...]
    histogram: CumulativeHistogram | None = None


def _parts(window: Window, mix: Mix, fallback: Window | None) -> list[tuple[float, int, Window]]:
    """Per bucket with a share: (share, bucket index, window that holds its data)."""
    mix = aligned_mix(mix, window.labels)
    counts = window.counts()
    back = fallback.counts() if fallback is not None else np.zeros_like(counts)
    out = []
    for i, share in enumerate(mix.shares):
        if share <= 0:
            continue
        if counts[i] > 0:
            out.append((share, i, window))
        elif fallback is not None and back[i] > 0:
            out.append((share, i, fallback))
        else:
            raise ExplainError(
                f"bucket {window.labels[i]} has a {share:.1%} share in the mix but no {window.metric} "
                "observations to weight"
            )
    return out


def counterfactual(
    window: Window, mix: Mix, quantiles: Sequence[float] = DEFAULT_QUANTILES, fallback: Window | None = None
) -> Counterfactual:
    """``window``'s per-bucket latency at ``mix`` (module docstring for the method and its bound).

    A bucket with a share but no observations takes ``fallback``'s data for that bucket (explain
    passes the earlier window: "assumed unchanged"). Raises ExplainError when ``mix`` does not
    match the window's buckets, or a bucket with a share has no data (nor a fallback's).
    """
    parts = _parts(window, mix, fallback)
    mix = aligned_mix(mix, window.labels)
    mean = _mixture_mean(parts)
    if isinstance(window, HistogramWindow):
        total = float(window.counts().sum())
        cum = np.zeros(len(window.edges))
        hsum = 0.0
        for share, i, w in parts:
            assert isinstance(w, HistogramWindow)
            h = w.histograms[i]
            scale = share * total / h.count
            cum += scale * np.array([c for _, c in h.buckets])
            hsum += scale * h.sum
        hist = CumulativeHistogram(tuple(zip(window.edges, (float(c) for c in cum), strict=True)), hsum)
        return Counterfactual(mix, mean, tuple(quantiles), tuple(hist.quantile(q) for q in quantiles), hist)
    return Counterfactual(mix, mean, tuple(quantiles), mixture_quantiles([_mixture_row(parts)], quantiles)[0])


def _mixture_mean(parts: list[tuple[float, int, Window]]) -> float:
    """The mean at the mix: ``sum_b share_b * m_b``, exactly rounded."""
    return math.fsum(share * float(w.sums()[i] / w.counts()[i]) for share, i, w in parts)


def _mixture_row(parts: list[tuple[float, int, Window]]) -> list[Part]:
    """The counterfactual as a weighted mixture: every observation of bucket ``i`` of its window
    weighted ``share / count`` (one part per window that lends data)."""
    by: dict[int, tuple[PerRequestWindow, np.ndarray]] = {}
    for share, i, w in parts:
        assert isinstance(w, PER_REQUEST)
        weights = by.setdefault(id(w), (w, np.zeros(len(w.labels))))[1]
        weights[i] = share / float(w.counts()[i])
    return [(w.binned, weights) for w, weights in by.values()]


def _bucket_rows(window: PerRequestWindow) -> list[list[Part]]:
    """Mixture rows of every observation, then of each bucket's alone (weights 1)."""
    k = len(window.labels)
    return [[(window.binned, np.ones(k))]] + [[(window.binned, np.eye(k)[i])] for i in range(k)]


def observed_quantiles(
    window: Window, quantiles: Sequence[float], bucket: int | None = None
) -> tuple[float | None, ...]:
    """A window's quantiles over all its buckets (``bucket`` None) or one bucket (s; None where
    empty): ``histogram_quantile`` of the summed histograms, or inverted-CDF sample quantiles
    (:func:`~servelens.core.binned_quantiles.mixture_quantiles`, weights 1)."""
    if isinstance(window, HistogramWindow):
        hists = window.histograms if bucket is None else (window.histograms[bucket],)
        h = reduce(CumulativeHistogram.plus, hists)
        return tuple(h.quantile(q) for q in quantiles)
    return mixture_quantiles([_bucket_rows(window)[0 if bucket is None else bucket + 1]], quantiles)[0]


def one_le_bucket(window: Window, bucket: int | None = None) -> tuple[float, float] | None:
    """The ``(lower, upper]`` edges (s) of the one ``le`` bucket holding every observation of a histogram
    window (``bucket`` None: all its buckets summed), or None (several ``le`` buckets, no observation, or a
    sample window: its quantiles are measured). :meth:`~servelens.core.summary.CumulativeHistogram.single_bucket`."""
    if not isinstance(window, HistogramWindow):
        return None
    hists = window.histograms if bucket is None else (window.histograms[bucket],)
    return reduce(CumulativeHistogram.plus, hists).single_bucket()


@dataclass(frozen=True)
class QuantileShift:
    """One quantile of the all-requests figures: earlier, later, later at the earlier mix (s)."""

    q: float
    before_s: float | None
    after_s: float | None
    counterfactual_s: float | None


@dataclass(frozen=True)
class BucketChange:
    """One ISL bucket's part in the change (times in s, shares in [0, 1]).

    Attributes:
        label: bucket label.
        count_before, count_after: observations in each window.
        share_before, share_after: the bucket's share of the observations.
        mean_before_s, mean_after_s: its mean (None when empty).
        mean_change_ci_s: interval of ``mean_after - mean_before`` (None when seen in one window only).
        mix_effect_s: its mix term ``(wB - wA) * mA``.
        latency_effect_s: its latency term ``wB * (mB - mA)``, with ``latency_effect_ci_s``.
        change: ``slower``, ``faster``, ``no significant change``, ``too few requests``,
            ``only in the earlier window`` / ``only in the later window``, or ``no data in either window``.
        quantiles_before_s, quantiles_after_s: its quantiles at the explanation's ``q`` values.
        le_range_before_s, le_range_after_s: histogram windows only: the ``(lower, upper]`` edges (s) of
            the one ``le`` bucket that holds every observation of the bucket in that window, else None.
            Its quantiles there are then points of ``histogram_quantile``'s straight line through that
            ``le`` bucket, not measurements (the report's ``~``).
    """

    label: str
    count_before: float
    count_after: float
    share_before: float
    share_after: float
    mean_before_s: float | None
    mean_after_s: float | None
    mean_change_ci_s: Interval | None
    mix_effect_s: float
    latency_effect_s: float
    latency_effect_ci_s: Interval
    change: str
    quantiles_before_s: tuple[float | None, ...]
    quantiles_after_s: tuple[float | None, ...]
    le_range_before_s: tuple[float, float] | None = None
    le_range_after_s: tuple[float, float] | None = None

    def interpolated(self) -> bool:
        """True when the bucket's quantiles in either window are interpolations inside one ``le`` bucket."""
        return self.le_range_before_s is not None or self.le_range_after_s is not None


@dataclass(frozen=True)
class Explanation:
    """The answer for one metric between two windows (times in s). See the module docstring.

    ``mix_effect_s + latency_effect_s == mean_after_s - mean_before_s`` (to rounding).
    ``buckets`` is in numeric order; :meth:`ranked` orders the changed ones by contribution.
    ``limitations`` lists, one line each, what the figures cannot say (never a silent number).
    ``le_range_before_s``, ``le_range_after_s``, ``le_range_counterfactual_s``: histogram windows only,
    the one ``le`` bucket holding every observation of all requests (earlier, later, later at the
    earlier mix), else None: those quantiles are interpolations inside it, not measurements.
    """

    metric: str
    labels: tuple[str, ...]
    exact: bool
    count_before: float
    count_after: float
    mean_before_s: float
    mean_after_s: float
    counterfactual_mean_s: float
    quantiles: tuple[QuantileShift, ...]
    mix_effect_s: float
    mix_effect_ci_s: Interval
    latency_effect_s: float
    latency_effect_ci_s: Interval
    interaction_s: float
    verdict: str
    buckets: tuple[BucketChange, ...]
    confidence: float
    uncertainty: str
    limitations: tuple[str, ...]
    unbucketed_before: float = 0.0
    unbucketed_after: float = 0.0
    le_range_before_s: tuple[float, float] | None = None
    le_range_after_s: tuple[float, float] | None = None
    le_range_counterfactual_s: tuple[float, float] | None = None

    def ranked(self) -> tuple[BucketChange, ...]:
        """Buckets whose own latency changed significantly, largest ``|latency_effect_s|`` first."""
        changed = [b for b in self.buckets if b.change in (SLOWER, FASTER)]
        return tuple(sorted(changed, key=lambda b: -abs(b.latency_effect_s)))

    def quantile(self, q: float) -> QuantileShift:
        """The all-requests figures for ``q``. Raises KeyError when ``q`` was not computed."""
        for s in self.quantiles:
            if math.isclose(s.q, q):
                return s
        raise KeyError(f"quantile {q} was not computed (have {', '.join(f'{s.q:g}' for s in self.quantiles)})")


def excludes_zero(ci: Interval | None) -> bool:
    """True when an interval lies wholly above or below 0 (False for None or NaN bounds)."""
    return ci is not None and (ci[0] > 0 or ci[1] < 0)


def decide_verdict(
    mix_s: float, mix_ci: Interval, latency_s: float, latency_ci: Interval, min_share: float = 0.1
) -> str:
    """The verdict rule (module docstring): ``mix``, ``latency``, ``both`` or ``none``.

    Raises ValueError for ``min_share`` outside [0, 0.5].
    """
    if not 0 <= min_share <= 0.5:
        raise ValueError(f"min_share must be within [0, 0.5], got {min_share}")
    gross = abs(mix_s) + abs(latency_s)
    mix = excludes_zero(mix_ci) and abs(mix_s) >= min_share * gross
    lat = excludes_zero(latency_ci) and abs(latency_s) >= min_share * gross
    return "both" if mix and lat else "mix" if mix else "latency" if lat else "none"


def _bucket_change(i: int, a: Window, b: Window, ci: SplitIntervals) -> str:
    n_a, n_b = a.counts()[i], b.counts()[i]
    if n_a <= 0 and n_b <= 0:
        return NO_DATA
    if n_a <= 0 or n_b <= 0:
        return ONLY_AFTER if n_a <= 0 else ONLY_BEFORE
    if min(a.units()[i], b.units()[i]) < MIN_BUCKET_REQUESTS:
        return TOO_FEW
    low, high = ci.bucket_change[i]
    return SLOWER if low > 0 else FASTER if high < 0 else UNCHANGED


def explain(
    before: Window,
    after: Window,
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    min_share: float = 0.1,
    intervals: str = "auto",
) -> Explanation:
    """Explain the change of one metric from ``before`` to ``after`` (module docstring).

    Args:
        before, after: two windows of the same kind, metric and buckets (and ``le`` edges).
        quantiles: the all-requests and per-bucket quantiles to show (0.95 for p95).
        confidence: interval level; resamples, seed: the bootstrap's (sample windows only).
        min_share: the verdict's materiality threshold (:func:`decide_verdict`).
        intervals: ``auto``, ``bootstrap`` or ``normal``
            (:func:`~servelens.core.uncertainty.split_intervals`: which method, and the switch rule).

    Raises ExplainError for windows that cannot be compared (:func:`~servelens.core.windows.check_pair`);
    ValueError for a bad ``confidence``, ``resamples``, ``min_share`` or ``intervals``.
    """
    check_pair(before, after)
    n_a, n_b, s_a, s_b = before.counts(), after.counts(), before.sums(), after.sums()
    mix_b, lat_b, m_a, m_b = split_arrays(n_a, s_a, n_b, s_b)
    judged = max(1, int(((n_a > 0) & (n_b > 0)).sum()))
    bucket_conf = 1 - (1 - confidence) / judged  # Bonferroni over the buckets (module docstring)
    ci = split_intervals(before, after, intervals, resamples, seed, confidence, bucket_conf)
    mix_s, lat_s = float(mix_b.sum()), float(lat_b.sum())
    if isinstance(before, PER_REQUEST) and isinstance(after, PER_REQUEST):  # every quantile from one pass a window
        parts = _parts(after, window_mix(before), before)
        got = mixture_quantiles([*_bucket_rows(before), *_bucket_rows(after), _mixture_row(parts)], quantiles)
        k = len(before.labels)
        per_a, per_b = got[1:k + 1], got[k + 2:2 * k + 2]
        qa, qb = got[0], got[k + 1]
        cf = Counterfactual(aligned_mix(window_mix(before), after.labels), _mixture_mean(parts), tuple(quantiles),
                            got[-1])
    else:
        cf = counterfactual(after, window_mix(before), quantiles, fallback=before)
        qa, qb = observed_quantiles(before, quantiles), observed_quantiles(after, quantiles)
        per_a = [observed_quantiles(before, quantiles, i) for i in range(len(before.labels))]
        per_b = [observed_quantiles(after, quantiles, i) for i in range(len(before.labels))]
    w_a, w_b = n_a / n_a.sum(), n_b / n_b.sum()
    buckets, notes = [], []
    for i, label in enumerate(before.labels):
        change = _bucket_change(i, before, after, ci)
        if change in (ONLY_BEFORE, ONLY_AFTER) and n_a[i] + n_b[i] > 0:
            side = "earlier" if change == ONLY_AFTER else "later"
            notes.append(
                f"bucket {label} has no {before.metric} observations in the {side} window: its latency change "
                "is unknown, so all of its effect counts as mix"
                + (" and the counterfactual uses its earlier latency" if side == "later" else "")
            )
        elif change == TOO_FEW:
            notes.append(f"bucket {label} has fewer than {MIN_BUCKET_REQUESTS} requests in a window: its latency "
                         "change is not judged")
        both = n_a[i] > 0 and n_b[i] > 0
        buckets.append(BucketChange(
            label=label,
            count_before=float(n_a[i]), count_after=float(n_b[i]),
            share_before=float(w_a[i]), share_after=float(w_b[i]),
            mean_before_s=float(m_a[i]) if n_a[i] > 0 else None,
            mean_after_s=float(m_b[i]) if n_b[i] > 0 else None,
            mean_change_ci_s=ci.bucket_change[i] if both else None,
            mix_effect_s=float(mix_b[i]),
            latency_effect_s=float(lat_b[i]),
            latency_effect_ci_s=ci.bucket_latency[i],
            change=change,
            quantiles_before_s=per_a[i] if n_a[i] > 0 else (None,) * len(quantiles),
            quantiles_after_s=per_b[i] if n_b[i] > 0 else (None,) * len(quantiles),
            le_range_before_s=one_le_bucket(before, i), le_range_after_s=one_le_bucket(after, i),
        ))
    for name, n in (("earlier", before.unbucketed), ("later", after.unbucketed)):
        if n:
            notes.append(f"{n:,.0f} {before.metric} observations in no ISL bucket in the {name} window are left out")
    mean_a, mean_b = float(s_a.sum() / n_a.sum()), float(s_b.sum() / n_b.sum())
    interaction = float(((w_b - w_a) * (m_b - m_a)).sum())
    if abs(interaction) > min_share * (abs(mix_s) + abs(lat_s)) and abs(interaction) > 0:
        would, was, inter = format_times(lat_s - interaction, lat_s, interaction, signed=True)  # one unit
        notes.append(
            f"the buckets that changed latency also changed share: at the earlier mix the latency effect would be "
            f"{would}, not {was} (interaction {inter})"
        )
    return Explanation(
        metric=before.metric,
        labels=before.labels,
        exact=isinstance(before, PER_REQUEST),
        count_before=float(n_a.sum()),
        count_after=float(n_b.sum()),
        mean_before_s=mean_a,
        mean_after_s=mean_b,
        counterfactual_mean_s=cf.mean_s,
        quantiles=tuple(
            QuantileShift(q, x, y, z) for q, x, y, z in zip(quantiles, qa, qb, cf.quantiles_s, strict=True)
        ),
        mix_effect_s=mix_s,
        mix_effect_ci_s=ci.mix,
        latency_effect_s=lat_s,
        latency_effect_ci_s=ci.latency,
        interaction_s=interaction,
        verdict=decide_verdict(mix_s, ci.mix, lat_s, ci.latency, min_share),
        buckets=tuple(buckets),
        confidence=confidence,
        uncertainty=ci.method,
        limitations=tuple(notes),
        unbucketed_before=float(before.unbucketed),
        unbucketed_after=float(after.unbucketed),
        le_range_before_s=one_le_bucket(before),
        le_range_after_s=one_le_bucket(after),
        le_range_counterfactual_s=cf.histogram.single_bucket() if cf.histogram is not None else None,
    )
