"""Exact weighted quantiles of grouped samples that are not held in memory: counts per value bin
first, the values themselves only in the bins the quantiles fall in.

``servelens explain`` needs, per window, inverted-CDF quantiles of every observation, of each ISL
bucket's, and of the counterfactual mixture (every observation of bucket ``b`` weighted
``wA_b / nB_b``). A million requests' ITL is ~365 M values: too many to hold (8 bytes each) or sort.
A :class:`BinnedValues` knows each group's count per value bin (:func:`~servelens.core.selection.value_bins`:
the top 16 bits of the float32, 128 bins per octave) and can ``gather`` the values of chosen
(group, bin) cells, in one pass over wherever they are. :func:`mixture_quantiles` finds from the
counts the bin where each quantile's rank falls, gathers those bins once for every row, and reads the
value off within the bin.

**Definition** (:func:`servelens.core.quantiles.weighted_quantiles`, Hyndman & Fan type 1): the
quantile ``q`` of the distribution putting weight ``w_g`` on every observation of group ``g`` is
the smallest value ``v`` whose cumulative weight ``C(v) = sum_g w_g * #{x in g: x <= v}`` reaches
``q * C(inf) * (1 - 1e-12)`` (the relative tolerance keeps a rank that lands exactly on a step from
being missed by rounding). Here ``C`` is always evaluated as that sum of per-group *integer* counts
times the weight, group after group: a row of weights 0 and 1 is integer arithmetic (exact, the ranks
of :func:`numpy.partition`), and any row rounds one sum of a few terms per value, never a running
float sum over millions of values. The bin chosen from the counts and the value chosen inside it use
the same expression, so the value is the one the definition picks from all observations at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from servelens.core.selection import NBINS, value_bins

Gather = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""``want`` (``(groups, NBINS)`` bool) in; out every observation of a wanted (group, bin) cell:
``(values, groups)``, float64 seconds and int64 group indices, shape ``(m,)`` each, in any order."""

TOLERANCE = 1e-12
"""Relative tolerance of the rank, as :func:`servelens.core.quantiles.weighted_quantiles`."""


@dataclass(frozen=True, eq=False)
class BinnedValues:
    """Observations in groups (ISL buckets), known by their counts per value bin, with a reader.

    Attributes:
        counts: shape ``(groups, NBINS)``, int64: observations of each group in each
            :func:`~servelens.core.selection.value_bins` bin.
        gather: reads the observations of chosen cells (:data:`Gather`); it must return exactly the
            observations ``counts`` counts there (a value standing for several tokens, repeated).

    Raises ValueError for counts that are not 2-D with ``NBINS`` columns, or negative.
    """

    counts: np.ndarray
    gather: Gather

    def __post_init__(self) -> None:
        c = self.counts
        if c.ndim != 2 or c.shape[1] != NBINS:
            raise ValueError(f"counts must have shape (groups, {NBINS}), got {c.shape}")
        if c.size and int(c.min()) < 0:
            raise ValueError("counts must be >= 0")

    @property
    def groups(self) -> int:
        """Number of groups."""
        return int(self.counts.shape[0])

    @functools.cached_property
    def cumulative(self) -> np.ndarray:
        """Cumulative counts per group over the bins, shape ``(groups, NBINS)``, float64 (exact
        integers below 2**53)."""
        return np.cumsum(self.counts, axis=1).astype(float)


def in_memory(values: Sequence[np.ndarray]) -> BinnedValues:
    """:class:`BinnedValues` of arrays held in memory, one per group (s, >= 0). Raises ValueError
    for a negative or NaN value."""
    vals = [np.asarray(v, dtype=float) for v in values]
    bins = [value_bins(v) for v in vals]
    counts = np.zeros((len(vals), NBINS), dtype=np.int64)
    for g, b in enumerate(bins):
        counts[g] = np.bincount(b, minlength=NBINS)

    def gather(want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        got_v, got_g = [np.zeros(0)], [np.zeros(0, dtype=np.int64)]
        for g, (v, b) in enumerate(zip(vals, bins, strict=True)):
            if want[g].any():
                keep = np.take(want[g], b)
                got_v.append(v[keep])
                got_g.append(np.full(int(keep.sum()), g, dtype=np.int64))
        return np.concatenate(got_v), np.concatenate(got_g)

    return BinnedValues(counts, gather)


Part = tuple[BinnedValues, np.ndarray]
"""A source and the weight of each of its groups' observations, shape ``(groups,)`` (0: left out)."""


@dataclass(frozen=True)
class _Target:
    row: int
    q: int
    bin: int
    rank: float  # the cumulative weight to reach


def _terms(parts: Sequence[Part]) -> list[tuple[int, int, float]]:
    """(part, group, weight) of every group with weight and observations, in a fixed order."""
    out: list[tuple[int, int, float]] = []
    for p, (src, weights) in enumerate(parts):
        w = np.asarray(weights, dtype=float)
        if w.shape != (src.groups,):
            raise ValueError(f"a part's weights must have shape ({src.groups},), got {w.shape}")
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError("weights must be finite and >= 0")
        out.extend((p, g, float(w[g])) for g in range(src.groups) if w[g] > 0 and src.counts[g].any())
    return out


def mixture_quantiles(rows: Sequence[Sequence[Part]], qs: Sequence[float]) -> list[tuple[float | None, ...]]:
    """Per row, the weighted quantiles ``qs`` (each in [0, 1]) of the observations of its parts
    (module docstring for the definition); None where a row has no weight. Every source's
    ``gather`` is called once, for the bins of every row.

    Raises ValueError for a ``q`` outside [0, 1], or weights of the wrong shape, negative or not finite.
    """
    for q in qs:
        if not 0 <= q <= 1:
            raise ValueError(f"quantile must be within [0, 1], got {q}")
    terms = [_terms(parts) for parts in rows]
    sources: dict[int, BinnedValues] = {}
    want: dict[int, np.ndarray] = {}
    targets: list[_Target] = []
    for r, (parts, row_terms) in enumerate(zip(rows, terms, strict=True)):
        if not row_terms:
            continue
        cum = np.zeros(NBINS)
        filled = np.zeros(NBINS, dtype=bool)
        for p, g, w in row_terms:
            src = parts[p][0]
            cum += w * src.cumulative[g]
            filled |= src.counts[g] > 0
        nz = np.flatnonzero(filled)
        total = float(cum[-1])
        for i, q in enumerate(qs):
            rank = q * total * (1 - TOLERANCE)
            j = int(nz[min(int(np.searchsorted(cum[nz], rank, side="left")), nz.size - 1)])
            targets.append(_Target(r, i, j, rank))
            for p, g, _ in row_terms:
                src = parts[p][0]
                sources[id(src)] = src
                want.setdefault(id(src), np.zeros((src.groups, NBINS), dtype=bool))[g, j] = True
    in_bin = {key: _by_cell(*sources[key].gather(mask), sources[key].groups) for key, mask in want.items()}
    out: list[list[float | None]] = [[None] * len(qs) for _ in rows]
    for t in targets:
        out[t.row][t.q] = _pick(rows[t.row], terms[t.row], in_bin, t)
    return [tuple(x) for x in out]


def _by_cell(values: np.ndarray, groups: np.ndarray, n_groups: int) -> dict[tuple[int, int], np.ndarray]:
    """Gathered observations per (bin, group), in no order within one."""
    out: dict[tuple[int, int], np.ndarray] = {}
    for g in range(n_groups):
        mine = values[groups == g]
        bins = value_bins(mine)
        order = np.argsort(bins, kind="stable")  # 16-bit keys: a radix sort
        mine, bins = mine[order], bins[order]
        cuts = np.flatnonzero(np.diff(bins)) + 1
        starts, stops = np.concatenate(([0], cuts)), np.concatenate((cuts, [bins.size]))
        out.update(((int(bins[a]), g), mine[a:b]) for a, b in zip(starts.tolist(), stops.tolist(), strict=True)
                   if b > a)
    return out


def _pick(parts: Sequence[Part], terms: Sequence[tuple[int, int, float]],
          in_bin: dict[int, dict[tuple[int, int], np.ndarray]], t: _Target) -> float:
    """The value at the target's cumulative weight inside its bin (:func:`_select`)."""
    empty = np.zeros(0)
    got = [in_bin.get(id(parts[p][0]), {}).get((t.bin, g), empty) for p, g, _ in terms]
    values = np.concatenate(got)
    ids = np.repeat(np.arange(len(terms), dtype=np.int64), [v.size for v in got])
    if values.size == 0:  # cannot happen for counts that match the gathered values
        raise ValueError("a bin the counts say holds observations gathered none (counts and values differ)")
    below = np.array([parts[p][0].cumulative[g][t.bin - 1] if t.bin > 0 else 0.0 for p, g, _ in terms])
    return _select(values, ids, np.array([w for _, _, w in terms]), below, t.rank)


SMALL = 4096
"""Candidates sorted outright; more are first narrowed by sub-bins of their float64 bits."""


def _select(values: np.ndarray, ids: np.ndarray, weights: np.ndarray, below: np.ndarray, rank: float) -> float:
    """The smallest of ``values`` whose cumulative weight reaches ``rank``, the cumulative weight at a
    value being ``sum_t weights[t] * (below[t] + #{candidates of term t <= value})`` (``ids``: each
    candidate's term; ``below``: each term's count under every candidate, integers).

    Many candidates are narrowed first, in O(n): sub-bins of the float64 bits (non-decreasing in the
    value for values >= 0, 65,536 of them across the candidates' span), counted per term, the same
    sum at each sub-bin's end picks the sub-bin, and its terms' counts below join ``below``. A few
    are sorted. Either way the sum is evaluated on exact integer counts, so the answer is the one
    the definition gives on all observations at once."""
    terms = weights.size
    while values.size > SMALL:
        bits = np.ascontiguousarray(values).view(np.uint64)
        low = int(bits.min())
        span = int(bits.max()) - low
        if span == 0:  # all equal
            return float(values[0])
        shift = max(0, span.bit_length() - 16)
        sub = ((bits - np.uint64(low)) >> np.uint64(shift)).astype(np.int64)
        width = (span >> shift) + 1
        counts = np.bincount(ids * width + sub, minlength=terms * width).reshape(terms, width)
        cum_counts = np.cumsum(counts, axis=1)
        cum = np.zeros(width)
        for k in range(terms):
            cum += weights[k] * (below[k] + cum_counts[k])
        nz = np.flatnonzero(counts.any(axis=0))
        at = int(nz[min(int(np.searchsorted(cum[nz], rank, side="left")), nz.size - 1)])
        if at > 0:
            below = below + cum_counts[:, at - 1]
        keep = sub == at
        values, ids = values[keep], ids[keep]
    order = np.argsort(values, kind="stable")
    values, ids = values[order], ids[order]
    cum = np.zeros(values.size)
    for k in range(terms):
        cum += weights[k] * (below[k] + np.cumsum(ids == k))
    at = int(np.searchsorted(cum, rank, side="left"))
    return float(values[min(at, values.size - 1)])
