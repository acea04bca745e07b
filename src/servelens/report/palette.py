"""The report's colours: one meaning each, in every chart of the HTML report.

* Percentiles: warm hues, darker for a higher percentile (p50 amber, p95 orange, p99 wine). A
  chart comparing two sources (client and gateway, two runs, two phases) gives both the same hue:
  the first solid, the second lighter and hatched.
* ISL buckets: cool hues of the Viridis scale, dark violet for the shortest prompts to green for
  the longest, sampled by the bucket's place in the bucket list, so the order reads from the
  colour; never a warm hue, so a bucket is never taken for a percentile.
* All requests (the "all" row, the single line of every prompt): near-black.
* Counts and means (requests, cached tokens): slate grey.
"""

from __future__ import annotations

from collections.abc import Sequence

from plotly.colors import sample_colorscale

PERCENTILE: dict[str, str] = {"p50": "#E8A33D", "p95": "#D4561C", "p99": "#8C1C3A"}
"""Colour of each percentile (p50, p95, p99)."""

ALL_REQUESTS = "#222222"
"""Colour of the all-requests series."""

COUNT = "#5F6B7A"
"""Colour of counts and means (requests per bucket, mean cached tokens)."""

SECOND_PATTERN = "/"
"""Hatch of the second source's bars."""

SOURCE_STYLES: tuple[tuple[float, str], ...] = ((0.0, ""), (0.55, SECOND_PATTERN), (0.3, "x"), (0.75, "."))
"""Per source of a comparison, in order: how much lighter its bars are (:func:`lighter`) and their hatch
(none for the first). The first two are the pair's (solid; lighter, hatched ``/``); a third source (the
demo's third phase) is lighter and cross-hatched, a fourth dotted; past four, the styles repeat."""

SOURCE_WORDS = ("solid", "lighter, hatched /", "hatched x", "dotted")
"""How a chart's note names each source's style, in :data:`SOURCE_STYLES` order."""

_VIRIDIS_SPAN = (0.0, 0.82)  # stops before Viridis' yellow end, which is close to the p50 amber


def lighter(colour: str, amount: float = 0.55) -> str:
    """``colour`` (``#rrggbb``) mixed with white by ``amount`` (0: as is, 1: white), as ``#rrggbb``."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    mix = [round(c + (255 - c) * amount) for c in (r, g, b)]
    return "#" + "".join(f"{c:02x}" for c in mix)


def bucket_colours(labels: Sequence[str]) -> dict[str, str]:
    """A colour per bucket label (``labels`` in numeric order): Viridis from violet to green."""
    lo, hi = _VIRIDIS_SPAN
    n = len(labels)
    points = [lo + (hi - lo) * (i / (n - 1) if n > 1 else 0.0) for i in range(n)]
    colours = sample_colorscale("Viridis", points, colortype="rgb") if n else []
    return {label: _hex(c) for label, c in zip(labels, colours, strict=True)}


def _hex(rgb: str) -> str:
    """``rgb(r, g, b)`` (floats allowed) as ``#rrggbb``."""
    parts = rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")
    return "#" + "".join(f"{round(float(p)):02x}" for p in parts[:3])
