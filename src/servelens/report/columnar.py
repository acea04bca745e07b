"""The report's table and p95-over-time from a ``results.cols`` folder, without per-request objects.

The same figures as :func:`servelens.core.summary.rows_from_samples` and
:func:`servelens.report.sources.p95_over_time` over the JSONL (the tests compare them row by row),
computed on arrays: per-request columns whole (a few times 8 bytes a request), the ITL values
streamed in blocks of :data:`BLOCK`: their 2-byte bins twice, the float64 values once, where kept
(:func:`servelens.core.selection.block_percentiles`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servelens.core.buckets import IslBuckets
from servelens.core.quantiles import percentile
from servelens.core.selection import NBINS, Block, block_percentiles
from servelens.core.summary import ALL_LABEL, BucketRow
from servelens.formats.columnar import NULL, ColumnFile, Columns, open_columns

if TYPE_CHECKING:
    from servelens.report.sources import TimeSeries

BLOCK = 1 << 20
"""ITL values per block read (8 MiB of float64, 2 MiB of bins): blocks this small are reused from the
heap, where 4 M-value ones were mapped and unmapped by the allocator every time (page faults at every
block cost more than the arithmetic: 5.3 against 2.9 CPU s for a million requests)."""

ITL_QS = (50.0, 95.0, 99.0)


@dataclass(frozen=True)
class RequestColumns:
    """What the table needs per request, as arrays of shape ``(requests,)``.

    Attributes:
        isl: the ISL of the bucket (server's, else target), int64.
        ok: success, bool.
        ttft_s: TTFT (s), NaN without output.
        cached: cached tokens, :data:`~servelens.formats.columnar.NULL` when unknown.
        send_s: wall-clock send time (unix s), NaN when unknown.
        itl_start: ``(requests + 1,)`` offsets of each request's ITL values.
    """

    isl: np.ndarray
    ok: np.ndarray
    ttft_s: np.ndarray
    cached: np.ndarray
    send_s: np.ndarray
    itl_start: np.ndarray


def request_columns(c: Columns) -> RequestColumns:
    """Load the per-request columns of an opened folder. Raises ValueError for a truncated one."""
    server, target = c.column("isl_server"), c.column("isl_target")
    return RequestColumns(np.where(server != NULL, server, target), c.column("ok"), c.column("ttft_s"),
                          c.column("cached_tokens"), c.column("wall_send_s"), c.column("itl_start"))


def bucket_keys(rc: RequestColumns, buckets: IslBuckets, by: str) -> np.ndarray:
    """Each request's bucket index (``len(buckets)``: no bucket, only in "all": an unknown ISL, as
    the JSONL path leaves a request without one out of every bucket), int64."""
    edges = np.asarray(buckets.boundaries, dtype=np.int64)
    if by == "isl":
        known = rc.isl != NULL
        return np.where(known, np.searchsorted(edges, rc.isl, side="left"), len(buckets)).astype(np.int64)
    has = rc.cached != NULL
    uncached = np.maximum(rc.isl - np.where(has, rc.cached, 0), 0)
    return np.where(has, np.searchsorted(edges, uncached, side="left"), len(buckets)).astype(np.int64)


def _itl_blocks(c: Columns, rc: RequestColumns, groups: np.ndarray) -> Iterator[Block]:
    """The ITL values' bins with each request's group and value count, in blocks of about
    :data:`BLOCK` values cut at request boundaries; the float64 values are read only where pass 2
    asks, from the pages that hold them."""
    starts = rc.itl_start
    with itl_files(c) as (value_file, bin_file, weight_file):
        for r0, r1, a, b in itl_spans(starts, BLOCK):

            def values_at(pos: np.ndarray, a: int = a, b: int = b) -> np.ndarray:
                return value_file.at(a, b, pos)

            yield (np.diff(starts[r0:r1 + 1]), groups[r0:r1], bin_file.view(a, b),
                   weight_file.read(a, b) if weight_file is not None else None, values_at)


@contextmanager
def itl_files(c: Columns) -> Iterator[tuple[ColumnFile, ColumnFile, ColumnFile | None]]:
    """The ITL columns opened together: values (``itl_s``), bins (``itl_bin``) and, in a weighted run
    only, weights (``itl_weight``, else None); all closed on leaving, however it is left."""
    with c.open("itl_s") as value_file, c.open("itl_bin") as bin_file:
        if not c.weighted:
            yield value_file, bin_file, None
            return
        with c.open("itl_weight") as weight_file:
            yield value_file, bin_file, weight_file


def itl_spans(starts: np.ndarray, block: int) -> Iterator[tuple[int, int, int, int]]:
    """``(r0, r1, lo, hi)`` of each :func:`block_cuts` range that holds ITL values: requests
    ``[r0, r1)`` and their values ``[lo, hi)`` in the columns (``lo < hi``)."""
    for r0, r1 in block_cuts(starts, block):
        lo, hi = int(starts[r0]), int(starts[r1])
        if lo < hi:
            yield r0, r1, lo, hi


def block_cuts(starts: np.ndarray, block: int) -> list[tuple[int, int]]:
    """Request ranges ``[r0, r1)`` of about ``block`` values each, cut at request boundaries (a request
    longer than ``block`` is one range), from the ``(requests + 1,)`` offsets ``starts``."""
    total = int(starts[-1])
    cuts = np.unique(np.concatenate((np.searchsorted(starts, np.arange(0, total, block), side="right") - 1,
                                     [len(starts) - 1])))
    return list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))


def _row(label: str, members: np.ndarray, rc: RequestColumns, itl: list[float | None]) -> BucketRow:
    ok = members & rc.ok
    ttft = rc.ttft_s[ok]
    ttfts = ttft[~np.isnan(ttft)]
    cached_ok = ok & (rc.cached != NULL)
    cached = rc.cached[cached_ok]
    prompt = int(rc.isl[cached_ok].sum())
    requests = int(members.sum())

    def pct(q: float) -> float | None:
        v = percentile(ttfts, q)
        return None if math.isnan(v) else v

    return BucketRow(
        bucket=label, requests=requests, errors=requests - int(ok.sum()),
        ttft_p50_s=pct(50), ttft_p95_s=pct(95), ttft_p99_s=pct(99), itl_p50_s=itl[0], itl_p95_s=itl[1],
        mean_cached_tokens=int(cached.sum()) / cached.size if cached.size else None,
        # summed one after another as the JSONL path's sum() does, so that the mean is the same float
        ttft_mean_s=sum(ttfts.tolist()) / ttfts.size if ttfts.size else None,
        exact=True, itl_p99_s=itl[2],
        cache_hit_ratio=int(cached.sum()) / prompt if prompt > 0 else None,
    )


def rows_from_columns(path: str | Path, buckets: IslBuckets, by: str = "isl") -> list[BucketRow]:
    """Exact per-bucket rows then "all", as :func:`servelens.core.summary.rows_from_samples` gives for
    the same requests. Raises ValueError for a bad ``by`` or a missing, foreign or truncated folder."""
    if by not in ("isl", "uncached"):
        raise ValueError(f"by must be 'isl' or 'uncached', got {by!r}")
    c = open_columns(path)
    rc = request_columns(c)
    keys = bucket_keys(rc, buckets, by)
    nb = len(buckets)
    groups = np.where(rc.ok, keys, nb + 1)  # failed requests: a group in no row
    rows = [[j] for j in range(nb)] + [list(range(nb + 1))]
    counts = None
    if by == "isl" and c.bin_count_buckets == buckets.boundaries:  # pass 1 done by the writer
        counts = np.concatenate((c.bin_counts(), np.zeros((1, NBINS), dtype=np.int64)))
    itl = block_percentiles(lambda: _itl_blocks(c, rc, groups), nb + 2, rows, ITL_QS, counts)
    out = [_row(label, keys == j, rc, itl[j]) for j, label in enumerate(buckets.labels)]
    out.append(_row(ALL_LABEL, np.ones(keys.size, dtype=bool), rc, itl[nb]))
    return out


@dataclass(frozen=True)
class TimedTtft:
    """Per-request send time (unix s, NaN unknown), bucket index, success and TTFT (s, NaN none)."""

    send_s: np.ndarray
    bucket: np.ndarray
    ok: np.ndarray
    ttft_s: np.ndarray


def timed_ttft(path: str | Path, buckets: IslBuckets) -> TimedTtft:
    """The columns the p95-over-time chart needs, by ISL bucket. Raises ValueError as
    :func:`rows_from_columns`."""
    rc = request_columns(open_columns(path))
    return TimedTtft(rc.send_s, bucket_keys(rc, buckets, "isl"), rc.ok, rc.ttft_s)


def p95_over_time_columns(t: TimedTtft, buckets: IslBuckets, bins: int | None = None,
                          min_bin_s: float = 1.0) -> tuple[TimeSeries, ...]:
    """:func:`servelens.report.sources.p95_over_time` on columns (:func:`timed_ttft`): the same series."""
    from servelens.report.sources import PER_POINT, TimeSeries  # sources imports this module

    timed = ~np.isnan(t.send_s)
    send, bucket = t.send_s[timed], t.bucket[timed]
    if not send.size:
        return ()
    if bins is None:  # auto_bins
        bins = max(3, min(30, send.size // (max(np.unique(bucket).size, 1) * PER_POINT)))
    t0, t1 = float(send.min()), float(send.max())
    width = max((t1 - t0) / bins, min_bin_s)
    n = min(bins, int((t1 - t0) // width) + 1)  # as time_bins
    use = t.ok[timed] & ~np.isnan(t.ttft_s[timed])
    where = np.minimum(((send[use] - t0) // width).astype(np.int64), n - 1)
    ttft, bucket = t.ttft_s[timed][use], bucket[use]
    times = tuple(t0 + i * width for i in range(n))
    method = "exact p95 of the requests sent in the window that starts there"
    out = []
    for j, label in enumerate(buckets.labels):
        mine = bucket == j
        per = [ttft[mine & (where == i)] for i in range(n)]
        vals = tuple(percentile(v, 95) if v.size else None for v in per)
        if any(v is not None for v in vals):
            out.append(TimeSeries(label, times, vals, tuple(v.size for v in per), "client", method, width))
    return tuple(out)
