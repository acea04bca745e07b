"""The per-bucket latency table as data: one :class:`BucketRow` per ISL bucket plus "all".

Two ways to fill it:

* :func:`rows_from_samples`: exact percentiles from per-request samples (a bench results file).
* :func:`rows_from_histograms`: Prometheus ``histogram_quantile`` interpolation from the by-ISL
  histograms (a ``/metrics`` scrape, the difference of two scrapes, or a Prometheus query).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from servelens.core.buckets import IslBuckets, label_sort_key
from servelens.core.edges import edges_kind
from servelens.core.quantiles import histogram_quantile, percentile

ALL_LABEL = "all"
"""Bucket value of the row that covers every request."""

LOW_COUNT = 20
"""Rows with fewer requests than this are marked: their p95/p99 rest on a handful of values."""


@dataclass(frozen=True)
class BucketRow:
    """One row of the table. Times in seconds, tokens as counts; None means "no data".

    Attributes:
        bucket: ISL bucket label (``"513-1024"``) or ``"all"``.
        requests: requests in the bucket (successes and errors when known).
        errors: failed requests (None when the source cannot say, e.g. by-ISL histograms).
        ttft_p50_s, ttft_p95_s, ttft_p99_s: TTFT percentiles (s).
        itl_p50_s, itl_p95_s: ITL percentiles over all tokens of the bucket (s).
        mean_cached_tokens: mean ``cached_tokens`` over requests that reported it.
        ttft_mean_s: mean TTFT (s).
        exact: True for exact percentiles, False for histogram interpolation.
        itl_p99_s: ITL p99 over all tokens of the bucket (s); None where a source does not give it.
        cache_hit_ratio: prefix-cache hit ratio, cached tokens over prompt tokens of the requests that
            reported cached tokens (0..1; None when none did, or where a source does not give it).
        ttft_le_range_s: interpolated rows only: ``(lower, upper]`` edges (s) of the one ``le`` bucket that
            holds every TTFT observation of the row (always so for one request), else None. The row's
            TTFT percentiles are then points of a linear interpolation inside that bucket
            (``histogram_quantile``), not measurements: all that is known is that each TTFT is in it.
        ttft_le_edges, itl_le_edges: interpolated rows: which ``le`` edges the TTFT and ITL histograms
            have (:func:`~servelens.core.edges.edges_kind`: ``fine``, ``dynamo`` or ``other``), so that
            the notes describe the edges actually read; None for exact rows or where a source does not say.
    """

    bucket: str
    requests: int
    errors: int | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    mean_cached_tokens: float | None
    ttft_mean_s: float | None = None
    exact: bool = True
    itl_p99_s: float | None = None
    cache_hit_ratio: float | None = None
    ttft_le_range_s: tuple[float, float] | None = None
    ttft_le_edges: str | None = None
    itl_le_edges: str | None = None

    @property
    def low_count(self) -> bool:
        """True when the row has fewer than :data:`LOW_COUNT` requests."""
        return self.requests < LOW_COUNT


@dataclass(frozen=True)
class RequestSample:
    """What the table needs of one request (a bench result line).

    ``isl`` is the server's ``usage.prompt_tokens`` when known, else the intended prompt length;
    None puts the request only in the "all" row.
    """

    isl: int | None
    ok: bool
    ttft_s: float | None
    itl_s: Sequence[float] = ()
    cached_tokens: int | None = None


def _nan_to_none(x: float) -> float | None:
    return None if x is None or math.isnan(x) else x


def hit_ratio(samples: Iterable[RequestSample]) -> float | None:
    """Prefix-cache hit ratio of successful requests: the sum of their cached tokens over the sum of
    their prompt tokens, over the requests that reported cached tokens and a prompt length (the
    gateway's ``cached_tokens_by_isl_sum / prompt_tokens_by_isl_total``). None when there are none."""
    cached = prompt = 0
    for s in samples:
        if s.ok and s.cached_tokens is not None and s.isl is not None:
            cached += s.cached_tokens
            prompt += s.isl
    return cached / prompt if prompt > 0 else None


def _row_from_samples(label: str, samples: Sequence[RequestSample]) -> BucketRow:
    ok = [s for s in samples if s.ok]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    itls: list[float] = []
    for s in ok:
        itls.extend(s.itl_s)
    cached = [s.cached_tokens for s in ok if s.cached_tokens is not None]
    return BucketRow(
        bucket=label,
        requests=len(samples),
        errors=len(samples) - len(ok),
        ttft_p50_s=_nan_to_none(percentile(ttfts, 50)),
        ttft_p95_s=_nan_to_none(percentile(ttfts, 95)),
        ttft_p99_s=_nan_to_none(percentile(ttfts, 99)),
        itl_p50_s=_nan_to_none(percentile(itls, 50)),
        itl_p95_s=_nan_to_none(percentile(itls, 95)),
        mean_cached_tokens=(sum(cached) / len(cached)) if cached else None,
        ttft_mean_s=(sum(ttfts) / len(ttfts)) if ttfts else None,
        exact=True,
        itl_p99_s=_nan_to_none(percentile(itls, 99)),
        cache_hit_ratio=hit_ratio(ok),
    )


def uncached_tokens(sample: RequestSample) -> int | None:
    """A request's uncached prompt tokens, ``ISL - cached_tokens`` (0 at least), or None when either is
    unknown (absent cached tokens are unknown, not zero)."""
    if sample.isl is None or sample.cached_tokens is None:
        return None
    return max(sample.isl - sample.cached_tokens, 0)


def rows_from_samples(samples: Iterable[RequestSample], buckets: IslBuckets, by: str = "isl") -> list[BucketRow]:
    """Exact per-bucket rows (numeric bucket order) followed by the "all" row.

    ``by``: ``isl`` buckets requests by their prompt length; ``uncached`` by their uncached prompt
    tokens (:func:`uncached_tokens`; a request without cached tokens is then only in "all").
    Raises ValueError for another ``by``.
    """
    if by not in ("isl", "uncached"):
        raise ValueError(f"by must be 'isl' or 'uncached', got {by!r}")
    all_samples = list(samples)
    per: dict[str, list[RequestSample]] = {label: [] for label in buckets.labels}
    for s in all_samples:
        key = s.isl if by == "isl" else uncached_tokens(s)
        if key is not None:
            per[buckets.label(key)].append(s)
    rows = [_row_from_samples(label, per[label]) for label in buckets.labels]
    rows.append(_row_from_samples(ALL_LABEL, all_samples))
    return rows


@dataclass(frozen=True)
class CumulativeHistogram:
    """A histogram as Prometheus exposes it: cumulative ``(le, count)`` pairs ending at ``+Inf``,
    and the sum. Counts may be floats (deltas, rates)."""

    buckets: tuple[tuple[float, float], ...]
    sum: float

    @property
    def edges(self) -> tuple[float, ...]:
        """The ``le`` values in order (``+Inf`` last)."""
        return tuple(le for le, _ in self.buckets)

    @property
    def count(self) -> float:
        """Total observations (the ``+Inf`` bucket)."""
        return self.buckets[-1][1] if self.buckets else 0.0

    def minus(self, earlier: CumulativeHistogram) -> CumulativeHistogram:
        """The difference ``self - earlier`` (a later scrape minus an earlier one).

        Raises ValueError when the ``le`` edges differ.
        """
        if [le for le, _ in self.buckets] != [le for le, _ in earlier.buckets]:
            raise ValueError("cannot subtract histograms with different le edges")
        return CumulativeHistogram(
            tuple((le, c - c0) for (le, c), (_, c0) in zip(self.buckets, earlier.buckets, strict=True)),
            self.sum - earlier.sum,
        )

    def plus(self, other: CumulativeHistogram) -> CumulativeHistogram:
        """The sum of two histograms with the same edges (``sum by (le)``)."""
        if [le for le, _ in self.buckets] != [le for le, _ in other.buckets]:
            raise ValueError("cannot add histograms with different le edges")
        return CumulativeHistogram(
            tuple((le, c + c1) for (le, c), (_, c1) in zip(self.buckets, other.buckets, strict=True)),
            self.sum + other.sum,
        )

    def quantile(self, q: float) -> float | None:
        """Prometheus ``histogram_quantile(q, ...)``; None without observations."""
        return _nan_to_none(histogram_quantile(q, self.buckets))

    def mean(self) -> float | None:
        """``_sum / _count``; None without observations."""
        return self.sum / self.count if self.count > 0 else None

    def single_bucket(self) -> tuple[float, float] | None:
        """``(lower, upper]`` edges of the one ``le`` bucket holding every observation (lower 0 for
        the first bucket, upper ``inf`` for ``+Inf``); None without observations or when they are
        spread over several buckets."""
        held = []
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            if c - prev_c > 0:
                held.append((prev_le, le))
            prev_le, prev_c = le, c
        return held[0] if len(held) == 1 else None


@dataclass(frozen=True)
class BucketHistograms:
    """The by-ISL histograms of one bucket (or the stock ones for "all")."""

    ttft: CumulativeHistogram | None
    itl: CumulativeHistogram | None
    duration: CumulativeHistogram | None
    cached: CumulativeHistogram | None
    errors: int | None = None
    prompt_tokens: float | None = None
    """Prompt tokens of the requests in ``cached`` (``prompt_tokens_by_isl_total``), for the hit ratio."""
    hit_cached_tokens: float | None = None
    """Cached tokens over those same requests when ``cached`` covers more (the stock histogram of "all")."""

    def hit_ratio(self) -> float | None:
        """Cached over prompt tokens (None without prompt tokens)."""
        if not self.prompt_tokens or self.prompt_tokens <= 0:
            return None
        cached = self.hit_cached_tokens if self.hit_cached_tokens is not None else (
            self.cached.sum if self.cached is not None else None)
        return None if cached is None else cached / self.prompt_tokens


def row_from_histograms(label: str, h: BucketHistograms) -> BucketRow:
    """One interpolated row. ``requests`` is the duration histogram's count."""
    requests = h.duration.count if h.duration is not None else (h.ttft.count if h.ttft is not None else 0)
    return BucketRow(
        bucket=label,
        requests=round(requests),
        errors=h.errors,
        ttft_p50_s=h.ttft.quantile(0.5) if h.ttft else None,
        ttft_p95_s=h.ttft.quantile(0.95) if h.ttft else None,
        ttft_p99_s=h.ttft.quantile(0.99) if h.ttft else None,
        itl_p50_s=h.itl.quantile(0.5) if h.itl else None,
        itl_p95_s=h.itl.quantile(0.95) if h.itl else None,
        mean_cached_tokens=h.cached.mean() if h.cached else None,
        ttft_mean_s=h.ttft.mean() if h.ttft else None,
        exact=False,
        itl_p99_s=h.itl.quantile(0.99) if h.itl else None,
        cache_hit_ratio=h.hit_ratio(),
        ttft_le_range_s=h.ttft.single_bucket() if h.ttft else None,
        ttft_le_edges=edges_kind(h.ttft.edges, "ttft") if h.ttft else None,
        itl_le_edges=edges_kind(h.itl.edges, "itl") if h.itl else None,
    )


def summed_over_buckets(per_bucket: Mapping[str, BucketHistograms]) -> BucketHistograms | None:
    """The buckets' histograms summed family by family (``sum by (le)`` over ``isl_bucket``): the "all
    requests" figures of an endpoint that exports only the by-ISL families (a sidecar gateway). It
    leaves out requests that got no bucket (failed before their prompt length was known). A family
    missing from any bucket is None; no buckets: None. Raises ValueError when buckets' ``le`` edges
    differ (the gateway gives every bucket the same)."""
    if not per_bucket:
        return None
    hs = list(per_bucket.values())

    def total(family: str) -> CumulativeHistogram | None:
        parts = [getattr(h, family) for h in hs]
        if any(p is None for p in parts):
            return None
        acc: CumulativeHistogram = parts[0]
        for p in parts[1:]:
            acc = acc.plus(p)
        return acc

    return BucketHistograms(total("ttft"), total("itl"), total("duration"), total("cached"))


def rows_from_histograms(
    per_bucket: Mapping[str, BucketHistograms], all_requests: BucketHistograms | None = None
) -> list[BucketRow]:
    """Interpolated rows in numeric bucket order (labels sorted numerically), then "all" if given."""
    rows = [row_from_histograms(label, per_bucket[label]) for label in sorted(per_bucket, key=label_sort_key)]
    if all_requests is not None:
        rows.append(row_from_histograms(ALL_LABEL, all_requests))
    return rows
