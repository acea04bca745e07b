"""Quantile math: exact percentiles of raw values, and Prometheus' ``histogram_quantile``."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """Exact percentile of ``values`` for ``q`` in [0, 100], linear interpolation between
    closest ranks (numpy's default method, as used by vLLM's and aiperf's benchmarks).

    Returns NaN for an empty sequence. Raises ValueError if ``q`` is outside [0, 100].
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    if len(values) == 0:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=float), q))


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus ``histogram_quantile(q, ...)`` over one classic histogram.

    Args:
        q: quantile in [0, 1] (0.95 for p95).
        buckets: cumulative ``(le, count)`` pairs in increasing ``le`` order; the last ``le``
            should be ``+Inf`` (counts may be floats, e.g. rates or deltas).

    Returns NaN for no observations; like Prometheus, the lower bound of the first bucket is 0
    (unless its upper bound is <= 0), a quantile landing in ``+Inf`` returns the highest finite
    ``le``, and values interpolate linearly inside the bucket.
    Source: prometheus/promql/quantile.go (bucketQuantile).
    """
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if not buckets or not math.isinf(buckets[-1][0]):
        return math.nan
    total = buckets[-1][1]
    if total <= 0 or len(buckets) < 2:
        return math.nan
    rank = q * total
    idx = 0
    while idx < len(buckets) - 1 and buckets[idx][1] < rank:
        idx += 1
    if idx == len(buckets) - 1:
        return buckets[-2][0]
    if idx == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start = 0.0
    end = buckets[idx][0]
    count = buckets[idx][1]
    if idx > 0:
        start = buckets[idx - 1][0]
        count -= buckets[idx - 1][1]
        rank -= buckets[idx - 1][1]
    if count == 0:
        return end
    return start + (end - start) * (rank / count)


def bucket_bounds(value: float, edges: Sequence[float]) -> tuple[float, float]:
    """The ``(lower, upper]`` ``le`` bucket that holds ``value`` (upper is inf past the last edge)."""
    lower = 0.0 if edges and edges[0] > 0 else -math.inf
    for e in edges:
        if value <= e:
            return lower, e
        lower = e
    return lower, math.inf


def weighted_quantile(values: Sequence[float] | np.ndarray, weights: Sequence[float] | np.ndarray, q: float) -> float:
    """Quantile ``q`` in [0, 1] of the discrete distribution that puts ``weights[i]`` on ``values[i]``:
    the smallest value whose cumulative weight share reaches ``q`` (inverted CDF, Hyndman & Fan
    type 1; numpy's ``method="inverted_cdf"``). With equal weights it is that method's unweighted
    quantile, which differs from :func:`percentile` (linear) by at most one gap between adjacent values.

    It is exact for a reweighted sample, and it lies in the same ``le`` bucket as Prometheus'
    ``histogram_quantile`` of the same weights binned by ``le`` (both cross ``q`` in that bucket).
    Zero weights are allowed. Returns NaN when the total weight is 0. Raises ValueError for
    ``q`` outside [0, 1], a negative or non-finite weight, or lengths that differ.
    """
    return weighted_quantiles(values, weights, (q,))[0]


def weighted_quantiles(
    values: Sequence[float] | np.ndarray, weights: Sequence[float] | np.ndarray, qs: Sequence[float]
) -> tuple[float, ...]:
    """:func:`weighted_quantile` at every ``q`` of ``qs`` (the same floats), sorting once; with every
    weight 1 the ranks are whole numbers and a partial sort (``np.partition``) finds them. Raises as
    :func:`weighted_quantile`."""
    for q in qs:
        if not 0 <= q <= 1:
            raise ValueError(f"quantile must be within [0, 1], got {q}")
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    if v.shape != w.shape:
        raise ValueError(f"values and weights differ in length: {v.size} and {w.size}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and >= 0")
    if bool(np.all(w == 1)):  # cumulative weights 1..n, exact: the rank searchsorted would find
        n = v.size
        if n == 0:
            return tuple(math.nan for _ in qs)
        ranks = [min(max(math.ceil(q * float(n) * (1 - 1e-12)) - 1, 0), n - 1) for q in qs]
        part = np.partition(v, sorted(set(ranks)))
        return tuple(float(part[r]) for r in ranks)
    keep = w > 0
    v, w = v[keep], w[keep]
    if v.size == 0:
        return tuple(math.nan for _ in qs)
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    ordered = v[order]
    # a relative tolerance so that q * total landing exactly on a cumulative step is not missed by rounding
    idx = [int(np.searchsorted(cum, q * cum[-1] * (1 - 1e-12), side="left")) for q in qs]
    return tuple(float(ordered[min(i, v.size - 1)]) for i in idx)
