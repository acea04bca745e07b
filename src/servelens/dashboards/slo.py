"""Server-side SLO attainment from the by-ISL histograms (issue 17, section 3): per bucket, the
share of TTFTs (or of tokens, for ITL) at or below the SLO threshold, as a recording rule, and an
alert when it falls below a target.

**Why from histogram buckets, and which edge.** A Prometheus histogram counts observations at each
``le`` edge exactly, so the share at or below an edge is exact; between edges it is not known. The
rule reads the count at the **largest edge at or below the threshold** (for ``a + b * ISL``, below
the bucket's smallest threshold): a request counts as meeting the SLO only when the histogram shows
that it did, so the figure is a lower bound of the true attainment, exact when the threshold is an
edge. The alert therefore never misses a bucket below target; with a threshold between edges it can
fire while the true attainment is a little above it. Put the threshold on an edge (the ``description``
of each rule names the edge it used) for an exact figure. An exact server-side figure for any
threshold, or for TTFT and ITL together, needs a per-request counter at the source (not part of this).
ITL histograms count tokens: their figure is the share of tokens, not of requests whose mean ITL met it.

The edges are the prefix's defaults (:func:`servelens.prometheus.names.default_edges`: the fine
edges for servelens' names, Dynamo's for ``dynamo_frontend``) unless given: pass the edges your
server really exports when they differ (a gateway started with ``--ttft-edges``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from servelens.core.buckets import IslBuckets
from servelens.core.slo import Threshold
from servelens.dashboards.queries import ISL_LABEL
from servelens.prometheus.collector import format_le


@dataclass(frozen=True)
class AttainmentRule:
    """The attainment query of one bucket: the ``le`` edge it counts at and its PromQL."""

    bucket: str
    threshold_s: float
    edge_s: float
    expr: str
    varies: bool = False

    @property
    def exact(self) -> bool:
        """True when the threshold is the edge itself and does not vary inside the bucket."""
        return self.edge_s == self.threshold_s and not self.varies


def edge_at_or_below(threshold_s: float, edges: Sequence[float]) -> float:
    """The largest finite ``le`` edge <= ``threshold_s``. Raises ValueError when every edge is above it."""
    below = [e for e in edges if math.isfinite(e) and e <= threshold_s]
    if not below:
        raise ValueError(f"SLO threshold {threshold_s:g} s is below the smallest le edge ({min(edges):g}): "
                         "no histogram count can show a request meeting it")
    return max(below)


def le_matcher(edge: float) -> str:
    """A matcher for one ``le`` edge however the exporter spelt it: ``le=~"1|1\\\\.0"`` (Dynamo's
    Rust frontend and servelens write ``1``, prometheus_client ``1.0``; Prometheus 2 compares the
    label as a string)."""
    spellings = sorted({format_le(edge), repr(float(edge))})
    regex = "|".join(re.escape(s) for s in spellings)
    return f"le=~{json.dumps(regex)}"


def attainment_rules(histogram: str, threshold: Threshold, buckets: IslBuckets, edges: Sequence[float],
                     window: str = "5m", model: str = "", by: tuple[str, ...] = ("model",)) -> list[AttainmentRule]:
    """Per bucket (numeric order): ``sum by (isl_bucket, by) (rate(<h>_bucket{isl_bucket=B, le=E}[w]))
    / sum by (...) (rate(<h>_count{isl_bucket=B}[w]))`` at the edge ``E`` chosen as the module says.
    Raises ValueError when a threshold is below every edge."""
    out = []
    group = ", ".join((ISL_LABEL, *by))
    for i, label in enumerate(buckets.labels):
        low, high = threshold.bucket_range_s(buckets, i)
        edge = edge_at_or_below(low, edges)
        sel = ",".join(x for x in (f"{ISL_LABEL}={json.dumps(label)}", model) if x)
        expr = (f"sum by ({group}) (rate({histogram}_bucket{{{sel},{le_matcher(edge)}}}[{window}])) / "
                f"sum by ({group}) (rate({histogram}_count{{{sel}}}[{window}]))")
        out.append(AttainmentRule(label, low, edge, expr, high != low))
    return out
