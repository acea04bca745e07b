"""Per-request timing: integer-nanosecond timestamps in, an immutable record out.

Definitions (NVIDIA Dynamo frontend; aiperf counts reasoning as output too):

* TTFT: first chunk carrying generated output minus request arrival at the component
  that measures (a role-only chunk is not output).
* ITL: gap between consecutive output-bearing chunks divided by the tokens in the later
  chunk, recorded once per token (a 3-token chunk after a 30 ms gap gives three 10 ms
  values). Tokens beyond the first in the *first* chunk have no predecessor and get no ITL.
* Request duration: arrival to the end of the stream (or the error).

All times come from one monotonic clock (``time.perf_counter_ns()`` or an injected one) and
every duration is clamped at zero. ITL is accumulated in a request-local
:class:`~servelens.core.histogram.HistogramState`, so the per-chunk path is one bucket lookup and
one increment; it is merged into an exported histogram once, when the request ends.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

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

    Args:
        arrival_ns: when the request arrived (int ns, monotonic clock).
        itl_edges: ``le`` edges (seconds) of the request-local ITL histogram; use the same
            edges as the exported ITL histogram so the merge is exact.
        keep_values: also keep every per-token ITL value (the bench needs exact percentiles).
    """

    __slots__ = (
        "_edges",
        "_values",
        "arrival_ns",
        "first_output_ns",
        "itl",
        "last_output_ns",
        "output_chunks",
        "output_tokens",
    )

    def __init__(self, arrival_ns: int, itl_edges: tuple[float, ...], keep_values: bool = False) -> None:
        self.arrival_ns = arrival_ns
        self.first_output_ns: int | None = None
        self.last_output_ns: int = arrival_ns
        self.output_chunks = 0
        self.output_tokens = 0
        self.itl = HistogramState(itl_edges)
        self._edges = self.itl.edges
        self._values: list[float] | None = [] if keep_values else None

    def output(self, t_ns: int, tokens: int = 1) -> bool:
        """Record an output-bearing chunk at ``t_ns`` carrying ``tokens`` tokens (>= 1 counted).

        Returns True if this was the first output chunk (TTFT is now known).
        """
        if tokens < 1:
            tokens = 1
        self.output_chunks += 1
        self.output_tokens += tokens
        if self.first_output_ns is None:
            self.first_output_ns = t_ns
            self.last_output_ns = t_ns
            return True
        gap = t_ns - self.last_output_ns
        self.last_output_ns = t_ns
        per_token = (gap if gap > 0 else 0) / (tokens * NS_PER_S)
        itl = self.itl
        itl.counts[bisect_left(self._edges, per_token)] += tokens
        itl.sum += per_token * tokens
        if self._values is not None:
            self._values.extend([per_token] * tokens)
        return False

    @property
    def ttft_s(self) -> float | None:
        """TTFT in seconds once the first output chunk arrived, else None."""
        if self.first_output_ns is None:
            return None
        return max(0, self.first_output_ns - self.arrival_ns) / NS_PER_S

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

        ``osl`` defaults to nothing: callers pass ``usage.completion_tokens`` when they have it,
        or ``output_tokens`` counted from chunks (and say so).
        """
        return RequestRecord(
            arrival_ns=self.arrival_ns,
            first_output_ns=self.first_output_ns,
            end_ns=end_ns,
            ttft_s=self.ttft_s,
            duration_s=max(0, end_ns - self.arrival_ns) / NS_PER_S,
            itl=self.itl,
            isl=isl,
            osl=osl,
            cached_tokens=cached_tokens,
            output_chunks=self.output_chunks,
            output_tokens=self.output_tokens,
            status=status,
            error_type=error_type,
            itl_values_s=tuple(self._values) if self._values is not None else (),
        )
