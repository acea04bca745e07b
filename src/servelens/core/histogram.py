"""Histogram state we own: ``le`` edges, per-bucket counts and the sum.

This mirrors a Prometheus classic histogram (cumulative ``le`` buckets, ``_sum``,
``_count``) but is plain Python state with no locking, so a request can keep a
private one (for ITL) and merge it into the exported one once, at the end.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Sequence


def validate_edges(edges: Sequence[float]) -> tuple[float, ...]:
    """Check ``le`` edges (finite upper bounds, strictly increasing; ``+Inf`` is implicit).

    Raises ValueError when empty, not increasing or containing a non-finite value.
    """
    out = tuple(float(e) for e in edges)
    if not out:
        raise ValueError("histogram edges must not be empty")
    for prev, cur in itertools.pairwise(out):
        if cur <= prev:
            raise ValueError(f"histogram edges must be strictly increasing: {cur:g} follows {prev:g}")
    if any(e != e or e in (float("inf"), float("-inf")) for e in out):
        raise ValueError("histogram edges must be finite (+Inf is added implicitly)")
    return out


class HistogramState:
    """Mutable histogram: ``counts[i]`` observations with ``edges[i-1] < v <= edges[i]``.

    ``counts`` has ``len(edges) + 1`` slots (the last one is ``+Inf``) and is *not*
    cumulative; :meth:`cumulative` gives the Prometheus view. ``sum`` is the sum of
    observed values (seconds or tokens, whatever the caller observes).
    """

    __slots__ = ("counts", "edges", "sum")

    def __init__(self, edges: Sequence[float]) -> None:
        self.edges: tuple[float, ...] = edges if isinstance(edges, tuple) else tuple(edges)
        self.counts: list[int] = [0] * (len(self.edges) + 1)
        self.sum: float = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """Add ``n`` observations of ``value`` (bucket lookup + increment)."""
        self.counts[bisect_left(self.edges, value)] += n
        self.sum += value * n

    def merge(self, other: HistogramState) -> None:
        """Add another histogram with the same edges into this one.

        Raises ValueError if the edges differ.
        """
        if other.edges != self.edges:
            raise ValueError("cannot merge histograms with different edges")
        counts = self.counts
        for i, c in enumerate(other.counts):
            if c:
                counts[i] += c
        self.sum += other.sum

    @property
    def count(self) -> int:
        """Total number of observations."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """Cumulative ``(le, count)`` pairs, ending with ``(inf, total)`` (Prometheus semantics)."""
        out: list[tuple[float, int]] = []
        running = 0
        for edge, c in zip((*self.edges, float("inf")), self.counts, strict=True):
            running += c
            out.append((edge, running))
        return out

    def copy(self) -> HistogramState:
        """An independent copy."""
        h = HistogramState(self.edges)
        h.counts = list(self.counts)
        h.sum = self.sum
        return h

    def __repr__(self) -> str:
        return f"HistogramState(count={self.count}, sum={self.sum:g}, edges={len(self.edges)})"
