"""Where the capacity is short (issue 17, section 5): per ISL bucket, TTFT split into time queued
and time in prefill, and the prefill throughput fitted from TTFT against uncached prompt tokens.

Definitions (vLLM v1, ``vllm/v1/metrics/stats.py``): a request's **queue time** runs from its
arrival at the engine to its admission into the running batch (its first prefill step is
scheduled); its **prefill time** from admission to its first output token. TTFT at the gateway or
client is ``queue + prefill + other`` (``other``: network, the gateway, the engine's front end).
Uncached prompt tokens: ISL minus the prefix cache's hit (``cached_tokens``); they are what prefill
pays for.

**The fit.** On an engine whose prefill costs ``c`` seconds per uncached token, a request's TTFT is
``a + c * uncached`` plus what it waited for other requests. ``scipy.stats.theilslopes`` (Theil-Sen:
the median of the pairwise slopes, robust to up to ~29 % outliers, such as requests stuck behind a
long prefill) fits ``TTFT = intercept + slope * uncached`` over per-request data; the **prefill
throughput** is ``1 / slope`` tokens/s and its interval comes from the slope's 95 % interval. The
intercept is the fixed overhead plus the typical wait (the queue floor); a fitted intercept below 0
is not shown as one (the verdict says "not resolved", and a note why: :func:`intercept_note`). Under
load a request's prefill shares its steps with other requests' decode and prefill, so the fitted figure is the
throughput a request sees, at or below the engine's own rate; attention cost, which grows with the
context, makes long prompts pay more per token than the line says. From histograms (no requests)
the fit is weighted least squares over the buckets' mean TTFT and mean uncached tokens (means keep
a linear relation exactly), and needs a prompt-token sum per bucket.

**Which buckets are short of what.** A bucket is ``queue``-limited when its mean queue time exceeds
its mean prefill time, else ``prefill``-limited; where the engine gives no split, the split is the
fit's: prefill ``= mean uncached / throughput``, the rest of the mean TTFT counted as waiting (it
includes the fixed overhead). vLLM's queue and prefill histograms are not per ISL bucket: from them
each bucket is taken to wait the engine's mean queue time (FIFO admission does not look at a
prompt's length), and its prefill is its mean TTFT minus that.

Every figure that cannot be made (no data, too few requests for a fit, a bucket with too few
requests to judge) is None with a note that says why; nothing is filled in silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servelens.core.buckets import IslBuckets
from servelens.core.prefill_fit import (
    FIT_MAX_POINTS,
    LOOSE_FIT,
    MIN_FIT_REQUESTS,
    PrefillFit,
    fit_bucket_means,
    fit_prefill,
)

MIN_BUCKET_REQUESTS = 5
"""A bucket with fewer requests than this is not judged (queue or prefill)."""

__all__ = ["FIT_MAX_POINTS", "LOOSE_FIT", "MIN_BUCKET_REQUESTS", "MIN_FIT_REQUESTS", "PREFILL", "QUEUE",
           "BucketCapacity", "BucketMeans", "CapacityReport", "CapacitySample", "EngineTimes", "PrefillFit",
           "capacity_from_histograms", "capacity_from_samples", "fit_bucket_means", "fit_prefill", "intercept_note",
           "verdict_line"]

QUEUE = "queue"
PREFILL = "prefill"


@dataclass(frozen=True)
class CapacitySample:
    """One request, for the capacity analysis.

    Attributes:
        isl: prompt tokens (the bucket).
        cached_tokens: prefix-cache hit in tokens (None: unknown).
        ttft_s: TTFT (s; None: no first token, the request is left out).
        queue_s, prefill_s: the engine's queue and prefill time of this request (s), None when the
            engine does not say.
    """

    isl: int
    cached_tokens: int | None
    ttft_s: float | None
    queue_s: float | None = None
    prefill_s: float | None = None

    @property
    def uncached(self) -> int | None:
        """``isl - cached_tokens`` (None when the cached tokens are unknown)."""
        return None if self.cached_tokens is None else max(0, self.isl - self.cached_tokens)


@dataclass(frozen=True)
class BucketCapacity:
    """One bucket's TTFT split (means, s) and what limits it.

    Attributes:
        label: bucket label.
        requests: requests with a TTFT.
        ttft_mean_s: mean TTFT.
        queue_mean_s, prefill_mean_s: mean queue and prefill time (None: not known).
        uncached_mean_tokens: mean uncached prompt tokens (None: not known).
        prefill_rate_tps: uncached tokens per second of prefill time in this bucket (sum over sum).
        limited_by: ``queue``, ``prefill``, or None (not judged: see the report's notes).
        split: where the split comes from: ``engine`` (per request), ``engine-wide`` (the engine's
            histograms, not per bucket), ``fit`` (TTFT minus the fitted prefill), or None.
    """

    label: str
    requests: int
    ttft_mean_s: float | None
    queue_mean_s: float | None
    prefill_mean_s: float | None
    uncached_mean_tokens: float | None
    prefill_rate_tps: float | None
    limited_by: str | None
    split: str | None

    @property
    def queue_share(self) -> float | None:
        """Queue time over queue plus prefill time (None without a split)."""
        if self.queue_mean_s is None or self.prefill_mean_s is None:
            return None
        total = self.queue_mean_s + self.prefill_mean_s
        return self.queue_mean_s / total if total > 0 else None


@dataclass(frozen=True)
class CapacityReport:
    """Per bucket (numeric order) the split and verdict, the fit, and the notes that qualify them."""

    buckets: tuple[BucketCapacity, ...]
    fit: PrefillFit | None
    notes: tuple[str, ...]
    engine_queue_mean_s: float | None = None
    engine_prefill_mean_s: float | None = None

    def waiting(self) -> tuple[str, ...]:
        """Labels of the buckets limited by the queue."""
        return tuple(b.label for b in self.buckets if b.limited_by == QUEUE)

    def prefilling(self) -> tuple[str, ...]:
        """Labels of the buckets limited by prefill."""
        return tuple(b.label for b in self.buckets if b.limited_by == PREFILL)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _judge(queue: float | None, prefill: float | None, requests: int) -> str | None:
    if queue is None or prefill is None or requests < MIN_BUCKET_REQUESTS:
        return None
    return QUEUE if queue > prefill else PREFILL


def _fit_split(fit: PrefillFit | None, ttft: float | None, uncached: float | None) -> tuple[float | None, float | None]:
    """(wait, prefill) means from the fit: prefill = uncached / throughput, the rest of the TTFT waiting."""
    if fit is None or ttft is None or uncached is None:
        return None, None
    prefill = min(ttft, uncached / fit.throughput_tps)
    return ttft - prefill, prefill


def _tokens(s: CapacitySample, x: str) -> int | None:
    return s.uncached if x == "uncached" else s.isl


def _bucket_from_samples(label: str, mine: Sequence[CapacitySample], x: str, fit: PrefillFit | None) -> BucketCapacity:
    ttfts = [s.ttft_s for s in mine if s.ttft_s is not None]
    ttft = _mean(ttfts)
    unc_mean = _mean([float(u) for u in (_tokens(s, x) for s in mine) if u is not None])
    eng = [(s.queue_s, s.prefill_s, _tokens(s, x) or 0) for s in mine
           if s.queue_s is not None and s.prefill_s is not None]
    queue: float | None
    prefill: float | None
    if eng:
        queue = _mean([q for q, _, _ in eng])
        prefill = _mean([p for _, p, _ in eng])
        pre_total = sum(p for _, p, _ in eng)
        tok_total = sum(t for _, _, t in eng)
        rate = tok_total / pre_total if pre_total > 0 and tok_total > 0 else None
        split: str | None = "engine"
    else:
        queue, prefill = _fit_split(fit, ttft, unc_mean)
        rate = fit.throughput_tps if fit is not None and prefill is not None else None
        split = "fit" if prefill is not None else None
    return BucketCapacity(label, len(mine), ttft, queue, prefill, unc_mean, rate,
                          _judge(queue, prefill, len(mine)), split)


def capacity_from_samples(samples: Sequence[CapacitySample], buckets: IslBuckets) -> CapacityReport:
    """Per-request analysis (bench results, joined with the engine's per-request times when known).

    The fit is against uncached tokens where cached tokens are known; when no request reports them,
    against ISL (a note says so). The split per bucket is the engine's (the bucket's requests with
    queue and prefill times) when given, else the fit's. Raises nothing: a figure that cannot be
    made is None, with a note.
    """
    notes: list[str] = []
    timed = [s for s in samples if s.ttft_s is not None]
    if not timed:
        notes.append("no request with a first token: nothing to split")
    known = [s for s in timed if s.uncached is not None]
    x = "uncached"
    if timed and not known:
        known, x = timed, "isl"
        notes.append("no request reported cached tokens: the fit is against ISL (exact only when the engine "
                     "has no prefix cache)")
    elif len(known) < len(timed):
        notes.append(f"{len(timed) - len(known)} of {len(timed)} requests without cached tokens are left out "
                     "of the fit")
    fit: PrefillFit | None = None
    if timed:
        pts = [(float(t), s.ttft_s) for s in known if (t := _tokens(s, x)) is not None and s.ttft_s is not None]
        fit, note = fit_prefill([t for t, _ in pts], [y for _, y in pts], x)
        notes += [n for n in (note, intercept_note(fit)) if n]
    with_engine = [s for s in timed if s.queue_s is not None and s.prefill_s is not None]
    if timed and not with_engine:
        notes.append("no queue or prefill time per request from the engine: the split is TTFT minus the fitted "
                     "prefill time, and the wait includes fixed overhead and time in steps shared with other "
                     "requests' prefill" if fit is not None else
                     "no queue or prefill time per request from the engine and no fit: no split")
    elif with_engine and len(with_engine) < len(timed):
        notes.append(f"{len(timed) - len(with_engine)} of {len(timed)} requests have no engine times: the split "
                     "is over the others")
    rows = [_bucket_from_samples(label, [s for s in timed if buckets.label(s.isl) == label], x, fit)
            for label in buckets.labels]
    small = [r.label for r in rows if 0 < r.requests < MIN_BUCKET_REQUESTS]
    if small:
        notes.append(f"fewer than {MIN_BUCKET_REQUESTS} requests in {', '.join(small)}: not judged")
    return CapacityReport(tuple(rows), fit, tuple(notes))


@dataclass(frozen=True)
class BucketMeans:
    """What histograms give of one bucket: TTFT observations and their mean, and the mean
    uncached prompt tokens when the source has a prompt-token sum per bucket (else None)."""

    label: str
    requests: float
    ttft_mean_s: float | None
    uncached_mean_tokens: float | None


@dataclass(frozen=True)
class EngineTimes:
    """The engine's queue and prefill histograms over the window (vLLM's
    ``vllm:request_queue_time_seconds`` and ``vllm:request_prefill_time_seconds``): sums (s) and
    counts, all requests together (they carry no ISL bucket)."""

    queue_sum_s: float
    queue_count: float
    prefill_sum_s: float
    prefill_count: float


def capacity_from_histograms(per_bucket: Sequence[BucketMeans], engine: EngineTimes | None) -> CapacityReport:
    """Histogram analysis (``--metrics`` scrapes, ``--prometheus``): the split per bucket from the
    engine's histograms, each bucket taken to wait the engine's mean queue time (module docstring);
    the fit over bucket means when every bucket with requests has a mean uncached token count.
    A figure that cannot be made is None with a note."""
    notes: list[str] = []
    counts = [b.requests for b in per_bucket]
    if not any(c > 0 for c in counts):
        notes.append("no TTFT observations in any bucket: nothing to split")
    fit = None
    with_tokens = [b for b in per_bucket if b.requests > 0 and b.ttft_mean_s is not None]
    if with_tokens and all(b.uncached_mean_tokens is not None for b in with_tokens):
        fit, note = fit_bucket_means([b.uncached_mean_tokens for b in with_tokens],  # type: ignore[misc]
                                     [b.ttft_mean_s for b in with_tokens],  # type: ignore[misc]
                                     [b.requests for b in with_tokens])
        notes += [n for n in (note, intercept_note(fit)) if n]
    elif with_tokens:
        notes.append("prefill throughput: the fit needs uncached tokens per bucket: per-request data (bench "
                     "results) or a prompt-token sum per isl_bucket, which this source does not have")
    queue = prefill = None
    if engine is None or engine.queue_count <= 0 or engine.prefill_count <= 0:
        notes.append("no queue or prefill times from the engine (vllm:request_queue_time_seconds, "
                     "vllm:request_prefill_time_seconds): " + ("the split is TTFT minus the fitted prefill time"
                                                               if fit is not None else "no split"))
    else:
        queue = engine.queue_sum_s / engine.queue_count
        prefill = engine.prefill_sum_s / engine.prefill_count
        notes.append("the engine's queue and prefill histograms are not per ISL bucket: each bucket is taken to "
                     f"wait the engine's mean queue time ({queue:.3g} s; FIFO admission does not look at a "
                     "prompt's length), its prefill is its mean TTFT minus that")
    rows = []
    for b in per_bucket:
        n = round(b.requests)
        q: float | None
        p: float | None
        if queue is not None and b.ttft_mean_s is not None and b.requests > 0:
            q = min(queue, b.ttft_mean_s)
            p = b.ttft_mean_s - q
            split: str | None = "engine-wide"
        else:
            q, p = _fit_split(fit, b.ttft_mean_s, b.uncached_mean_tokens)
            split = "fit" if p is not None else None
        rate = (b.uncached_mean_tokens / p if b.uncached_mean_tokens and p else None)
        rows.append(BucketCapacity(b.label, n, b.ttft_mean_s if b.requests > 0 else None, q, p,
                                   b.uncached_mean_tokens, rate, _judge(q, p, n), split))
    return CapacityReport(tuple(rows), fit, tuple(notes), queue, prefill)


def intercept_note(fit: PrefillFit | None) -> str | None:
    """The note for a fit whose intercept is below 0 (None otherwise): no overhead or wait is negative,
    so the line says nothing of the fixed overhead + queue floor. The usual cause: TTFT grows faster
    than linearly with the prompt (attention's cost rises with the context), so the line through the
    long prompts meets 0 tokens below 0."""
    if fit is None or fit.intercept_s >= 0:
        return None
    return (f"prefill throughput: the fitted line's intercept is {fit.intercept_s * 1000:.1f} ms, below 0, which "
            "no overhead or wait can be: TTFT is not linear in the prompt's tokens here (attention makes long "
            "prompts cost more per token), so the fixed overhead + queue floor cannot be read from the fit")


def verdict_line(report: CapacityReport) -> str:
    """One line: which buckets wait in the queue and which are slow to prefill, and the fit, e.g.
    ``where the capacity is short: 0-512, 513-1024 wait in the queue (queue 54-84% of queue +
    prefill); 2049-4096, 16385+ are slow to prefill (prefill 72-83%); prefill throughput 5,991
    tokens/s, fixed overhead + queue floor 300 ms``."""
    parts = []
    by = {b.label: b for b in report.buckets}
    judged = [b for b in report.buckets if b.limited_by is not None]
    for labels, queued in ((report.waiting(), True), (report.prefilling(), False)):
        shares = [q if queued else 1 - q for q in (by[label].queue_share for label in labels) if q is not None]
        if not labels or not shares:
            continue
        lo, hi = min(shares) * 100, max(shares) * 100
        span = f"{lo:.0f}%" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}%"
        every = len(labels) == len(judged) > 1
        who = "every bucket" if every else ", ".join(labels)
        if queued:
            parts.append(f"{who} {'waits' if every else 'wait'} in the queue (queue {span} of queue + prefill)")
        else:
            parts.append(f"{who} {'is' if every else 'are'} slow to prefill (prefill {span} of queue + prefill)")
    if not parts:
        parts.append("no bucket could be judged (see the notes)")
    if report.fit is not None:
        f = report.fit
        floor = (f"fixed overhead + queue floor {f.intercept_s * 1000:.0f} ms" if f.intercept_s >= 0 else
                 f"fixed overhead + queue floor not resolved (the fit's intercept is {f.intercept_s * 1000:.0f} ms, "
                 "below 0: see the note)")
        parts.append(f"prefill throughput {f.throughput_tps:,.0f} tokens/s, {floor}")
    return "where the capacity is short: " + "; ".join(parts)
