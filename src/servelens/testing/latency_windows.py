"""Synthetic latency windows for tests of the latency-change analysis: seeded numpy, no clock.

A window draws its requests' buckets from a mix (multinomial) and each request's latency from a
lognormal whose median is the bucket's (:data:`MEDIANS_S`, times a per-bucket slowdown factor), so
a test knows the true per-bucket means and hence the true shift-share split (:func:`true_split`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from servelens.core.buckets import IslBuckets
from servelens.core.edges import TTFT_EDGES_S
from servelens.core.histogram import HistogramState
from servelens.core.summary import CumulativeHistogram
from servelens.core.windows import BucketSamples, HistogramWindow, SampleWindow

BUCKETS = IslBuckets.default()
MEDIANS_S = (0.05, 0.08, 0.15, 0.4, 0.9, 2.0, 4.0)
"""Median latency per bucket of the default seven (s)."""
SIGMA = 0.4
"""Lognormal shape of every bucket."""
EARLY_MIX = (30, 20, 15, 15, 10, 7, 3)
LATE_MIX = (12, 8, 10, 15, 15, 20, 20)
"""Two bucket mixes (relative weights): the later one shifted toward long prompts."""

Slow = Mapping[int, float] | None
"""Slowdown factor per bucket index (missing: 1)."""
Weights = Sequence[float] | np.ndarray
"""A bucket mix as relative weights."""


def medians_s(slow: Slow = None) -> np.ndarray:
    """Median latency per bucket (s) with the slowdown applied."""
    return np.array(MEDIANS_S) * np.array([(slow or {}).get(k, 1.0) for k in range(len(MEDIANS_S))])


def true_split(mix_a: Weights, mix_b: Weights, slow: Slow = None) -> tuple[float, float]:
    """The true (mix, latency) split of the mean (s) between two generating setups (the earlier
    unslowed, the later with ``slow``): the lognormal means are ``median * exp(SIGMA**2 / 2)``."""
    wa, wb = np.array(mix_a) / sum(mix_a), np.array(mix_b) / sum(mix_b)
    ma, mb = medians_s() * math.exp(SIGMA**2 / 2), medians_s(slow) * math.exp(SIGMA**2 / 2)
    return float(((wb - wa) * ma).sum()), float((wb * (mb - ma)).sum())


def sample_window(seed: int, mix: Weights, n: int, slow: Slow = None, metric: str = "TTFT") -> SampleWindow:
    """``n`` requests, one observation each, buckets drawn from ``mix``."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, np.array(mix) / sum(mix))
    med = medians_s(slow)
    return SampleWindow(metric, BUCKETS.labels, tuple(
        BucketSamples(tuple(float(x) for x in rng.lognormal(math.log(med[k]), SIGMA, c))) for k, c in enumerate(counts)
    ))


def clustered_window(seed: int, mix: Weights, n: int, tokens: int, slow: Slow = None) -> SampleWindow:
    """``n`` requests of ``tokens`` observations each (ITL-like): every request has its own level
    (lognormal around the bucket median) and its tokens vary a little around it, so the tokens of
    one request are strongly correlated."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, np.array(mix) / sum(mix))
    med = medians_s(slow)
    buckets = []
    for k, c in enumerate(counts):
        levels = rng.lognormal(math.log(med[k]), SIGMA, c)
        values = (levels[:, None] * rng.lognormal(0.0, 0.05, (c, tokens))).ravel()
        buckets.append(BucketSamples(tuple(float(x) for x in values), (tokens,) * int(c)))
    return SampleWindow("ITL", BUCKETS.labels, tuple(buckets))


def varied_window(seed: int, mix: Weights, n: int, slow: Slow = None) -> SampleWindow:
    """``n`` requests with 1 to ~200 observations each (ITL-like, lengths lognormal): each request
    has its own level (lognormal around the bucket median), longer requests a little slower (as
    attention over a longer context costs), and its tokens vary a little around its level; so a
    bucket's mean is a ratio of sums whose numerator and denominator move together."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, np.array(mix) / sum(mix))
    med = medians_s(slow)
    buckets = []
    for k, c in enumerate(counts):
        sizes = np.minimum(np.ceil(rng.lognormal(3.0, 1.0, c)), 200).astype(np.int64)
        levels = rng.lognormal(math.log(med[k]), SIGMA, c) * (1 + sizes / 400)
        values = np.repeat(levels, sizes) * rng.lognormal(0.0, 0.05, int(sizes.sum()))
        buckets.append(BucketSamples(values, sizes))
    return SampleWindow("ITL", BUCKETS.labels, tuple(buckets))


def binned(w: SampleWindow, edges: Sequence[float] = TTFT_EDGES_S) -> HistogramWindow:
    """The same window as histograms with ``le`` ``edges`` (what a scrape pair would give)."""
    hists = []
    for b in w.buckets:
        h = HistogramState(tuple(float(e) for e in edges))
        for v in b.values_s:
            h.observe(v)
        hists.append(CumulativeHistogram(tuple((le, float(c)) for le, c in h.cumulative()), h.sum))
    return HistogramWindow(w.metric, w.labels, tuple(hists))


def central_difference_variance(split: Callable[[np.ndarray, np.ndarray], np.ndarray], wa: np.ndarray,
                                wb: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """The infinitesimal jackknife's variance of ``split`` by central differences: the sum over every
    unit weight of both windows (``wa``, ``wb``: one float per unit, 1 each) of
    ``((split(w + eps) - split(w - eps)) / (2 eps)) ** 2``, elementwise over ``split``'s output array.
    The reference that :func:`servelens.core.uncertainty.delta_split` is checked against (its docstring
    gives the definition)."""
    var = np.zeros_like(split(wa, wb))
    for side, w in ((0, wa), (1, wb)):
        for i in range(w.size):
            up, down = w.copy(), w.copy()
            up[i] += eps
            down[i] -= eps
            hi = split(up, wb) if side == 0 else split(wa, up)
            lo = split(down, wb) if side == 0 else split(wa, down)
            var += ((hi - lo) / (2 * eps)) ** 2
    return var
