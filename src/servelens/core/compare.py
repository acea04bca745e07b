"""Compare two bench runs bucket by bucket: per ISL bucket and metric (TTFT, ITL), the p50/p95/p99
of each run, a bootstrap confidence interval on their difference, and a verdict: ``faster``,
``slower``, ``no significant change`` (or ``mixed``, ``too few requests``).

Method (issue 17, section 4):

* Quantiles are numpy's default (linear interpolation between closest ranks), so a run's figures
  equal the per-bucket table's (:func:`servelens.core.summary.rows_from_samples`).
* Each run's bucket is resampled on its own, whole requests with replacement (ITL: a request's
  tokens together), ``resamples`` times, seeded. The interval on ``candidate - baseline`` is the
  *normal bootstrap interval*, the difference +- ``z`` times the standard deviation of the resampled
  differences (steadier than percentile bounds at the small tail levels below).
* ``z`` is Bonferroni-adjusted over every (bucket, quantile) judged for the metric: level
  ``1 - (1 - confidence) / J``, so two runs of an unchanged engine show "no significant change"
  everywhere with probability about ``confidence``.
* A quantile is judged only when, in each run, at least :data:`MIN_TAIL` distinct requests have an
  observation above it (a bootstrap cannot see a tail it barely has: a TTFT p99 needs about 500
  requests; for ITL, tokens of one request do not count twice) and the bucket has at least
  :data:`~servelens.core.decompose.MIN_BUCKET_REQUESTS` requests; otherwise ``too few requests``.
* A bucket is ``slower`` when some judged quantile is significantly slower and none faster,
  ``faster`` the other way round, ``mixed`` when both occur (e.g. p50 faster, p99 slower), ``no
  significant change`` when none is, and ``too few requests`` when no quantile could be judged; a
  bucket without requests in a run is ``only in the baseline run`` / ``only in the candidate run``, or
  ``no data in either run`` (``servelens explain`` says the same of its windows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servelens.core.decompose import DEFAULT_QUANTILES, FASTER, MIN_BUCKET_REQUESTS, SLOWER, TOO_FEW, UNCHANGED
from servelens.core.uncertainty import Interval, z_value
from servelens.core.windows import BucketSamples, ExplainError, SampleWindow

MIXED = "mixed"
ONLY_BASELINE, ONLY_CANDIDATE = "only in the baseline run", "only in the candidate run"
NO_DATA_RUNS = "no data in either run"
"""A bucket without requests in one run, or in both: nothing to compare (``too few requests`` is for a
bucket that has some, too few to judge)."""
MIN_TAIL = 5
"""Distinct requests each run needs above a quantile for it to be judged."""

_CHUNK_CELLS = 2_000_000


@dataclass(frozen=True)
class QuantileDiff:
    """One quantile of one bucket in both runs (s).

    Attributes:
        q: the quantile (0.95 for p95).
        baseline_s, candidate_s: the quantile in each run (None when the bucket is empty there).
        diff_s: ``candidate_s - baseline_s`` (None when either is).
        ci_s: the interval on ``diff_s`` (None when not judged).
        verdict: ``faster``, ``slower``, ``no significant change`` or ``too few requests``; for a
            bucket empty in a run ``only in the baseline run`` / ``only in the candidate run``, or ``no
            data in either run``.
    """

    q: float
    baseline_s: float | None
    candidate_s: float | None
    diff_s: float | None
    ci_s: Interval | None
    verdict: str


@dataclass(frozen=True)
class BucketComparison:
    """One ISL bucket of one metric in two runs; ``verdict`` sums up its quantiles (module docstring)."""

    label: str
    metric: str
    requests_baseline: int
    requests_candidate: int
    quantiles: tuple[QuantileDiff, ...]
    verdict: str


def linear_quantiles(sorted_values: np.ndarray, weights: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """numpy's linear quantiles of the sample that holds ``sorted_values[j]`` ``weights[r, j]``
    times (integer weights), for every row ``r``: shape ``(rows, len(qs))``; NaN for an empty row.
    With all weights 1 it is ``np.quantile(sorted_values, qs)``."""
    rows, n = weights.shape
    # one running count over the rows laid end to end: sorted, so one searchsorted serves every row
    flat = np.cumsum(np.ascontiguousarray(weights, dtype=np.int64).ravel())
    ends = flat[n - 1::n]
    total = np.diff(ends, prepend=0)
    shift = ends - total  # the count before each row
    h = np.asarray(qs, dtype=float)[None, :] * (total[:, None] - 1)
    lo = np.floor(h).astype(np.int64)

    def at_rank(rank: np.ndarray) -> np.ndarray:
        """The value at 0-based rank of the expanded sample: the first j whose cumulative count exceeds it."""
        j = np.searchsorted(flat, (rank + shift[:, None]).ravel(), side="right").reshape(rank.shape)
        return sorted_values[np.clip(j - np.arange(rows)[:, None] * n, 0, n - 1)]

    low = at_rank(lo)
    v = low + (h - lo) * (at_rank(lo + 1) - low)
    return np.where(total[:, None] > 0, v, np.nan)


def _order(b: BucketSamples) -> tuple[np.ndarray, np.ndarray, int]:
    """Sorted values, the request each sorted value belongs to, and the number of requests."""
    sizes = b.request_sizes()
    owner = np.repeat(np.arange(sizes.size), sizes)
    order = np.argsort(np.asarray(b.values_s, dtype=float), kind="stable")
    return np.asarray(b.values_s, dtype=float)[order], owner[order], sizes.size


def bootstrap_quantiles(
    b: BucketSamples, qs: Sequence[float], resamples: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The bucket's linear quantiles ``(len(qs),)`` and their bootstrap resamples
    ``(resamples, len(qs))``, whole requests drawn with replacement."""
    values, owner, n_req = _order(b)
    point = linear_quantiles(values, np.ones((1, values.size)), qs)[0]
    reps = np.empty((resamples, len(qs)))
    chunk = max(1, min(resamples, _CHUNK_CELLS // max(values.size, n_req, 1)))
    for start in range(0, resamples, chunk):
        r = min(chunk, resamples - start)
        idx = rng.integers(0, n_req, size=(r, n_req))
        drawn = np.bincount((np.arange(r)[:, None] * n_req + idx).ravel(), minlength=r * n_req).reshape(r, n_req)
        # np.take keeps C order (drawn[:, owner] does not, and costs a copy later)
        reps[start:start + r] = linear_quantiles(values, np.take(drawn, owner, axis=1), qs)
    return point, reps


def _summary(verdicts: Sequence[str]) -> str:
    if verdicts and all(v in (NO_DATA_RUNS, ONLY_BASELINE, ONLY_CANDIDATE) for v in verdicts):
        return verdicts[0]  # an empty bucket's quantiles all say the same
    judged = [v for v in verdicts if v != TOO_FEW]
    if not judged:
        return TOO_FEW
    slower, faster = SLOWER in judged, FASTER in judged
    return MIXED if slower and faster else SLOWER if slower else FASTER if faster else UNCHANGED


def _judged(b: BucketSamples, q: float) -> bool:
    """Enough requests, and enough distinct requests above the quantile (module docstring)."""
    if b.request_sizes().size < MIN_BUCKET_REQUESTS or b.count * (1 - q) < MIN_TAIL:
        return False
    values, owner, _ = _order(b)
    cut = linear_quantiles(values, np.ones((1, values.size)), (q,))[0, 0]
    return int(np.unique(owner[values > cut]).size) >= MIN_TAIL


def compare_runs(
    baseline: SampleWindow,
    candidate: SampleWindow,
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[BucketComparison, ...]:
    """Per bucket (numeric order), ``candidate`` against ``baseline`` for one metric (module docstring).

    Raises ExplainError when the runs hold different metrics or ISL buckets, or either run has no
    observations; ValueError for a bad ``confidence``, ``resamples`` or quantile.
    """
    if baseline.metric != candidate.metric:
        raise ExplainError(f"the runs hold different metrics: {baseline.metric} and {candidate.metric}")
    if baseline.labels != candidate.labels:
        raise ExplainError(
            f"the ISL buckets differ between the runs ({', '.join(baseline.labels)}; {', '.join(candidate.labels)}): "
            "re-read both with the same --isl-buckets"
        )
    for name, w in (("baseline", baseline), ("candidate", candidate)):
        if w.counts().sum() <= 0:
            raise ExplainError(f"the {name} run has no {w.metric} observations in any ISL bucket")
    if resamples < 2:
        raise ValueError(f"resamples must be >= 2, got {resamples}")
    if any(not 0 <= q <= 1 for q in quantiles):
        raise ValueError("quantiles must be within [0, 1]")
    judged = [
        [_judged(a, q) and _judged(c, q) for q in quantiles]
        for a, c in zip(baseline.buckets, candidate.buckets, strict=True)
    ]
    z = z_value(1 - (1 - confidence) / max(sum(map(sum, judged)), 1))
    rng = np.random.default_rng(seed)
    out = []
    for label, a, c, ok in zip(baseline.labels, baseline.buckets, candidate.buckets, judged, strict=True):
        diffs = []
        if not (a.count and c.count):
            empty = NO_DATA_RUNS if not (a.count or c.count) else ONLY_CANDIDATE if not a.count else ONLY_BASELINE
            diffs = [QuantileDiff(q, _point(a, q), _point(c, q), None, None, empty) for q in quantiles]
            quantiles_left: Sequence[float] = ()
        else:
            reps = resamples if any(ok) else 0  # nothing judged: the point figures only
            pa, ra = bootstrap_quantiles(a, quantiles, reps, rng)
            pc, rc = bootstrap_quantiles(c, quantiles, reps, rng)
            quantiles_left = quantiles
        for k, q in enumerate(quantiles_left):
            diff = float(pc[k] - pa[k])
            if not ok[k]:
                diffs.append(QuantileDiff(q, float(pa[k]), float(pc[k]), diff, None, TOO_FEW))
                continue
            d = rc[:, k] - ra[:, k]
            sd = float(np.nanstd(d, ddof=1))
            ci = (diff - z * sd, diff + z * sd)
            verdict = SLOWER if ci[0] > 0 else FASTER if ci[1] < 0 else UNCHANGED
            diffs.append(QuantileDiff(q, float(pa[k]), float(pc[k]), diff, ci, verdict))
        out.append(BucketComparison(
            label, baseline.metric, a.request_sizes().size, c.request_sizes().size,
            tuple(diffs), _summary([d.verdict for d in diffs]),
        ))
    return tuple(out)


def _point(b: BucketSamples, q: float) -> float | None:
    return float(np.quantile(np.asarray(b.values_s, dtype=float), q)) if b.count else None
