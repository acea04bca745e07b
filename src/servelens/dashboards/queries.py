"""PromQL for the per-ISL-bucket figures, shared by the Grafana dashboard, the recording and alert
rules, and ``servelens report --prometheus`` (so the report shows exactly what the dashboard shows).

Bucket order: label values sort as strings in Prometheus, VictoriaMetrics and Grafana
(``1025-2048`` before ``513-1024``). The dashboard and the report therefore issue **one query per
bucket, in numeric order** (:func:`bucket_queries`) instead of one ``by (isl_bucket)`` query.
Each per-bucket query keeps ``isl_bucket`` in its ``by`` clause so its single result series still
carries the label (legends and checks can read it).

Formulas (Prometheus conventions):

* quantile: ``histogram_quantile(q, sum by (le, isl_bucket) (rate(<h>_bucket{...}[w])))``
* mean: ``sum by (isl_bucket) (rate(<h>_sum{...}[w])) / sum by (isl_bucket) (rate(<h>_count{...}[w]))``
* request rate: ``sum by (isl_bucket) (rate(<duration_by_isl>_count{...}[w]))``; a request counts
  in a bucket once it produced output (see :mod:`servelens.core.state`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from servelens.core.buckets import IslBuckets
from servelens.prometheus.names import MetricNames

GRAFANA_MODEL_MATCHER = 'model=~"$model"'
"""Model matcher used in the dashboard (the ``model`` template variable, multi-value)."""

GRAFANA_WINDOW = "$__rate_interval"
"""Rate window used in the dashboard (Grafana's recommended rate interval)."""

ISL_LABEL = "isl_bucket"


def model_matcher(model: str | None) -> str:
    """A PromQL matcher for one model (``model="llama"``), or ``""`` for all models."""
    return "" if not model else f"model={json.dumps(model)}"


def selector(bucket: str | None, model: str = "") -> str:
    """The label selector ``{isl_bucket="...",<model>}`` (``""`` when there is nothing to match).

    Args:
        bucket: an ISL bucket label, or None for the stock (all-requests) families.
        model: a ready matcher such as ``model=~"$model"`` (see :func:`model_matcher`), or ``""``.
    """
    parts = []
    if bucket is not None:
        parts.append(f"{ISL_LABEL}={json.dumps(bucket)}")
    if model:
        parts.append(model)
    return "{" + ",".join(parts) + "}" if parts else ""


def _by(bucket: str | None, extra: Sequence[str] = ()) -> str:
    labels = list(extra) + ([ISL_LABEL] if bucket is not None else [])
    return f"sum by ({', '.join(labels)})" if labels else "sum"


def quantile_expr(histogram: str, q: float, bucket: str | None, window: str, model: str = "") -> str:
    """``histogram_quantile(q, ...)`` of histogram family ``histogram`` (base name, no ``_bucket``)
    for one ISL bucket (None: all series of the family, e.g. the stock TTFT)."""
    return (
        f"histogram_quantile({q:g}, {_by(bucket, ['le'])} "
        f"(rate({histogram}_bucket{selector(bucket, model)}[{window}])))"
    )


def mean_expr(histogram: str, bucket: str | None, window: str, model: str = "") -> str:
    """Mean of the observations over the window: rate of ``_sum`` over rate of ``_count``."""
    sel = selector(bucket, model)
    by = _by(bucket)
    return f"{by} (rate({histogram}_sum{sel}[{window}])) / {by} (rate({histogram}_count{sel}[{window}]))"


def count_expr(histogram: str, bucket: str | None, window: str, model: str = "", func: str = "rate") -> str:
    """``rate`` (per second) or ``increase`` (count in the window) of the observations."""
    if func not in ("rate", "increase"):
        raise ValueError(f"func must be 'rate' or 'increase', got {func!r}")
    return f"{_by(bucket)} ({func}({histogram}_count{selector(bucket, model)}[{window}]))"


@dataclass(frozen=True)
class Figure:
    """One per-bucket figure: how to build its query for a bucket.

    Attributes:
        key: stable id (``ttft_p95``); also the :class:`~servelens.core.summary.BucketRow` field
            stem it fills in the report.
        title: panel title.
        unit: Grafana unit (``s``, ``reqps``, ``none``).
        kind: ``quantile``, ``mean`` or ``rate``.
        family: which histogram (``ttft``, ``itl``, ``cached``, ``duration``).
        q: the quantile for ``kind == "quantile"``.
    """

    key: str
    title: str
    unit: str
    kind: str
    family: str
    q: float = 0.0

    def expr(self, names: MetricNames, bucket: str | None, window: str, model: str = "") -> str:
        """The PromQL of this figure for one bucket (None: the stock all-requests family)."""
        by_isl = {
            "ttft": names.ttft_by_isl, "itl": names.itl_by_isl,
            "cached": names.cached_by_isl, "duration": names.duration_by_isl,
        }
        stock = {"ttft": names.ttft, "itl": names.itl, "cached": names.cached, "duration": names.duration}
        h = (by_isl if bucket is not None else stock)[self.family]
        if self.kind == "quantile":
            return quantile_expr(h, self.q, bucket, window, model)
        if self.kind == "mean":
            return mean_expr(h, bucket, window, model)
        if self.kind == "rate":
            return count_expr(h, bucket, window, model, "rate")
        raise ValueError(f"unknown figure kind {self.kind!r}")


FIGURES: tuple[Figure, ...] = (
    Figure("ttft_mean", "TTFT mean by input length", "s", "mean", "ttft"),
    Figure("ttft_p50", "TTFT p50 by input length", "s", "quantile", "ttft", 0.5),
    Figure("ttft_p95", "TTFT p95 by input length", "s", "quantile", "ttft", 0.95),
    Figure("ttft_p99", "TTFT p99 by input length", "s", "quantile", "ttft", 0.99),
    Figure("itl_p50", "ITL p50 by input length", "s", "quantile", "itl", 0.5),
    Figure("itl_p95", "ITL p95 by input length", "s", "quantile", "itl", 0.95),
    Figure("request_rate", "Request rate by input length", "reqps", "rate", "duration"),
    Figure("cached_mean", "Mean cached prompt tokens by input length", "none", "mean", "cached"),
)
"""The per-bucket figures, in dashboard panel order (each its own panel: on one shared panel a p99
spike flattens everything else)."""

FIGURE_BY_KEY = {f.key: f for f in FIGURES}


@dataclass(frozen=True)
class BucketQuery:
    """One query of a per-bucket panel: ``bucket`` is the label it selects (numeric order)."""

    bucket: str
    expr: str


def bucket_queries(
    figure: Figure, names: MetricNames, buckets: IslBuckets | Sequence[str], window: str, model: str = ""
) -> list[BucketQuery]:
    """One query per ISL bucket, in numeric bucket order (``buckets.labels`` order).

    Args:
        figure: one of :data:`FIGURES`.
        names: metric names (``--metrics-prefix``).
        buckets: the configured buckets, or bucket labels already in numeric order.
        window: rate window (``5m``, or ``$__rate_interval`` in Grafana).
        model: a model matcher (:func:`model_matcher`, or :data:`GRAFANA_MODEL_MATCHER`).
    """
    labels = buckets.labels if isinstance(buckets, IslBuckets) else tuple(buckets)
    return [BucketQuery(label, figure.expr(names, label, window, model)) for label in labels]
