"""Detecting clumped token arrival: a buffering proxy between the client and the engine. Pure.

A proxy that buffers the response (nginx's default ``proxy_buffering on``, an HTTP/1.0 hop) holds
token events and lets them go in bursts: the client then sees most chunks arrive together (gaps near 0)
and long gaps between the bursts, so its ITL p50 reads ~0 and its p95 the proxy's flush interval, and
TTFT is late by up to one flush. An engine streaming at any real speed gives no such shape: its gaps sit
around its decode step. Measured on Debian's nginx with only ``proxy_pass`` (issue 16): 92 % of gaps
under 1 ms, p95 84 ms.

The test: at least :data:`MIN_GAPS` chunk gaps; at least :data:`NEAR_ZERO_FRACTION` of them under
``near_zero_ns``; and the gaps of at least ``long_factor`` times ``near_zero_ns`` hold at least
:data:`LONG_TIME_SHARE` of the time between chunks (the wait is concentrated in a few long gaps). An
engine whose own step is under ``near_zero_ns`` (a very fast one, or the sim sped up) has no long gaps
and is not flagged.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

NEAR_ZERO_NS = 1_000_000
"""A gap under this (1 ms) is "near zero": well under any engine's decode step at real speed."""
LONG_FACTOR = 10
"""A gap of at least ``LONG_FACTOR`` times the near-zero bound (10 ms) is a long one."""
NEAR_ZERO_FRACTION = 0.5
LONG_TIME_SHARE = 0.8
MIN_GAPS = 50


@dataclass(frozen=True)
class ClumpingReport:
    """What the gaps between a run's chunks show.

    Attributes:
        gaps: chunk gaps looked at (within each stream, between consecutive chunk arrivals).
        near_zero_fraction: share of them under ``near_zero_ns`` (0 without gaps).
        long_time_share: share of the time between chunks spent in long gaps (0 without time).
        clumped: the shape of a buffering proxy (see the module docstring).
        near_zero_ns: the near-zero bound used (int ns).
    """

    gaps: int
    near_zero_fraction: float
    long_time_share: float
    clumped: bool
    near_zero_ns: int = NEAR_ZERO_NS

    def line(self) -> str:
        """One line for the run's summary: a warning when clumped, else a short all-clear."""
        if not self.clumped:
            return f"token arrival: no clumping ({self.near_zero_fraction:.0%} of {self.gaps} chunk gaps near 0)"
        return (f"WARNING: tokens arrive in clumps: {self.near_zero_fraction:.0%} of {self.gaps} chunk gaps are "
                f"under {self.near_zero_ns / 1e6:g} ms and {self.long_time_share:.0%} of the time is in long gaps; "
                "a proxy is buffering the stream (nginx: proxy_buffering off, or X-Accel-Buffering: no): "
                "client ITL and TTFT are not the engine's")


def detect_clumping(
    streams: Iterable[Sequence[int]],
    near_zero_ns: int = NEAR_ZERO_NS,
    long_factor: float = LONG_FACTOR,
    min_gaps: int = MIN_GAPS,
) -> ClumpingReport:
    """Look for a buffering proxy in the chunk arrival times of a run's streams.

    ``streams``: per stream, the arrival times (or offsets) of its token-bearing chunks, int ns,
    non-decreasing. Gaps are taken within each stream, never across two. Returns a
    :class:`ClumpingReport`; fewer than ``min_gaps`` gaps are never flagged. Raises ValueError for a
    ``near_zero_ns`` < 1 or a ``long_factor`` <= 1.
    """
    if near_zero_ns < 1:
        raise ValueError(f"near_zero_ns must be >= 1, got {near_zero_ns}")
    if long_factor <= 1:
        raise ValueError(f"long_factor must be > 1, got {long_factor}")
    long_ns = near_zero_ns * long_factor
    gaps = near = 0
    total = long_total = 0
    for times in streams:
        for prev, t in itertools.pairwise(times):
            gap = max(0, t - prev)
            gaps += 1
            total += gap
            if gap < near_zero_ns:
                near += 1
            elif gap >= long_ns:
                long_total += gap
    fraction = near / gaps if gaps else 0.0
    share = long_total / total if total else 0.0
    clumped = gaps >= min_gaps and fraction >= NEAR_ZERO_FRACTION and share >= LONG_TIME_SHARE
    return ClumpingReport(gaps, fraction, share, clumped, near_zero_ns)
