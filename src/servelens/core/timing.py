"""Per-request timing: integer-nanosecond timestamps in, an immutable record out.

Definitions (NVIDIA Dynamo frontend; aiperf counts reasoning as output too):

* TTFT: first chunk carrying generated output minus request arrival at the component
  that measures (a role-only chunk is not output).
* ITL: gap between consecutive token-bearing chunks divided by the tokens in the later
  chunk, recorded once per token (a 3-token chunk after a 30 ms gap gives three 10 ms
  values). Tokens beyond the first in the *first* chunk have no predecessor and get no ITL.
  Chunks with one timestamp were read together (one read, one clock reading) and count as one chunk
  holding all their tokens (see :func:`itl_histogram`).
  Which chunks carry how many tokens: :mod:`servelens.core.stream`.
* Request duration: arrival to the end of the stream (or the error).
* A request with several choices (``n`` > 1): TTFT and ITL are the first choice's (its sequences
  decode together and their chunks interleave; see :mod:`servelens.gateway.meter`).

All times come from one monotonic clock (``time.perf_counter_ns()`` or an injected one) and
every duration is clamped at zero. The per-chunk path only appends the chunk's timestamp; ITL is
turned into a request-local :class:`~servelens.core.histogram.HistogramState` once, when the
request ends (one vectorised bucket lookup over all gaps), and merged into the exported histogram
once. That keeps the per-token cost far below a ``prometheus_client`` observe.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from servelens.core.histogram import HistogramState

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class RequestRecord:
    """What one request measured. Immutable; produced by :meth:`RequestTimer.finish`.

    Attributes:
        arrival_ns, first_output_ns, end_ns: monotonic timestamps (int ns); ``first_output_ns``
            is None when no output arrived.
        ttft_s: TTFT in seconds, None without output.
        itl: request-local ITL histogram (seconds, one observation per token after the first).
        itl_values_s: the per-token ITL values when the timer kept them (``keep_values=True``),
            else an empty tuple.
        duration_s: arrival to end, seconds (>= 0).
        isl, osl, cached_tokens: tokens, None when unknown (absent cached_tokens is unknown, not 0).
        output_chunks: output-bearing chunks seen; tokens counted from chunks: ``output_tokens``.
        status: ``"success"`` or ``"error"``; ``error_type`` in Dynamo's vocabulary ("" on success).
    """

    arrival_ns: int
    first_output_ns: int | None
    end_ns: int
    ttft_s: float | None
    duration_s: float
    itl: HistogramState
    isl: int | None
    osl: int | None
    cached_tokens: int | None
    output_chunks: int
    output_tokens: int
    status: str
    error_type: str = ""
    itl_values_s: tuple[float, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """True when the request succeeded."""
        return self.status == "success"


class RequestTimer:
    """Mutable per-request recorder (the hot path). Not thread-safe; one per request.

    The per-chunk path is one ``list.append`` of the timestamp (:meth:`output`, or
    ``timer.times_ns.append`` bound once per request for the cheapest path); tokens per chunk
    are remembered only for chunks carrying more than one. The request-local ITL histogram is
    built once, in :meth:`finish`, with one vectorised bucket lookup over all gaps, and is then
    merged into the exported histogram once. See docs/benchmarks.md for the cost against
    ``prometheus_client`` observe.

    Args:
        arrival_ns: when the request arrived (int ns, monotonic clock).
        itl_edges: ``le`` edges (seconds) of the request-local ITL histogram; use the same
            edges as the exported ITL histogram so the merge is exact.
        keep_values: also return every per-token ITL value in the record (the bench needs
            exact percentiles).
    """

    __slots__ = ("_edges", "arrival_ns", "chunk_tokens", "keep_values", "times_ns")

    def __init__(self, arrival_ns: int, itl_edges: tuple[float, ...], keep_values: bool = False) -> None:
        self.arrival_ns = arrival_ns
        self.times_ns: list[int] = []
        """Arrival time (int ns) of every output-bearing chunk, in order."""
        self.chunk_tokens: dict[int, int] = {}
        """Tokens of the chunks (by index into ``times_ns``) that carried more than one."""
        self._edges = itl_edges
        self.keep_values = keep_values

    def output(self, t_ns: int, tokens: int = 1) -> bool:
        """Record an output-bearing chunk at ``t_ns`` carrying ``tokens`` tokens (< 1 counts as 1).

        Returns True if this was the first output chunk (TTFT is now known).
        """
        times = self.times_ns
        times.append(t_ns)
        if tokens > 1:
            self.chunk_tokens[len(times) - 1] = tokens
        return len(times) == 1

    @property
    def first_output_ns(self) -> int | None:
        """Time of the first output chunk, None before it."""
        return self.times_ns[0] if self.times_ns else None

    @property
    def output_chunks(self) -> int:
        """Output-bearing chunks so far."""
        return len(self.times_ns)

    @property
    def output_tokens(self) -> int:
        """Output tokens counted from chunks (1 per chunk unless told otherwise)."""
        return len(self.times_ns) + sum(self.chunk_tokens.values()) - len(self.chunk_tokens)

    @property
    def ttft_s(self) -> float | None:
        """TTFT in seconds once the first output chunk arrived, else None."""
        if not self.times_ns:
            return None
        return max(0, self.times_ns[0] - self.arrival_ns) / NS_PER_S

    def itl(self) -> tuple[HistogramState, tuple[float, ...]]:
        """Build the request-local ITL histogram (and the values when ``keep_values``)."""
        return itl_histogram(self.times_ns, self.chunk_tokens, self._edges, self.keep_values)

    def finish(
        self,
        end_ns: int,
        status: str,
        error_type: str = "",
        isl: int | None = None,
        osl: int | None = None,
        cached_tokens: int | None = None,
    ) -> RequestRecord:
        """Close the request and return its immutable record.

        ``osl`` is ``usage.completion_tokens`` when the caller has it; otherwise pass
        ``output_tokens`` counted from chunks (and say so), or None.
        """
        hist, values = self.itl()
        return RequestRecord(
            arrival_ns=self.arrival_ns,
            first_output_ns=self.first_output_ns,
            end_ns=end_ns,
            ttft_s=self.ttft_s,
            duration_s=max(0, end_ns - self.arrival_ns) / NS_PER_S,
            itl=hist,
            isl=isl,
            osl=osl,
            cached_tokens=cached_tokens,
            output_chunks=self.output_chunks,
            output_tokens=self.output_tokens,
            status=status,
            error_type=error_type,
            itl_values_s=values,
        )


_VECTORISE_FROM = 48  # chunks; below this a plain loop beats numpy's fixed cost


def itl_per_chunk(times_ns: Sequence[int], chunk_tokens: Mapping[int, int]) -> tuple[np.ndarray, np.ndarray | None]:
    """Every chunk's per-token ITL after the first chunk, by the definition of :func:`itl_histogram`.

    Returns ``(values, weights)``: ``values`` float64 (s), shape ``(len(times_ns) - 1,)`` (empty for
    fewer than two chunks), the ITL each token of chunk ``i + 1`` gets; ``weights`` int64 of the same
    shape, the tokens of that chunk, or None when every weight is 1. The request's ITL values are
    ``np.repeat(values, weights)``.
    """
    n = len(times_ns)
    if n < 2:
        return np.zeros(0), None
    t_arr = np.asarray(times_ns, dtype=np.int64)
    steps = np.diff(t_arr)
    gaps = np.maximum(steps, 0).astype(np.float64)
    read_start = steps != 0
    if not chunk_tokens and read_start.all():
        return gaps / NS_PER_S, None
    weights = np.ones(n - 1, dtype=np.int64)
    for i, k in chunk_tokens.items():
        if i >= 1:
            weights[i - 1] = k
    if read_start.all():  # every chunk read on its own: one gap per chunk
        return gaps / (weights * NS_PER_S), weights
    # group g holds the chunks read together; group 0 those read with the first chunk (gap 0)
    group = np.cumsum(read_start)
    group_tokens = np.bincount(group, weights=weights)
    group_gap = np.zeros(len(group_tokens))
    group_gap[group[read_start]] = gaps[read_start]
    return group_gap[group] / (group_tokens[group] * NS_PER_S), weights


def itl_histogram(
    times_ns: list[int], chunk_tokens: dict[int, int], edges: tuple[float, ...], keep_values: bool = False
) -> tuple[HistogramState, tuple[float, ...]]:
    """ITL histogram of one request from its chunk times (int ns) and multi-token chunks.

    Each gap between consecutive chunks, divided by the tokens of the later chunk, is observed
    once per token (Dynamo definition); negative gaps are clamped to 0. Chunks that share one
    timestamp were read together (one read, one clock reading): they count as one chunk holding all
    their tokens, so the gap since the previous read is shared out over every token of the read
    instead of going whole to the first and 0 to the rest. Tokens that arrived with the first one
    (beyond the first in the first chunk, or in chunks read with it) get an ITL of 0: they waited
    for nothing after it. Returns ``(histogram, values)``; ``values`` is empty unless ``keep_values``.
    """
    hist = HistogramState(edges)
    n = len(times_ns)
    if n < 2:
        return hist, ()
    if n < _VECTORISE_FROM and not keep_values:
        counts = hist.counts
        total = 0.0
        i = 1
        prev = times_ns[0]
        while i < n:
            t = times_ns[i]
            j = i + 1  # chunks i..j-1 were read at t
            while j < n and times_ns[j] == t:
                j += 1
            tok = sum(chunk_tokens.get(k, 1) for k in range(i, j)) if chunk_tokens else j - i
            v = (t - prev) / (tok * NS_PER_S) if t > prev else 0.0
            prev = t
            counts[bisect_left(edges, v)] += tok
            total += v * tok
            i = j
        hist.sum = total
        return hist, ()
    per, w = itl_per_chunk(times_ns, chunk_tokens)
    idx = np.searchsorted(np.asarray(edges), per, side="left")
    if w is None:  # the common case: one token per chunk, one chunk per read
        hist.counts = np.bincount(idx, minlength=len(edges) + 1).tolist()
        hist.sum = float(per.sum())
        return hist, (tuple(per.tolist()) if keep_values else ())
    weights = w
    hist.counts = np.bincount(idx, weights=weights, minlength=len(edges) + 1).astype(np.int64).tolist()
    hist.sum = float((per * weights).sum())
    values = tuple(np.repeat(per, weights).tolist()) if keep_values else ()
    return hist, values
