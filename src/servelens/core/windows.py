"""Inputs of the latency-change analysis (``servelens explain``, the two-run comparison, SLOs):
one latency metric (TTFT, ITL, duration) in one time window, per ISL bucket, either as
per-request samples (a bench results file: exact) or as histogram state (a ``/metrics`` scrape
pair or a Prometheus range: counts per ``le`` edge, sum, count).

Every input is validated on construction and raises :class:`ExplainError`, whose message is one
line the CLI can print as is. Observation counts, not request counts, weight a bucket: for TTFT
and duration one observation is one request, for ITL one token (as the histograms count).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from servelens.core.binned_quantiles import BinnedValues, in_memory
from servelens.core.buckets import IslBuckets
from servelens.core.summary import CumulativeHistogram, RequestSample


class ExplainError(ValueError):
    """Input the analysis cannot answer from (no data, buckets or edges that differ, a reference
    mix that does not fit); ``str(exc)`` is one line meant for the user."""


@dataclass(frozen=True, eq=False)
class BucketSamples:
    """Per-request observations of one metric in one ISL bucket.

    Attributes:
        values_s: the observations (s, finite, >= 0), request after request: one per request for
            TTFT and duration, every token's gap for ITL.
        sizes: observations per request (``sum(sizes) == len(values_s)``; 0 allowed); None means
            one each. Resampling draws whole requests, so one request's tokens stay together.

    Either may be a numpy array (float64 values, int sizes; a results.cols folder's windows are),
    with the same figures as the tuples.

    Raises ExplainError for a negative or non-finite value, or sizes that do not add up.
    """

    values_s: tuple[float, ...] | np.ndarray
    sizes: tuple[int, ...] | np.ndarray | None = None

    def __post_init__(self) -> None:
        v = np.asarray(self.values_s, dtype=float)
        if v.size and (not np.all(np.isfinite(v)) or float(v.min()) < 0):
            raise ExplainError("latency samples must be finite and >= 0 seconds")
        if self.sizes is not None:
            n = np.asarray(self.sizes, dtype=np.int64)
            if (n.size and int(n.min()) < 0) or int(n.sum()) != v.size:
                raise ExplainError(f"sizes add up to {int(n.sum())} observations, values hold {v.size}")

    def __eq__(self, other: object) -> bool:
        """The same values and sizes, whether held as tuples or arrays."""
        if not isinstance(other, BucketSamples):
            return NotImplemented
        if (self.sizes is None) != (other.sizes is None):
            return False
        return bool(np.array_equal(np.asarray(self.values_s, dtype=float), np.asarray(other.values_s, dtype=float))
                    and (self.sizes is None or np.array_equal(self.request_sizes(), other.request_sizes())))

    __hash__ = None  # type: ignore[assignment]  # equal by value, arrays are not hashable

    @property
    def count(self) -> int:
        """Observations."""
        return len(self.values_s)

    def request_sizes(self) -> np.ndarray:
        """Observations per request, shape (requests,), int."""
        if self.sizes is None:
            return np.ones(len(self.values_s), dtype=np.int64)
        return np.asarray(self.sizes, dtype=np.int64)

    def request_sums(self) -> np.ndarray:
        """Sum of each request's observations (s), shape (requests,)."""
        sizes = self.request_sizes()
        v = np.asarray(self.values_s, dtype=float)
        if self.sizes is None:
            return v
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        sums = np.add.reduceat(v, starts[sizes > 0]) if v.size else np.zeros(0)
        out = np.zeros(sizes.size)
        out[sizes > 0] = sums
        return out


def _fsum(values: tuple[float, ...] | np.ndarray) -> float:
    """``math.fsum`` (exactly rounded), fed in slices so an array never becomes one big list."""
    if not isinstance(values, np.ndarray):
        return math.fsum(values)
    step = 1 << 20
    return math.fsum(itertools.chain.from_iterable(values[i:i + step].tolist() for i in range(0, values.size, step)))


def _check_labels(labels: tuple[str, ...], n: int) -> None:
    if not labels:
        raise ExplainError("a window needs at least one ISL bucket")
    if len(set(labels)) != len(labels):
        raise ExplainError(f"ISL bucket labels repeat: {', '.join(labels)}")
    if n != len(labels):
        raise ExplainError(f"{len(labels)} ISL bucket labels but {n} buckets of data")


@dataclass(frozen=True)
class SampleWindow:
    """One metric in one window as per-request samples (exact figures, bootstrap uncertainty).

    Attributes:
        metric: display name (``"TTFT"``, ``"ITL"``, ``"duration"``).
        labels: ISL bucket labels in numeric order.
        buckets: one :class:`BucketSamples` per label.
        unbucketed: observations of the metric in no bucket (prompt length unknown); they are in
            no figure, and the explanation carries the count so the output can say so.
    """

    metric: str
    labels: tuple[str, ...]
    buckets: tuple[BucketSamples, ...]
    unbucketed: int = 0

    def __post_init__(self) -> None:
        _check_labels(self.labels, len(self.buckets))

    def counts(self) -> np.ndarray:
        """Observations per bucket, shape (buckets,)."""
        return np.array([b.count for b in self.buckets], dtype=float)

    def sums(self) -> np.ndarray:
        """Sum of the observations per bucket (s), shape (buckets,): the exactly rounded sum
        (``math.fsum``) of its requests' sums (:meth:`BucketSamples.request_sums`); with one
        observation a request, of the observations themselves."""
        return self._sums.copy()

    @functools.cached_property
    def _sums(self) -> np.ndarray:  # exact sums cost a pass over every value: once per window
        return np.array([_fsum(b.request_sums()) for b in self.buckets], dtype=float)

    def units(self) -> np.ndarray:
        """Requests per bucket (the independent units of the uncertainty), shape (buckets,)."""
        return np.array([b.request_sizes().size for b in self.buckets], dtype=float)

    def request_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per request of every bucket: its bucket index (int64), observations (float) and their sum (s)."""
        return _request_table([b.request_sizes() for b in self.buckets], [b.request_sums() for b in self.buckets])

    @functools.cached_property
    def binned(self) -> BinnedValues:
        """The observations by bucket and value bin, for exact quantiles (:mod:`servelens.core.binned_quantiles`)."""
        return in_memory([np.asarray(b.values_s, dtype=float) for b in self.buckets])


def _request_table(
    sizes: Sequence[np.ndarray], sums: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ks = [np.full(n.size, k, dtype=np.int64) for k, n in enumerate(sizes)]
    return np.concatenate(ks), np.concatenate(sizes).astype(float), np.concatenate(sums).astype(float)


@dataclass(frozen=True, eq=False)
class BinnedSampleWindow:
    """One metric in one window as per-request samples held compactly: per bucket each request's
    observation count and sum, and the observations' counts per value bin with a reader of the
    values (``values.gather``), for windows too large to hold every value (a million requests' ITL:
    ~365 M values, 2.9 GB as float64). Figures and uncertainty are those of a :class:`SampleWindow`
    of the same observations: means from the same per-request sums, quantiles by exact selection
    (:func:`servelens.core.binned_quantiles.mixture_quantiles`), resampling of the same requests.

    Attributes:
        metric, labels, unbucketed: as :class:`SampleWindow`.
        sizes: per bucket, observations per request, shape (requests,), int64 (0 allowed).
        sums_s: per bucket, each request's sum (s), shape (requests,), float64:
            :meth:`BucketSamples.request_sums` of its observations (``numpy.add.reduceat``).
        values: the observations by bucket and value bin; ``values.counts[b].sum()`` is
            ``sizes[b].sum()``.

    Raises ExplainError for lengths that differ, negative sizes, sums that are negative or not
    finite, or value counts that do not add up to the sizes.
    """

    metric: str
    labels: tuple[str, ...]
    sizes: tuple[np.ndarray, ...]
    sums_s: tuple[np.ndarray, ...]
    values: BinnedValues
    unbucketed: int = 0

    def __post_init__(self) -> None:
        _check_labels(self.labels, len(self.sizes))
        if len(self.sums_s) != len(self.sizes) or self.values.groups != len(self.sizes):
            raise ExplainError("sizes, sums and value counts must have one entry per ISL bucket")
        per_bin = self.values.counts.sum(axis=1)
        for k, (n, s) in enumerate(zip(self.sizes, self.sums_s, strict=True)):
            if n.shape != s.shape or (n.size and int(n.min()) < 0):
                raise ExplainError("each request needs one size >= 0 and one sum")
            if s.size and (not np.all(np.isfinite(s)) or float(s.min()) < 0):
                raise ExplainError("latency samples must be finite and >= 0 seconds")
            if int(n.sum()) != int(per_bin[k]):
                raise ExplainError(f"sizes add up to {int(n.sum())} observations, value counts to {int(per_bin[k])}")

    def counts(self) -> np.ndarray:
        """Observations per bucket, shape (buckets,)."""
        return np.array([int(n.sum()) for n in self.sizes], dtype=float)

    def sums(self) -> np.ndarray:
        """Sum of the observations per bucket (s), shape (buckets,), as :meth:`SampleWindow.sums`."""
        return self._sums.copy()

    @functools.cached_property
    def _sums(self) -> np.ndarray:
        return np.array([_fsum(s) for s in self.sums_s], dtype=float)

    def units(self) -> np.ndarray:
        """Requests per bucket, shape (buckets,)."""
        return np.array([n.size for n in self.sizes], dtype=float)

    def request_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`SampleWindow.request_table`."""
        return _request_table(list(self.sizes), list(self.sums_s))

    @property
    def binned(self) -> BinnedValues:
        """The observations by bucket and value bin."""
        return self.values


@dataclass(frozen=True)
class HistogramWindow:
    """One metric in one window as histogram state: the by-ISL histograms, all with the same
    ``le`` edges (cumulative counts ending at ``+Inf``, and ``_sum``).

    Attributes:
        metric: display name.
        labels: ISL bucket labels in numeric order.
        histograms: one per label (for a window: later scrape minus earlier, or ``increase``).
        requests: per bucket, the number of independent units behind the counts, used only for
            the variance (for ITL the requests, since one request's tokens are not independent;
            e.g. the duration histogram's counts); None means the observation counts.
        unbucketed: observations in no bucket (the stock histogram's count minus the buckets').

    Raises ExplainError when edges differ between buckets, a count is negative or not
    cumulative (a counter reset between two scrapes), or lengths do not match.
    """

    metric: str
    labels: tuple[str, ...]
    histograms: tuple[CumulativeHistogram, ...]
    requests: tuple[float, ...] | None = None
    unbucketed: float = 0.0

    def __post_init__(self) -> None:
        _check_labels(self.labels, len(self.histograms))
        edges = self.edges
        if not edges or not math.isinf(edges[-1]):
            raise ExplainError(f"{self.metric} histograms must end with an le=+Inf bucket")
        for label, h in zip(self.labels, self.histograms, strict=True):
            if tuple(le for le, _ in h.buckets) != edges:
                raise ExplainError(f"{self.metric} le edges of bucket {label} differ from bucket {self.labels[0]}'s")
            counts = [c for _, c in h.buckets]
            if any(not math.isfinite(c) or c < 0 for c in counts) or any(
                b < a for a, b in itertools.pairwise(counts)
            ):
                raise ExplainError(
                    f"{self.metric} bucket {label}: le counts are negative or not cumulative "
                    "(a counter reset between the two scrapes?)"
                )
        if self.requests is not None and (
            len(self.requests) != len(self.labels) or any(r < 0 for r in self.requests)
        ):
            raise ExplainError("requests must give one count >= 0 per ISL bucket")

    @property
    def edges(self) -> tuple[float, ...]:
        """The shared ``le`` edges, ending with ``+Inf``."""
        return tuple(le for le, _ in self.histograms[0].buckets)

    def counts(self) -> np.ndarray:
        """Observations per bucket (the ``+Inf`` count), shape (buckets,)."""
        return np.array([h.count for h in self.histograms], dtype=float)

    def sums(self) -> np.ndarray:
        """``_sum`` per bucket (s), shape (buckets,)."""
        return np.array([h.sum for h in self.histograms], dtype=float)

    def units(self) -> np.ndarray:
        """Independent units per bucket for the variance (``requests``, else the counts)."""
        return np.array(self.requests, dtype=float) if self.requests is not None else self.counts()


PerRequestWindow = SampleWindow | BinnedSampleWindow
"""Per-request samples, held whole or compactly: exact figures; the two compare with each other."""
PER_REQUEST = (SampleWindow, BinnedSampleWindow)
"""The classes of :data:`PerRequestWindow`, for ``isinstance``."""

Window = SampleWindow | BinnedSampleWindow | HistogramWindow
"""A window of either kind (per-request samples or histograms); an analysis takes two of the same kind."""


@dataclass(frozen=True)
class Mix:
    """A bucket mix: the share of observations per ISL bucket (normalised to sum to 1).

    Build one from a reference-weight file's mapping with :meth:`from_mapping`, or from a
    window with :func:`window_mix`. Raises ExplainError for a negative or non-finite share,
    shares that sum to 0, or lengths that differ.
    """

    labels: tuple[str, ...]
    shares: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_labels(self.labels, len(self.shares))
        s = np.asarray(self.shares, dtype=float)
        if not np.all(np.isfinite(s)) or np.any(s < 0):
            raise ExplainError("mix shares must be finite and >= 0")
        total = float(s.sum())
        if total <= 0:
            raise ExplainError("mix shares sum to 0: no bucket has any weight")
        object.__setattr__(self, "shares", tuple(float(x) for x in s / total))

    @classmethod
    def from_mapping(cls, shares: Mapping[str, float], buckets: IslBuckets | None = None) -> Mix:
        """A mix from ``{label: share}`` (any positive scale). With ``buckets``, the labels must be
        exactly those buckets' (see :func:`aligned_mix`); the result is in their numeric order."""
        mix = cls(tuple(shares), tuple(float(v) for v in shares.values()))
        return aligned_mix(mix, buckets.labels) if buckets is not None else mix


def aligned_mix(mix: Mix, labels: Sequence[str]) -> Mix:
    """``mix`` reordered to ``labels``. Raises ExplainError (naming the buckets that differ) when
    the mix's buckets are not exactly ``labels``, e.g. a weight file written for other boundaries."""
    if set(mix.labels) != set(labels):
        missing = [lab for lab in labels if lab not in mix.labels]
        extra = [lab for lab in mix.labels if lab not in labels]
        parts = ([f"lacks {', '.join(missing)}"] if missing else []) + ([f"has {', '.join(extra)}"] if extra else [])
        raise ExplainError(
            f"the reference mix does not match the ISL buckets {', '.join(labels)}: it {' and '.join(parts)}"
        )
    by = dict(zip(mix.labels, mix.shares, strict=True))
    return Mix(tuple(labels), tuple(by[lab] for lab in labels))


def window_mix(window: Window) -> Mix:
    """The window's own mix (share of observations per bucket). Raises ExplainError when empty."""
    counts = window.counts()
    if counts.sum() <= 0:
        raise ExplainError(f"no {window.metric} observations in the window")
    return Mix(window.labels, tuple(float(c) for c in counts))


def check_pair(before: Window, after: Window) -> None:
    """Check that two windows can be compared: the same kind, metric, buckets (and ``le`` edges),
    and observations in each. Raises ExplainError with a one-line reason."""
    if isinstance(before, HistogramWindow) != isinstance(after, HistogramWindow):
        raise ExplainError("both windows must come from the same kind of source (samples or histograms)")
    if before.metric != after.metric:
        raise ExplainError(f"the windows hold different metrics: {before.metric} and {after.metric}")
    if before.labels != after.labels:
        raise ExplainError(
            f"the ISL buckets differ between the windows (earlier: {', '.join(before.labels)}; "
            f"later: {', '.join(after.labels)}): re-run with the same --isl-buckets"
        )
    if isinstance(before, HistogramWindow) and isinstance(after, HistogramWindow) and before.edges != after.edges:
        raise ExplainError(f"the {before.metric} le edges differ between the windows: the histograms do not compare")
    for name, w in (("earlier", before), ("later", after)):
        if w.counts().sum() <= 0:
            raise ExplainError(f"the {name} window has no {w.metric} observations in any ISL bucket")


def sample_window(samples: Iterable[RequestSample], buckets: IslBuckets, metric: str) -> SampleWindow:
    """A :class:`SampleWindow` of ``metric`` (``"ttft"`` or ``"itl"``) from the table's request
    samples (:func:`servelens.formats.results.to_samples`). Only successful requests count, as in
    the table; a request without an ISL counts in ``unbucketed``. Raises ExplainError for another metric.
    """
    if metric not in ("ttft", "itl"):
        raise ExplainError(f"unknown metric {metric!r} (ttft or itl)")
    values: list[list[float]] = [[] for _ in buckets.labels]
    sizes: list[list[int]] = [[] for _ in buckets.labels]
    unbucketed = 0
    for s in samples:
        if not s.ok:
            continue
        got = ([s.ttft_s] if s.ttft_s is not None else []) if metric == "ttft" else list(s.itl_s)
        if s.isl is None:
            unbucketed += len(got)
            continue
        i = buckets.index(s.isl)
        values[i].extend(got)
        sizes[i].append(len(got))
    return SampleWindow(
        metric.upper(),
        buckets.labels,
        tuple(
            BucketSamples(tuple(v), tuple(n) if metric == "itl" else None)
            for v, n in zip(values, sizes, strict=True)
        ),
        unbucketed,
    )
