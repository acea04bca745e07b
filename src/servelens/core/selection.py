"""Exact percentiles of very many weighted values in bounded memory: two passes over blocks.

The values (ITL in seconds, one per chunk, each standing for ``weight`` tokens) come in blocks, each
value with a group (an ISL bucket). A row is a set of groups (one bucket, or every bucket for "all").
Pass 1 counts the weight per group and value bin; the bins of the ranks a percentile needs follow
from the cumulative counts. Pass 2 keeps only the values in those bins, which are sorted to read the
ranks off. The result is the element numpy's ``percentile`` (method ``linear``) would pick from the
expanded values (``np.repeat(values, weights)``), interpolated as numpy does (:func:`numpy_linear`),
so it equals :func:`servelens.core.quantiles.percentile` of the expanded values to the last bit.

Binning needs only a non-decreasing map from value to bin: the top 16 bits of the value's float32
(:func:`value_bins`) are one, 128 bins per octave, 2 bytes a value, kept in the results folder so
that pass 1 reads 2 bytes a value and pass 2 reads the exact float64 only where it keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

Block = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None", "Callable[[np.ndarray], np.ndarray]"]
"""``(lengths, groups, bins, weights, values_at)`` of ``b`` values that come in ``r`` runs (a request's
values are a run): ``lengths`` (r,) int64, the values of each run (summing to ``b``); ``groups`` (r,)
int64, each run's group (``0..groups-1``); ``bins`` (b,) the values' :func:`value_bins` (uint16);
int ``weights`` (b,) (None: 1 each); and a function giving the float64 values (s, >= 0) at positions
(int array into the block): pass 2 asks only for the values it keeps. A group per run, not per
value, so that pass 2 never builds a per-value group array."""

NBINS = 1 << 15
"""Bins per group: every non-negative float32 has one (128 per octave)."""
BIN_BITS = 15


def value_bins(values: np.ndarray) -> np.ndarray:
    """Bin (uint16, ``0..NBINS-1``) of each non-negative value: the top 16 bits of its float32 (the
    exponent and 7 mantissa bits), non-decreasing in the value as rounding to float32 is. Negative
    values (not latencies) would land past the last bin; raises ValueError for them."""
    v = np.asarray(values, dtype=np.float32)
    if bool((v < 0).any()) or bool(np.isnan(v).any()):
        raise ValueError("values must be >= 0 and not NaN")
    return (v.view(np.uint32) >> 16).astype(np.uint16)


def add_block_counts(
    counts: np.ndarray, lengths: np.ndarray, runs: np.ndarray, bins: np.ndarray, weights: np.ndarray | None
) -> None:
    """Add a block's weight per (group, bin) to ``counts`` (``(groups, NBINS)`` int64, in place);
    the block as in :data:`Block`. The keys span only the bins the block has (``group * span + bin -
    lowest``), so the per-block count array is small (a block's ITL spans a few octaves, not 256)."""
    if bins.size == 0:
        return
    low, high = int(bins.min()), int(bins.max())
    span = high - low + 1
    key = np.repeat(np.asarray(runs, dtype=np.int64) * span - low, lengths)
    np.add(key, bins, out=key)  # int64 keys: bincount takes them without a copy
    n = counts.shape[0] * span
    got = np.bincount(key, minlength=n) if weights is None else np.bincount(key, weights, n).astype(np.int64)
    counts[:, low:high + 1] += got.reshape(-1, span)


def hits(
    any_bin: np.ndarray, want: np.ndarray, lengths: np.ndarray, runs: np.ndarray, bins: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Positions in a block (:data:`Block`) whose (group, bin) is wanted, and their groups: the bins
    alone are tested first (``any_bin``, shape ``(NBINS,)``: wanted in some group), one table look-up a
    value; the group is found only for those (the run that holds the position), then ``want``
    (``(groups, NBINS)`` bool) decides. Returns ``(positions, groups)``, int64 arrays."""
    hit = np.flatnonzero(np.take(any_bin, bins))
    run = np.searchsorted(np.cumsum(lengths), hit, side="right")
    g = np.asarray(runs, dtype=np.int64)[run]
    keep = want[g, bins[hit]]
    return hit[keep], g[keep]


def numpy_linear(lo: float, hi: float, virtual: float) -> float:
    """numpy's ``linear`` interpolation between the sorted values at ``floor(virtual)`` (``lo``) and the
    next one (``hi``), ``virtual`` the fractional rank ``(n - 1) * q``: numpy's ``_lerp``, written out
    so that the result is the same float."""
    t = virtual - math.floor(virtual)
    diff = hi - lo
    return hi - diff * (1 - t) if t >= 0.5 else lo + diff * t


def _ranks(n: int, q: float) -> tuple[float, int, int]:
    """numpy's virtual index and the two ranks it reads for percentile ``q`` (0..100) of ``n`` values."""
    virtual = (n - 1) * (q / 100)
    if virtual >= n - 1:
        return virtual, n - 1, n - 1
    lo = math.floor(virtual)
    return virtual, lo, lo + 1


@dataclass(frozen=True)
class _Target:
    row: int
    bin: int
    rank_in_bin: int  # 0-based, counting weights


def block_percentiles(
    blocks: Callable[[], Iterable[Block]], groups: int, rows: Sequence[Sequence[int]], qs: Sequence[float],
    counts: np.ndarray | None = None,
) -> list[list[float | None]]:
    """Exact percentiles ``qs`` (0..100) of each row's weighted values, reading ``blocks()`` twice,
    or once when ``counts`` gives pass 1's result already (``(groups, NBINS)`` int64: the weight per
    group and bin, e.g. kept by whoever wrote the values; it must be exactly that).

    ``rows[r]`` lists the groups (``0..groups-1``) of row ``r`` (a group in no row is left out: failed
    requests). Returns ``out[r][i]``, the percentile ``qs[i]`` of row ``r`` (None: the row has no
    weight). Memory: ``groups * NBINS`` counts plus the values of the bins the ranks fall in.
    Raises ValueError for ``counts`` of another shape.
    """
    if counts is not None:
        if counts.shape != (groups, NBINS):
            raise ValueError(f"counts must have shape ({groups}, {NBINS}), got {counts.shape}")
        per_group = counts
    else:
        per_group = np.zeros((groups, NBINS), dtype=np.int64)
        for lengths, runs, bins, w, _ in blocks():
            add_block_counts(per_group, lengths, runs, bins, w)
    targets: list[_Target] = []
    plan: list[list[tuple[float, int, int] | None]] = []  # per row and q: (virtual, target lo, target hi)
    for r, members in enumerate(rows):
        cum = np.cumsum(per_group[list(members)].sum(axis=0)) if members else np.zeros(NBINS, np.int64)
        n = int(cum[-1])
        row_plan: list[tuple[float, int, int] | None] = []
        for q in qs:
            if n == 0:
                row_plan.append(None)
                continue
            virtual, lo, hi = _ranks(n, q)
            ids = []
            for rank in (lo, hi):
                b = int(np.searchsorted(cum, rank, side="right"))
                below = int(cum[b - 1]) if b > 0 else 0
                ids.append(len(targets))
                targets.append(_Target(r, b, rank - below))
            row_plan.append((virtual, ids[0], ids[1]))
        plan.append(row_plan)
    picked = _pick(blocks, groups, rows, targets)
    return [[None if p is None else numpy_linear(picked[p[1]], picked[p[2]], p[0]) for p in row_plan]
            for row_plan in plan]


def _pick(
    blocks: Callable[[], Iterable[Block]], groups: int, rows: Sequence[Sequence[int]], targets: Sequence[_Target]
) -> list[float]:
    """Pass 2: the value at each target's rank."""
    if not targets:
        return []
    want = np.zeros((groups, NBINS), dtype=bool)
    for t in targets:
        want[list(rows[t.row]), t.bin] = True
    any_bin: np.ndarray = np.asarray(want.any(axis=0))
    got_g: list[np.ndarray] = []
    got_b: list[np.ndarray] = []
    got_v: list[np.ndarray] = []
    got_w: list[np.ndarray] = []
    weighted = False
    small = np.uint8 if groups <= 256 else np.int64  # what is kept: 11 bytes a value unweighted
    for lengths, runs, bins, w, values_at in blocks():
        hit, g = hits(any_bin, want, lengths, runs, bins)
        got_g.append(g.astype(small))
        got_b.append(bins[hit])
        got_v.append(values_at(hit))
        if w is not None:
            weighted = True
            got_w.append(w[hit].astype(np.int64))
        else:
            got_w.append(np.ones(0, np.int64))
    gs = np.concatenate(got_g) if got_g else np.zeros(0, np.int64)
    bs = np.concatenate(got_b) if got_b else np.zeros(0, np.uint16)
    vs = np.concatenate(got_v) if got_v else np.zeros(0)
    if weighted and any(x.size != y.size for x, y in zip(got_w, got_g, strict=True)):
        got_w = [x if x.size == y.size else np.ones(y.size, np.int64) for x, y in zip(got_w, got_g, strict=True)]
    ws = np.concatenate(got_w) if weighted else None
    out: list[float] = []
    in_row: dict[int, np.ndarray] = {}
    cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray | None]] = {}
    for t in targets:
        key = (t.row, t.bin)
        if key not in cache:
            if t.row not in in_row:
                member = np.zeros(groups, dtype=bool)
                member[list(rows[t.row])] = True
                in_row[t.row] = member[gs]
            sel = (bs == t.bin) & in_row[t.row]
            if ws is None:  # one token each: the rank is an index into the sorted values
                cache[key] = (np.sort(vs[sel]), None)
            else:
                order = np.argsort(vs[sel], kind="stable")
                cache[key] = (vs[sel][order], np.cumsum(ws[sel][order]))
        values, cum = cache[key]
        at = t.rank_in_bin if cum is None else int(np.searchsorted(cum, t.rank_in_bin, side="right"))
        out.append(float(values[at]))
    return out
