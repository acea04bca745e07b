"""Per-bucket SLOs: attainment (the share of requests meeting each SLO) and goodput (requests per
second meeting all of them), from per-request data (exact) or from histogram buckets (bounds).

A threshold is one of (issue 17, section 3): one value for every prompt (``2.0``), one that grows
with the prompt (``a + b * ISL``: ``0.5+0.0002*isl``, seconds and seconds per token), or a table
per bucket (``0-512=0.5,513-1024=0.8,...``, every bucket named once).

Per request (bench results): a request meets the TTFT SLO when it succeeded and its TTFT is within
the threshold at its own ISL; it meets the ITL SLO when it succeeded and its mean ITL (its TPOT, as
vLLM's ``bench serve --goodput`` judges it) is within; a request with one output token has no gap
and meets it. A failed request meets none. Goodput is the number meeting all SLOs over the window.

From a histogram (server side) the share at or below ``t`` is exact only when ``t`` is an ``le``
edge; otherwise it lies between the counts at the edges either side of ``t``, and this module
returns those bounds (never an interpolated point). ``a + b * ISL`` varies inside a bucket, so a
bucket's bounds span its ISL range (an open top bucket has no upper ISL: its upper bound is 1).
Separate TTFT and ITL histograms cannot say which requests met both. Two request shares would
bound it (Frechet, :func:`both_bounds`: ``max(0, p + q - 1) <= both <= min(p, q)``), but an ITL
histogram counts tokens, so its share is one of tokens, not of requests: from histograms,
:func:`histogram_attainment` gives goodput only for a TTFT SLO alone. An exact server-side figure
needs a per-request counter at the source.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from servelens.core.buckets import IslBuckets
from servelens.core.summary import ALL_LABEL, CumulativeHistogram
from servelens.core.windows import ExplainError

_LINEAR = re.compile(r"^\s*([0-9.eE+-]+)\s*\+\s*([0-9.eE+-]+)\s*\*\s*isl\s*$")


@dataclass(frozen=True)
class Threshold:
    """A latency threshold by prompt length: ``base_s + per_token_s * isl``, or, when ``table`` is
    given, one value per bucket label (then ``base_s``/``per_token_s`` are unused).

    Raises ExplainError for a negative or non-finite value.
    """

    base_s: float = 0.0
    per_token_s: float = 0.0
    table: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        values = (self.base_s, self.per_token_s, *(v for _, v in self.table))
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ExplainError("SLO thresholds must be finite and >= 0 seconds")

    @property
    def spec(self) -> str:
        """The threshold as :func:`parse_threshold` reads it, in one canonical spelling (each number as
        Python's shortest ``repr``): ``2.0``, ``0.5+2e-05*isl``, ``0-512=0.5,513+=0.8`` (the table in its
        order). What the gateway exports in ``{p}_slo_threshold_info{threshold=...}``."""
        if self.table:
            return ",".join(f"{label}={v!r}" for label, v in self.table)
        return repr(self.base_s) if self.per_token_s == 0 else f"{self.base_s!r}+{self.per_token_s!r}*isl"

    def same_as(self, other: Threshold) -> bool:
        """True when both give every request the same limit (a table's order does not matter; ``0.5`` and
        ``0.5+0*isl`` are the same)."""
        if bool(self.table) != bool(other.table):
            return False
        if self.table:
            return dict(self.table) == dict(other.table)
        return (self.base_s, self.per_token_s) == (other.base_s, other.per_token_s)

    def limit_s(self, isl: int, label: str) -> float:
        """The threshold (s) for a request of ``isl`` tokens in bucket ``label``. Raises KeyError
        for a label a table lacks."""
        if self.table:
            return dict(self.table)[label]
        return self.base_s + self.per_token_s * isl

    def bucket_range_s(self, buckets: IslBuckets, index: int) -> tuple[float, float]:
        """The lowest and highest threshold (s) inside bucket ``index`` (inf at the top for an open
        bucket when the threshold grows with ISL)."""
        label = buckets.labels[index]
        if self.table:
            v = dict(self.table)[label]
            return v, v
        low = 0 if index == 0 else buckets.boundaries[index - 1] + 1
        high = buckets.boundaries[index] if index < len(buckets.boundaries) else math.inf
        top = math.inf if high == math.inf and self.per_token_s > 0 else self.base_s + self.per_token_s * (
            0 if high == math.inf else high
        )
        return self.base_s + self.per_token_s * low, top


def parse_threshold(spec: str, buckets: IslBuckets) -> Threshold:
    """A threshold from ``"2.0"``, ``"A+B*isl"`` or ``"LABEL=S,LABEL=S,..."`` (module docstring).

    Raises ExplainError (one line) for a malformed spec, or a table that does not name exactly
    the buckets of ``buckets``.
    """
    text = spec.strip()
    try:
        if "=" in text:
            pairs = [p.split("=", 1) for p in text.split(",")]
            table = tuple((k.strip(), float(v)) for k, v in pairs)
            names = [k for k, _ in table]
            if sorted(names) != sorted(buckets.labels):
                raise ExplainError(
                    f"SLO table names {', '.join(names)} but the ISL buckets are {', '.join(buckets.labels)}"
                )
            return Threshold(table=table)
        m = _LINEAR.match(text.lower())
        if m:
            return Threshold(float(m.group(1)), float(m.group(2)))
        return Threshold(float(text))
    except ValueError as exc:
        if isinstance(exc, ExplainError):
            raise
        raise ExplainError(
            f"SLO threshold {spec!r} is not seconds (2.0), A+B*isl (0.5+0.0002*isl) or a table "
            "(0-512=0.5,513-1024=0.8,...)"
        ) from None


@dataclass(frozen=True)
class Slo:
    """The SLOs judged together; None means no SLO on that metric."""

    ttft: Threshold | None = None
    itl: Threshold | None = None


@dataclass(frozen=True)
class SloRequest:
    """What the SLOs need of one request: ISL (None: no bucket), success, TTFT and mean ITL (s;
    ``itl_s`` None for a request with one output token)."""

    isl: int | None
    ok: bool
    ttft_s: float | None
    itl_s: float | None = None


@dataclass(frozen=True)
class Attainment:
    """SLO attainment of one bucket (or ``all``) from per-request data.

    ``*_met`` count requests; ``*_share`` are those over ``requests`` (None without requests or
    without that SLO); ``goodput_rps`` is ``all_met / duration_s`` (None when the window's length
    is not known: counters from a scrape).
    """

    label: str
    requests: int
    ttft_met: int | None
    itl_met: int | None
    all_met: int
    ttft_share: float | None
    itl_share: float | None
    all_share: float | None
    goodput_rps: float | None


def _within(th: Threshold | None, r: SloRequest, label: str | None, value: float | None, missing: bool) -> bool:
    """Whether ``r`` meets one SLO; ``missing`` is the answer when the value is absent."""
    if th is None:
        return True
    if not r.ok:
        return False
    if value is None:
        return missing
    if label is None or r.isl is None:  # no ISL: only a flat threshold can judge it
        return not th.table and th.per_token_s == 0 and value <= th.base_s
    return value <= th.limit_s(r.isl, label)


def meets(slo: Slo, r: SloRequest, label: str | None) -> tuple[bool, bool]:
    """Whether request ``r`` (in bucket ``label``; None: no bucket) meets the TTFT SLO and the ITL
    SLO (True for a metric without one): the per-request rule of the module docstring, shared by
    :func:`attainment` and the gateway's per-bucket SLO counters."""
    return (_within(slo.ttft, r, label, r.ttft_s, missing=False), _within(slo.itl, r, label, r.itl_s, missing=True))


def attainment(
    requests: Iterable[SloRequest], buckets: IslBuckets, slo: Slo, duration_s: float
) -> tuple[Attainment, ...]:
    """Per-bucket attainment and goodput (numeric order), then ``all``. A request without an ISL
    (in practice one that failed before its prompt length was known) is in ``all`` only, and meets
    a threshold that depends on ISL never.

    Raises ExplainError when ``duration_s`` is not positive or ``slo`` has no threshold.
    """
    if not duration_s > 0:
        raise ExplainError(f"goodput needs a window longer than 0 s, got {duration_s}")
    if slo.ttft is None and slo.itl is None:
        raise ExplainError("no SLO given (a TTFT or ITL threshold)")
    tally = {label: [0, 0, 0, 0] for label in (*buckets.labels, ALL_LABEL)}
    for r in requests:
        label = buckets.label(r.isl) if r.isl is not None else None
        ttft, itl = meets(slo, r, label)
        for key in (label, ALL_LABEL) if label else (ALL_LABEL,):
            t = tally[key]
            t[0] += 1
            t[1] += ttft
            t[2] += itl
            t[3] += ttft and itl
    return tuple(
        Attainment(
            label, n,
            t_met if slo.ttft else None, i_met if slo.itl else None, both,
            t_met / n if n and slo.ttft else None, i_met / n if n and slo.itl else None,
            both / n if n else None, both / duration_s,
        )
        for label, (n, t_met, i_met, both) in tally.items()
    )


@dataclass(frozen=True)
class ShareBounds:
    """The share of a histogram's observations within a threshold: ``low <= share <= high``;
    ``exact`` when they are equal because the threshold is an ``le`` edge (and does not vary)."""

    low: float
    high: float

    @property
    def exact(self) -> bool:
        """True when the bounds coincide."""
        return self.low == self.high


def histogram_share(h: CumulativeHistogram, low_s: float, high_s: float | None = None) -> ShareBounds | None:
    """Bounds on the share of ``h``'s observations at or below a threshold somewhere in
    ``[low_s, high_s]`` (``high_s`` None: exactly ``low_s``): from the count at the largest ``le``
    <= ``low_s`` to the count at the smallest ``le`` >= ``high_s``. None without observations."""
    total = h.count
    if total <= 0:
        return None
    high_s = low_s if high_s is None else high_s
    below = max((c for le, c in h.buckets if le <= low_s), default=0.0)
    above = min((c for le, c in h.buckets if le >= high_s), default=total)
    return ShareBounds(below / total, above / total)


def bucket_shares(
    histograms: Sequence[CumulativeHistogram], buckets: IslBuckets, threshold: Threshold
) -> tuple[ShareBounds | None, ...]:
    """Per bucket (``histograms[i]`` is bucket ``i``'s), the share-within-threshold bounds of
    :func:`histogram_share` over the bucket's threshold range. Raises ExplainError when the
    number of histograms is not the number of buckets."""
    if len(histograms) != len(buckets):
        raise ExplainError(f"{len(histograms)} histograms for {len(buckets)} ISL buckets")
    return tuple(histogram_share(h, *threshold.bucket_range_s(buckets, i)) for i, h in enumerate(histograms))


def counted_attainment(counts: Sequence[tuple[str, int, int | None, int | None, int]], slo: Slo,
                       duration_s: float | None = None) -> tuple[Attainment, ...]:
    """Attainment rows from counts made at the source (the gateway's exact SLO counters):
    ``(label, requests, ttft_met, itl_met, all_met)`` per bucket in order, then an ``all`` row that
    sums them; goodput over ``duration_s`` when given. Raises ExplainError for a non-positive
    ``duration_s``, or met counts above the requests (counters of another window or SLO)."""
    if duration_s is not None and not duration_s > 0:
        raise ExplainError(f"goodput needs a window longer than 0 s, got {duration_s}")
    rows = []
    for label, n, t, i, both in counts:
        if any(x is not None and not 0 <= x <= n for x in (t, i, both)):
            raise ExplainError(f"bucket {label}: more requests meeting the SLO than finished ({n}): counters of "
                               "another window?")
        rows.append((label, n, t if slo.ttft else None, i if slo.itl else None, both))
    total = ("all", sum(r[1] for r in rows),
             sum(r[2] or 0 for r in rows) if slo.ttft else None, sum(r[3] or 0 for r in rows) if slo.itl else None,
             sum(r[4] for r in rows))
    return tuple(
        Attainment(label, n, t, i, both, t / n if n and t is not None else None,
                   i / n if n and i is not None else None, both / n if n else None,
                   both / duration_s if duration_s else None)
        for label, n, t, i, both in (*rows, total))


def both_bounds(p: ShareBounds, q: ShareBounds) -> ShareBounds:
    """Bounds on the share meeting both of two SLOs known only as marginal bounds (Frechet)."""
    return ShareBounds(max(0.0, p.low + q.low - 1.0), min(p.high, q.high))


@dataclass(frozen=True)
class AttainmentBounds:
    """SLO attainment of one bucket (or ``all``) from histograms: bounds, exact where they meet.

    Attributes:
        label: bucket label or ``all``.
        observations: TTFT observations (requests with a first token) in the window.
        ttft: share of the TTFTs within the TTFT SLO (None without that SLO or observations).
        itl: share of the *tokens* whose ITL is within the ITL SLO: an ITL histogram counts tokens, so
            it cannot say which requests' mean ITL (TPOT) met it, as the per-request figure does.
        goodput_rps: ``(low, high)`` requests per second meeting the SLOs: only with a TTFT SLO and no
            ITL SLO (token shares do not add up to requests) and a known window length; else None.
    """

    label: str
    observations: float
    ttft: ShareBounds | None
    itl: ShareBounds | None
    goodput_rps: tuple[float, float] | None


def _pooled(parts: Sequence[tuple[ShareBounds | None, float]]) -> ShareBounds | None:
    """Bounds on the share over several histograms, weighted by their observation counts."""
    total = sum(n for b, n in parts if b is not None)
    if total <= 0:
        return None
    return ShareBounds(sum(b.low * n for b, n in parts if b is not None) / total,
                       sum(b.high * n for b, n in parts if b is not None) / total)


def histogram_attainment(
    ttft: Sequence[CumulativeHistogram],
    itl: Sequence[CumulativeHistogram],
    buckets: IslBuckets,
    slo: Slo,
    duration_s: float | None = None,
) -> tuple[AttainmentBounds, ...]:
    """Per bucket (numeric order), then ``all``: the SLO shares from the by-ISL TTFT and ITL
    histograms (``ttft[i]``, ``itl[i]`` are bucket ``i``'s), as bounds (:func:`bucket_shares`), and
    goodput where it can be bounded (see :class:`AttainmentBounds`).

    Raises ExplainError when ``slo`` has no threshold, a histogram list does not match the buckets,
    or ``duration_s`` is given and not positive.
    """
    if slo.ttft is None and slo.itl is None:
        raise ExplainError("no SLO given (a TTFT or ITL threshold)")
    if duration_s is not None and not duration_s > 0:
        raise ExplainError(f"goodput needs a window longer than 0 s, got {duration_s}")
    n = len(buckets)
    for metric, given in (("TTFT", ttft), ("ITL", itl)):  # both, also the one whose SLO is not set
        if len(given) != n:
            raise ExplainError(f"{len(given)} {metric} histograms for {n} ISL buckets")
    t_sh = bucket_shares(ttft, buckets, slo.ttft) if slo.ttft else (None,) * n
    i_sh = bucket_shares(itl, buckets, slo.itl) if slo.itl else (None,) * n
    counts = [h.count for h in ttft]
    tokens = [h.count for h in itl]

    def goodput(share: ShareBounds | None, count: float) -> tuple[float, float] | None:
        if slo.itl is not None or share is None or duration_s is None:
            return None
        return share.low * count / duration_s, share.high * count / duration_s

    rows = [AttainmentBounds(label, counts[i], t_sh[i], i_sh[i], goodput(t_sh[i], counts[i]))
            for i, label in enumerate(buckets.labels)]
    t_all = _pooled(list(zip(t_sh, counts, strict=True)))
    i_all = _pooled(list(zip(i_sh, tokens, strict=True)))
    rows.append(AttainmentBounds(ALL_LABEL, sum(counts), t_all, i_all, goodput(t_all, sum(counts))))
    return tuple(rows)


def threshold_note(metric: str, threshold: Threshold, edges: Sequence[float], buckets: IslBuckets) -> str | None:
    """Why a histogram share for ``threshold`` is a bound and not exact, in one line; None when it is
    exact in every bucket (the threshold is one ``le`` edge there and does not vary within the bucket)."""
    finite = [e for e in edges if math.isfinite(e)]
    if threshold.per_token_s > 0 and not threshold.table:
        return (f"{metric} SLO grows with ISL inside each bucket: its share is bounded by the counts at the "
                "le edges below its lowest and above its highest value in the bucket")
    off = []
    for i, label in enumerate(buckets.labels):
        t, _ = threshold.bucket_range_s(buckets, i)
        if t not in finite:
            below = max((e for e in finite if e <= t), default=None)
            above = min((e for e in finite if e >= t), default=None)
            between = f"between le={_g(below)} and le={_g(above)}" if below is not None and above is not None \
                else f"past le={_g(below if below is not None else above)}"
            off.append((f"{t:g} s", between, label))
    if not off:
        return None
    first, between, _ = off[0]
    where = "any bucket" if len(off) == len(buckets) else "bucket " + ", ".join(label for _, _, label in off)
    example = "" if len({x for x, _, _ in off}) == 1 else "e.g. "
    return (f"{metric} SLO is not an le edge in {where} ({example}{first}, {between}): the share lies between "
            "the counts at the edges either side; a threshold at an edge would make it exact")


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"
