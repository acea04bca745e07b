"""Histogram ``le`` edge sets: NVIDIA Dynamo's, servelens' finer default, and edges given as text.

Two sets of TTFT, ITL and request-duration edges exist:

* **Dynamo's** (``dynamo``): exactly what Dynamo 1.6.1's frontend exposes, log-spaced with 2
  significant figures and a factor of ~2.1 between edges (TTFT 0.47, 1, 2.2 s, ...). Prometheus'
  ``histogram_quantile`` interpolates linearly inside the bucket that holds the quantile, so a
  percentile read from these edges can be off by most of a bucket: up to +68 % for the TTFT p99 of
  the demo's buckets (docs/benchmarks.md). Dynamo's duration edges (0, 2, 4, 8, ... s) put every
  request of the demo (0.01-2 s) in one bucket, where ``histogram_quantile`` reads any p95 as 1.9 s.
  They are kept whenever Dynamo's names are exported (``--metrics-prefix dynamo_frontend``): the
  by-ISL twins must share their stock twin's edges, and Dynamo's stock histograms have these.
* **Fine** (``fine``, the default for servelens' own names): edges a factor of 2^(1/8) apart (the
  bucket boundaries of a native histogram at schema 3, written with 3 significant figures: 0.000977,
  0.00106, 0.00116, ...), from 2^-10 s (~1 ms) to 128 s for TTFT, from 2^-13 s (~0.12 ms) to 8 s
  for ITL and from 2^-7 s (~7.8 ms) to 512 s for the request duration, with Dynamo's coarse edges
  beyond (TTFT 220, 480 s; ITL 13, 24, 44, 80 s; none past 512 s for duration, whose last Dynamo
  edge is 510 s) and 0 first, as Dynamo has. Neighbouring edges are 8.3-9.8 % apart, so an
  interpolated percentile is within 9.8 % of the exact value (the bound is reached only when every
  value of the quantile's bucket sits at one end of it; for a smooth density the error is below 1 %).
  That costs 140 TTFT, 134 ITL and 130 duration edges instead of 18, 20 and 10 (the series count per
  model: :func:`servelens.prometheus.series_per_model`).

Why classic histograms with fixed edges, not native (exponential) ones: Prometheus 2.42 (Debian 12)
ingests native histograms only with ``--enable-feature=native-histograms`` and only over the protobuf
exposition format, which prometheus_client does not write (it writes native histograms in the
OpenMetrics 2.0 text format only, which 2.42 cannot parse), and VictoriaMetrics 1.79 stores none. The
dashboards' and report's ``_bucket``/``le`` queries work unchanged with finer edges.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from servelens.core.histogram import validate_edges

STEPS_PER_OCTAVE = 8
"""Fine edges per factor of 2 (native histogram schema 3: factor 2^(1/8) = 1.0905)."""

# `le` edges exactly as NVIDIA Dynamo 1.6.1's frontend exposes them (log-spaced, 2 significant
# figures, starting at 0).
TTFT_EDGES_S: tuple[float, ...] = (
    0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1, 2.2, 4.7, 10, 22, 48, 100, 220, 480,
)
ITL_EDGES_S: tuple[float, ...] = (
    0, 0.0018, 0.0033, 0.0059, 0.011, 0.02, 0.035, 0.064, 0.12, 0.21, 0.38, 0.69, 1.2, 2.3, 4.1,
    7.4, 13, 24, 44, 80,
)
DURATION_EDGES_S: tuple[float, ...] = (0, 2, 4, 8, 16, 32, 64, 130, 260, 510)
ISL_EDGES_TOKENS: tuple[float, ...] = (
    0, 100, 210, 430, 870, 1800, 3600, 7400, 15000, 31000, 63000, 130000,
)
CACHED_EDGES_TOKENS: tuple[float, ...] = ISL_EDGES_TOKENS
OSL_EDGES_TOKENS: tuple[float, ...] = (0, 100, 210, 430, 880, 1800, 3700, 7600, 16000, 32000)


def octave_edges(first_octave: int, end_octave: int) -> tuple[float, ...]:
    """Edges 2^(k/8) s for k from ``8 * first_octave`` to ``8 * end_octave`` inclusive, each rounded to 3
    significant figures (``octave_edges(0, 1)`` is 1, 1.09, 1.19, 1.3, 1.41, 1.54, 1.68, 1.83, 2).

    Raises ValueError unless ``first_octave < end_octave``.
    """
    if first_octave >= end_octave:
        raise ValueError(f"first octave {first_octave} must be below the end octave {end_octave}")
    steps = range(first_octave * STEPS_PER_OCTAVE, end_octave * STEPS_PER_OCTAVE + 1)
    return tuple(float(f"{2.0 ** (k / STEPS_PER_OCTAVE):.3g}") for k in steps)


def _fine(first_octave: int, end_octave: int, dynamo: tuple[float, ...]) -> tuple[float, ...]:
    top = 2.0 ** end_octave
    return (0.0, *octave_edges(first_octave, end_octave), *(float(e) for e in dynamo if e > top))


FINE_TTFT_EDGES_S: tuple[float, ...] = _fine(-10, 7, TTFT_EDGES_S)
"""0, then 2^(k/8) from 2^-10 s (0.977 ms) to 128 s, then Dynamo's 220 and 480 s: 140 edges."""
FINE_ITL_EDGES_S: tuple[float, ...] = _fine(-13, 3, ITL_EDGES_S)
"""0, then 2^(k/8) from 2^-13 s (0.122 ms) to 8 s, then Dynamo's 13, 24, 44 and 80 s: 134 edges."""
FINE_DURATION_EDGES_S: tuple[float, ...] = _fine(-7, 9, DURATION_EDGES_S)
"""0, then 2^(k/8) from 2^-7 s (7.81 ms) to 512 s (Dynamo's last edge is 510 s): 130 edges."""

def edges_kind(edges: Sequence[float], metric: str) -> str:
    """Which set ``edges`` (a histogram's finite ``le`` values, seconds, in order) is for ``metric``
    (``ttft`` or ``itl``): ``fine`` (servelens' default), ``dynamo`` (Dynamo 1.6.1's) or ``other`` (set by
    hand, ``--ttft-edges``/``--itl-edges``). What the report's notes describe. Raises ValueError for
    another ``metric``."""
    if metric not in ("ttft", "itl"):
        raise ValueError(f"metric must be 'ttft' or 'itl', got {metric!r}")
    finite = tuple(float(e) for e in edges if math.isfinite(e))
    fine, dynamo = (FINE_TTFT_EDGES_S, TTFT_EDGES_S) if metric == "ttft" else (FINE_ITL_EDGES_S, ITL_EDGES_S)
    if finite == fine:
        return "fine"
    if finite == tuple(float(e) for e in dynamo):
        return "dynamo"
    return "other"


EDGE_PRESETS: dict[str, tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]] = {
    "fine": (FINE_TTFT_EDGES_S, FINE_ITL_EDGES_S, FINE_DURATION_EDGES_S),
    "dynamo": (TTFT_EDGES_S, ITL_EDGES_S, DURATION_EDGES_S),
}
"""Named ``(TTFT, ITL, duration)`` edge sets (seconds)."""

EDGE_KINDS = ("ttft", "itl", "duration")
"""The histograms whose edges :func:`parse_edges` sets (the index into an :data:`EDGE_PRESETS` entry)."""


def parse_edges(spec: Any, kind: str) -> tuple[float, ...]:
    """``le`` edges (seconds) from a flag or YAML value: a preset name (``fine``, ``dynamo``), a
    comma-separated string of numbers, or a list of numbers. ``kind`` is ``ttft``, ``itl`` or
    ``duration`` (which of a preset's sets).

    Raises ValueError (one line) for an unknown preset, a value that is not a number, or edges that
    are empty, not strictly increasing or not finite.
    """
    if kind not in EDGE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(EDGE_KINDS)}, got {kind!r}")
    items: Sequence[Any]
    if isinstance(spec, str):
        name = spec.strip().lower()
        if name in EDGE_PRESETS:
            return tuple(float(e) for e in EDGE_PRESETS[name][EDGE_KINDS.index(kind)])
        items = [p for p in (s.strip() for s in spec.split(",")) if p]
    elif isinstance(spec, list | tuple):
        items = spec
    else:
        raise ValueError(f"{kind} edges must be fine, dynamo or a list of seconds, got {spec!r}")
    values: list[float] = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"{kind} edges must be numbers of seconds, got {item!r}")
        try:
            values.append(float(item))
        except (TypeError, ValueError):
            raise ValueError(
                f"{kind} edges must be fine, dynamo or comma-separated seconds, got {item!r}"
            ) from None
    try:
        return validate_edges(values)
    except ValueError as exc:
        raise ValueError(f"{kind} edges: {exc}") from None


@dataclass(frozen=True)
class MetricEdges:
    """``le`` edges of the six histograms (seconds or tokens).

    Defaults: the fine TTFT, ITL and duration edges, Dynamo 1.6.1's for the rest (ISL, OSL, cached
    tokens); :meth:`dynamo` gives Dynamo's for all six. Raises ValueError on construction if any set
    is empty, not strictly increasing or not finite.
    """

    ttft_s: tuple[float, ...] = FINE_TTFT_EDGES_S
    itl_s: tuple[float, ...] = FINE_ITL_EDGES_S
    duration_s: tuple[float, ...] = FINE_DURATION_EDGES_S
    isl_tokens: tuple[float, ...] = tuple(float(e) for e in ISL_EDGES_TOKENS)
    osl_tokens: tuple[float, ...] = tuple(float(e) for e in OSL_EDGES_TOKENS)
    cached_tokens: tuple[float, ...] = tuple(float(e) for e in CACHED_EDGES_TOKENS)

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, validate_edges(getattr(self, f.name)))

    @classmethod
    def dynamo(cls) -> MetricEdges:
        """Every set exactly as NVIDIA Dynamo 1.6.1's frontend exposes it."""
        return cls(ttft_s=TTFT_EDGES_S, itl_s=ITL_EDGES_S, duration_s=DURATION_EDGES_S)

    @property
    def is_dynamo(self) -> bool:
        """True when every set equals Dynamo 1.6.1's."""
        return self == MetricEdges.dynamo()
