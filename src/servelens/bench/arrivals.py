"""Arrival schedules: when each request is due, as int ns offsets from the run start.

Open loop: :func:`poisson_offsets` (exponential gaps, seeded), :func:`constant_offsets` (evenly spaced),
:func:`trace_offsets` (a trace's own offsets times ``time_scale``). Closed loop (``--concurrency N``
without a rate or trace) has no schedule: N workers send back to back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servelens.core.timing import NS_PER_S

ARRIVALS = ("poisson", "constant")


def constant_offsets(n: int, rate_per_s: float) -> list[int]:
    """``n`` offsets ``i / rate`` (ns), the first at 0. Raises ValueError for rate <= 0."""
    if rate_per_s <= 0:
        raise ValueError(f"request rate must be > 0, got {rate_per_s}")
    return [round(i * NS_PER_S / rate_per_s) for i in range(n)]


def poisson_offsets(n: int, rate_per_s: float, seed: int) -> list[int]:
    """``n`` offsets of a Poisson process of ``rate_per_s`` (exponential gaps with mean ``1/rate``),
    the first at 0; the same seed gives the same offsets. Raises ValueError for rate <= 0."""
    if rate_per_s <= 0:
        raise ValueError(f"request rate must be > 0, got {rate_per_s}")
    if n <= 0:
        return []
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, size=n - 1)
    out = [0]
    t = 0.0
    for g in gaps:
        t += float(g)
        out.append(round(t * NS_PER_S))
    return out


def trace_offsets(offsets_ns: Sequence[int], time_scale: float) -> list[int]:
    """A trace's offsets multiplied by ``time_scale`` (0.1 replays ten times faster).

    Raises ValueError for ``time_scale`` < 0.
    """
    if time_scale < 0:
        raise ValueError(f"time scale must be >= 0, got {time_scale}")
    return [round(o * time_scale) for o in offsets_ns]


def arrival_offsets(kind: str, n: int, rate_per_s: float, seed: int) -> list[int]:
    """Dispatch on ``kind`` (``poisson`` or ``constant``). Raises ValueError for another kind."""
    if kind == "poisson":
        return poisson_offsets(n, rate_per_s, seed)
    if kind == "constant":
        return constant_offsets(n, rate_per_s)
    raise ValueError(f"unknown arrival process {kind!r}; expected one of {', '.join(ARRIVALS)}")
