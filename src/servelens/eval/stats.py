"""Paired statistics for comparing two deployments on the same items (scipy; no I/O).

* One run per side, right/wrong items: the McNemar exact test (:func:`mcnemar_exact`) on b = items only
  A got right and c = items only B got right, and the Wald interval of the paired difference of
  accuracies (:func:`paired_wald_ci`).
* Repeated runs, or scores that are not 0/1: per-item means over runs, then a paired sign-flip
  permutation test (:func:`paired_permutation_p`) and a paired bootstrap interval
  (:func:`paired_bootstrap_ci`) on the per-item differences. N items x K runs are never treated as
  N x K independent replies.
* Many groups: Holm's step-down adjustment (:func:`holm`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

BOOTSTRAP_RESAMPLES = 9999
PERMUTATION_RESAMPLES = 9999
SPREAD_FACTOR = 2.0
"""With repeated runs a gap is "clearly larger than the run-to-run spread" when it exceeds this many
run-to-run standard deviations (the larger of the two sides')."""


def mcnemar_exact(b: int, c: int) -> float:
    """McNemar's exact test: the two-sided binomial test of ``b`` successes in ``b + c`` trials at
    p = 0.5 (``scipy.stats.binomtest``); 1.0 when ``b + c == 0``.

    Args:
        b: items only A got right. c: items only B got right.
    Source: McNemar (1947); the exact (binomial) form as in Fagerland et al., BMC Med Res Methodol 2013.
    """
    if b < 0 or c < 0:
        raise ValueError("b and c must be counts >= 0")
    if b + c == 0:
        return 1.0
    return float(stats.binomtest(b, b + c, 0.5).pvalue)


def paired_wald_ci(b: int, c: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wald interval of ``acc_B - acc_A`` for paired right/wrong items.

    ``d = (c - b) / n``, ``se = sqrt(b + c - (c - b)^2 / n) / n``, ``d -/+ z * se`` with ``z`` the normal
    quantile (``scipy.stats.norm.ppf``). Source: Agresti, Categorical Data Analysis (3rd ed.), 10.1.1.

    Args:
        b, c: as in :func:`mcnemar_exact`. n: paired items (> 0).
    """
    if n <= 0:
        raise ValueError("n must be > 0")
    d = (c - b) / n
    se = float(np.sqrt(max(0.0, b + c - (c - b) ** 2 / n))) / n
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    return d - z * se, d + z * se


def paired_bootstrap_ci(
    diffs: Sequence[float], confidence: float = 0.95, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean of per-item differences (items resampled with
    replacement: the pairing is kept; ``scipy.stats.bootstrap``). All differences equal: that value."""
    d = np.asarray(diffs, dtype=float)
    if d.size == 0:
        raise ValueError("no paired items")
    if np.all(d == d[0]):
        return float(d[0]), float(d[0])
    res = stats.bootstrap((d,), np.mean, confidence_level=confidence, n_resamples=resamples,
                          method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def paired_permutation_p(diffs: Sequence[float], seed: int = 0, resamples: int = PERMUTATION_RESAMPLES) -> float:
    """Two-sided p-value of "the mean per-item difference is 0": the signs of the differences are
    flipped at random (``scipy.stats.permutation_test``, ``permutation_type="samples"``; exact when
    2^n <= ``resamples``). All differences 0, or one item: 1.0 (one item's two sign patterns both
    reach its ``|mean|``; scipy refuses a single observation). Raises ValueError for no items."""
    d = np.asarray(diffs, dtype=float)
    if d.size == 0:
        raise ValueError("no paired items")
    if d.size == 1 or not np.any(d):
        return 1.0
    res = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=resamples,
                                 alternative="two-sided", rng=np.random.default_rng(seed))
    return float(min(1.0, res.pvalue))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: sorted ascending, the i-th (0-based) of m
    is multiplied by ``m - i``, made non-decreasing, capped at 1. Source: Holm, Scand. J. Statist. 1979.
    (scipy has Benjamini-Hochberg, ``false_discovery_control``, but not Holm.)"""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


@dataclass(frozen=True)
class Paired:
    """The paired comparison of per-item scores of A and B.

    Attributes:
        n: paired items.
        only_a, only_b: items whose (mean) score is higher in A / in B (single runs of right/wrong
            items: only A right / only B right, McNemar's b and c).
        difference: mean per-item score of B minus that of A.
        ci_low, ci_high: its confidence interval (Wald for McNemar's case, else paired bootstrap).
        p_value: McNemar exact, or the paired permutation test.
        test: ``"mcnemar-exact"`` or ``"paired-permutation"``.
    """

    n: int
    only_a: int
    only_b: int
    difference: float
    ci_low: float
    ci_high: float
    p_value: float
    test: str


def compare_scores(
    a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], confidence: float = 0.95, seed: int = 0
) -> Paired:
    """Compare per-item scores; ``a[i]`` and ``b[i]`` are item i's scores over the runs of each side.

    One run per side with 0/1 scores: McNemar exact and the Wald interval. Otherwise per-item means,
    the paired permutation test and the paired bootstrap interval. Raises ValueError for no items, an
    item without scores, or ``a`` and ``b`` of different lengths.
    """
    if len(a) != len(b) or not a:
        raise ValueError("need the same items, at least one, on both sides")
    if any(not s for s in a) or any(not s for s in b):
        raise ValueError("every item needs at least one score on each side")
    ma = np.array([float(np.mean(s)) for s in a])
    mb = np.array([float(np.mean(s)) for s in b])
    only_a, only_b = int(np.sum(ma > mb)), int(np.sum(mb > ma))
    n = len(a)
    binary = all(v in (0.0, 1.0) for s in (*a, *b) for v in s)
    if binary and all(len(s) == 1 for s in (*a, *b)):
        lo, hi = paired_wald_ci(only_a, only_b, n, confidence)
        return Paired(n, only_a, only_b, (only_b - only_a) / n, lo, hi, mcnemar_exact(only_a, only_b),
                      "mcnemar-exact")
    d = mb - ma
    lo, hi = paired_bootstrap_ci(d, confidence, seed)
    return Paired(n, only_a, only_b, float(np.mean(d)), lo, hi, paired_permutation_p(d, seed), "paired-permutation")


def real_difference(p_value: float, alpha: float, gap: float, sd_a: float | None, sd_b: float | None) -> bool:
    """The verdict: ``p_value < alpha``, and, when either side has a run-to-run SD (``--runs`` >= 2), the
    gap between the sides' headlines larger than :data:`SPREAD_FACTOR` times the larger SD."""
    if not p_value < alpha:
        return False
    spreads = [s for s in (sd_a, sd_b) if s is not None]
    return not spreads or abs(gap) > SPREAD_FACTOR * max(spreads)
