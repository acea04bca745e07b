"""Exact percentiles of very many weighted values in bounded memory: two passes over blocks.

The values (ITL in seconds, one per chunk, each standing for ``weight`` tokens) come in blocks, each
value with a group (an ISL bucket). A row is a set of groups (one bucket, or every bucket for "all").
Pass 1 counts the weight per group and value bin; the bins of the ranks a percentile needs follow
from the cumulative counts. Pass 2 keeps only the values in those bins, which are sorted to read the
ranks off. The result is the element numpy's ``percentile`` (method ``linear``) would pick from the
expanded values (``np.repeat(values, weights)``), interpolated as numpy does (:func:`numpy_linear`),
so it equals :func:`servelens.core.quantiles.percentile` of the expanded values to the last bit.

Binning needs only a non-decreasing map from value to bin: the high bits of a non-negative float64
(its exponent and the top mantissa bits) are one, with :data:`SUB_BINS` bins per octave.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

Block = tuple[np.ndarray, np.ndarray, np.ndarray | None]
"""``(groups, values, weights)``: int group of each value (outside ``[0, groups)``: left out), float64
values (s, >= 0), int weights (None: 1 each); all of one length."""

_SHIFT = 45  # keeps the sign, the 11 exponent bits and the top 7 mantissa bits
SUB_BINS = 1 << (52 - _SHIFT)
"""Bins per octave of the value."""
_LO = int(np.array(2.0**-30).view(np.int64)) >> _SHIFT  # ~1 ns; below: the first bin
_HI = int(np.array(2.0**14).view(np.int64)) >> _SHIFT  # ~4.5 h; above: the last bin
NBINS = _HI - _LO + 1
"""Bins per group."""


def value_bins(values: np.ndarray) -> np.ndarray:
    """Bin (int64, ``0..NBINS-1``) of each float64 value, non-decreasing in the value (0 and -0 share
    the first bin). Raises ValueError for another dtype."""
    if values.dtype != np.float64:
        raise ValueError(f"values must be float64, got {values.dtype}")
    b = np.ascontiguousarray(values).view(np.int64) >> _SHIFT
    b -= _LO
    np.clip(b, 0, NBINS - 1, out=b)
    return b


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
    blocks: Callable[[], Iterable[Block]], groups: int, rows: Sequence[Sequence[int]], qs: Sequence[float]
) -> list[list[float | None]]:
    """Exact percentiles ``qs`` (0..100) of each row's weighted values, reading ``blocks()`` twice.

    ``rows[r]`` lists the groups (``0..groups-1``) of row ``r``. Returns ``out[r][i]``, the percentile
    ``qs[i]`` of row ``r`` (None: the row has no weight). Memory: ``groups * NBINS`` counts plus the
    values of the bins the ranks fall in. Raises ValueError for a negative weight.
    """
    counts = np.zeros(groups * NBINS, dtype=np.int64)
    for g, v, w in blocks():
        keep = (g >= 0) & (g < groups)
        key = g[keep] * NBINS + value_bins(v[keep])
        if w is None:
            counts += np.bincount(key, minlength=groups * NBINS)
        else:
            wk = w[keep]
            if wk.size and int(wk.min()) < 0:
                raise ValueError("weights must be >= 0")
            counts += np.bincount(key, weights=wk, minlength=groups * NBINS).astype(np.int64)
    per_group = counts.reshape(groups, NBINS)
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
    flat = want.reshape(-1)
    got_g: list[np.ndarray] = []
    got_b: list[np.ndarray] = []
    got_v: list[np.ndarray] = []
    got_w: list[np.ndarray] = []
    for g, v, w in blocks():
        keep = (g >= 0) & (g < groups)
        gk, vk = g[keep], v[keep]
        bins = value_bins(vk)
        hit = flat[gk * NBINS + bins]
        got_g.append(gk[hit])
        got_b.append(bins[hit])
        got_v.append(vk[hit])
        got_w.append(np.ones(int(hit.sum()), np.int64) if w is None else w[keep][hit].astype(np.int64))
    gs = np.concatenate(got_g) if got_g else np.zeros(0, np.int64)
    bs = np.concatenate(got_b) if got_b else np.zeros(0, np.int64)
    vs = np.concatenate(got_v) if got_v else np.zeros(0)
    ws = np.concatenate(got_w) if got_w else np.zeros(0, np.int64)
    out: list[float] = []
    cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for t in targets:
        key = (t.row, t.bin)
        if key not in cache:
            sel = (bs == t.bin) & np.isin(gs, list(rows[t.row]))
            order = np.argsort(vs[sel], kind="stable")
            cache[key] = (vs[sel][order], np.cumsum(ws[sel][order]))
        values, cum = cache[key]
        out.append(float(values[int(np.searchsorted(cum, t.rank_in_bin, side="right"))]))
    return out
