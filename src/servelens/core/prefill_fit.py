"""The prefill throughput fitted from TTFT against uncached prompt tokens (issue 17, section 5;
used by :mod:`servelens.core.capacity`, whose docstring has the method): Theil-Sen over requests,
weighted least squares over bucket means. Pure: numbers in, a frozen fit or a note out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

MIN_FIT_REQUESTS = 20
"""Fewer requests with a TTFT and known uncached tokens than this: no fit (a note says so)."""
FIT_MAX_POINTS = 2000
"""Theil-Sen compares every pair of points (n^2 / 2): above this many, an evenly spaced subset
(every k-th request in order) is fitted."""
LOOSE_FIT = 2.0
"""A fit whose throughput interval spans more than this factor is reported with a note."""


@dataclass(frozen=True)
class PrefillFit:
    """``TTFT = intercept_s + uncached / throughput_tps`` (see the module docstring).

    Attributes:
        requests: points fitted (requests, or buckets for a fit over bucket means).
        throughput_tps: prefill throughput, uncached tokens per second.
        throughput_low_tps, throughput_high_tps: its 95 % interval (None for a fit over bucket
            means; ``inf`` at the top when the slope's interval reaches 0).
        intercept_s: fixed overhead plus typical wait (s).
        x: what the fit is against: ``uncached`` tokens, or ``isl`` when no cached tokens were
            reported (exact when the engine has no prefix cache).
        method: ``theil-sen`` (per-request data) or ``wls-bucket-means`` (histograms).
    """

    requests: int
    throughput_tps: float
    throughput_low_tps: float | None
    throughput_high_tps: float | None
    intercept_s: float
    x: str
    method: str


def fit_prefill(uncached: Sequence[float], ttft_s: Sequence[float],
                x: str = "uncached") -> tuple[PrefillFit | None, str | None]:
    """Theil-Sen fit of TTFT (s) against uncached tokens, one point per request.

    Returns ``(fit, None)``, ``(None, note)`` (fewer than :data:`MIN_FIT_REQUESTS` points, one
    prompt length only, or TTFT not growing with the prompt: slope <= 0, the wait swamps prefill),
    or ``(fit, note)`` for a loose fit (its interval's ends more than :data:`LOOSE_FIT` x apart).
    Raises ValueError when the two sequences differ in length.
    """
    if len(uncached) != len(ttft_s):
        raise ValueError(f"{len(uncached)} token counts for {len(ttft_s)} TTFTs")
    n = len(uncached)
    if n < MIN_FIT_REQUESTS:
        return None, (f"prefill throughput: {n} request(s) with a TTFT and known prompt tokens, a fit needs "
                      f"at least {MIN_FIT_REQUESTS}")
    xs = np.asarray(uncached, dtype=float)
    ys = np.asarray(ttft_s, dtype=float)
    if n > FIT_MAX_POINTS:
        keep = np.linspace(0, n - 1, FIT_MAX_POINTS).round().astype(int)
        xs, ys = xs[keep], ys[keep]
    if np.unique(xs).size < 2:
        return None, "prefill throughput: every request has the same uncached token count: nothing to fit a slope to"
    res = stats.theilslopes(ys, xs, alpha=0.95, method="joint")  # intercept: median(y - slope * x)
    slope, intercept, low, high = float(res.slope), float(res.intercept), float(res.low_slope), float(res.high_slope)
    if not slope > 0:
        return None, ("prefill throughput: TTFT does not grow with the uncached tokens (the fitted slope is "
                      f"{slope:.3g} s/token): waiting swamps prefill, no throughput can be read")
    fit = PrefillFit(n, 1.0 / slope, 1.0 / high if high > 0 else 0.0, 1.0 / low if low > 0 else math.inf,
                     intercept, x, "theil-sen")
    assert fit.throughput_low_tps is not None and fit.throughput_high_tps is not None
    if fit.throughput_high_tps > LOOSE_FIT * fit.throughput_low_tps:
        return fit, (f"prefill throughput: a loose fit (95% interval {fit.throughput_low_tps:,.0f}-"
                     f"{fit.throughput_high_tps:,.0f} tokens/s): TTFT here is mostly waiting, not prefill")
    return fit, None


def fit_bucket_means(uncached_mean: Sequence[float], ttft_mean_s: Sequence[float], counts: Sequence[float],
                     x: str = "uncached") -> tuple[PrefillFit | None, str | None]:
    """Least-squares fit of the buckets' mean TTFT against their mean uncached tokens, weighted by
    their request counts. Needs three buckets with requests; returns ``(fit, None)`` or ``(None, note)``."""
    pts = [(u, t, c) for u, t, c in zip(uncached_mean, ttft_mean_s, counts, strict=True) if c > 0]
    if len(pts) < 3:
        return None, f"prefill throughput: {len(pts)} bucket(s) with requests, a fit over bucket means needs 3"
    xs, ys, ws = (np.array(v, dtype=float) for v in zip(*pts, strict=True))
    if np.ptp(xs) <= 0:
        return None, "prefill throughput: every bucket has the same mean uncached tokens: nothing to fit"
    slope, intercept = np.polyfit(xs, ys, 1, w=np.sqrt(ws))
    if not slope > 0:
        return None, ("prefill throughput: mean TTFT does not grow with the buckets' uncached tokens: waiting "
                      "swamps prefill, no throughput can be read")
    return PrefillFit(len(pts), 1.0 / float(slope), None, None, float(intercept), x, "wls-bucket-means"), None
