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
* prefix-cache hit ratio: ``sum by (isl_bucket) (rate(<cached_by_isl>_sum{...}[w])) / sum by (isl_bucket)
  (rate(<prompt_tokens_by_isl>{...}[w]))``: cached over prompt tokens of the requests that reported
  cached tokens (the all-requests figure sums the same two over every bucket).

The opt-in buckets by uncached prompt tokens (label ``uncached_bucket``) have the same queries over
their own families (:data:`UNCACHED_FIGURES`: TTFT, ITL and the request rate).
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
UNCACHED_LABEL = "uncached_bucket"


def model_matcher(model: str | None) -> str:
    """A PromQL matcher for one model (``model="llama"``), or ``""`` for all models."""
    return "" if not model else f"model={json.dumps(model)}"


def selector(bucket: str | None, model: str = "", label: str = ISL_LABEL) -> str:
    """The label selector ``{isl_bucket="...",<model>}`` (``""`` when there is nothing to match).

    Args:
        bucket: an ISL bucket label, or None for the stock (all-requests) families.
        model: a ready matcher such as ``model=~"$model"`` (see :func:`model_matcher`), or ``""``.
        label: the bucket label's name (``isl_bucket``, or ``uncached_bucket``).
    """
    parts = []
    if bucket is not None:
        parts.append(f"{label}={json.dumps(bucket)}")
    if model:
        parts.append(model)
    return "{" + ",".join(parts) + "}" if parts else ""


def _by(bucket: str | None, extra: Sequence[str] = (), label: str = ISL_LABEL) -> str:
    labels = list(extra) + ([label] if bucket is not None else [])
    return f"sum by ({', '.join(labels)})" if labels else "sum"


def quantile_expr(histogram: str, q: float, bucket: str | None, window: str, model: str = "",
                  label: str = ISL_LABEL) -> str:
    """``histogram_quantile(q, ...)`` of histogram family ``histogram`` (base name, no ``_bucket``)
    for one bucket of ``label`` (None: all series of the family, e.g. the stock TTFT)."""
    return (
        f"histogram_quantile({q:g}, {_by(bucket, ['le'], label)} "
        f"(rate({histogram}_bucket{selector(bucket, model, label)}[{window}])))"
    )


def mean_expr(histogram: str, bucket: str | None, window: str, model: str = "", label: str = ISL_LABEL) -> str:
    """Mean of the observations over the window: rate of ``_sum`` over rate of ``_count``."""
    sel = selector(bucket, model, label)
    by = _by(bucket, (), label)
    return f"{by} (rate({histogram}_sum{sel}[{window}])) / {by} (rate({histogram}_count{sel}[{window}]))"


def count_expr(histogram: str, bucket: str | None, window: str, model: str = "", func: str = "rate",
               label: str = ISL_LABEL) -> str:
    """``rate`` (per second) or ``increase`` (count in the window) of the observations."""
    if func not in ("rate", "increase"):
        raise ValueError(f"func must be 'rate' or 'increase', got {func!r}")
    return f"{_by(bucket, (), label)} ({func}({histogram}_count{selector(bucket, model, label)}[{window}]))"


def hit_ratio_expr(names: MetricNames, bucket: str | None, window: str, model: str = "") -> str:
    """The prefix-cache hit ratio of one ISL bucket (None: every bucket together): cached tokens over
    prompt tokens of the requests that reported cached tokens (``cached_tokens_by_isl`` ``_sum`` over
    ``prompt_tokens_by_isl_total``). No result when no request reported cached tokens (0/0)."""
    sel = selector(bucket, model)
    by = _by(bucket)
    return (f"{by} (rate({names.cached_by_isl}_sum{sel}[{window}])) / "
            f"{by} (rate({names.prompt_tokens_by_isl}{sel}[{window}]))")


@dataclass(frozen=True)
class Figure:
    """One per-bucket figure: how to build its query for a bucket.

    Attributes:
        key: stable id (``ttft_p95``); also the :class:`~servelens.core.summary.BucketRow` field
            stem it fills in the report.
        title: panel title.
        unit: Grafana unit (``s``, ``reqps``, ``none``).
        kind: ``quantile``, ``mean``, ``rate`` or ``hit_ratio`` (:func:`hit_ratio_expr`).
        family: which histogram (``ttft``, ``itl``, ``cached``, ``duration``).
        q: the quantile for ``kind == "quantile"``.
        by: ``isl`` (label ``isl_bucket``) or ``uncached`` (label ``uncached_bucket``: TTFT, ITL,
            duration only).
    """

    key: str
    title: str
    unit: str
    kind: str
    family: str
    q: float = 0.0
    by: str = "isl"

    @property
    def label(self) -> str:
        """The bucket label's name."""
        return UNCACHED_LABEL if self.by == "uncached" else ISL_LABEL

    def expr(self, names: MetricNames, bucket: str | None, window: str, model: str = "") -> str:
        """The PromQL of this figure for one bucket (None: the stock all-requests family)."""
        if self.kind == "hit_ratio":
            return hit_ratio_expr(names, bucket, window, model)
        by_isl = {
            "ttft": names.ttft_by_isl, "itl": names.itl_by_isl,
            "cached": names.cached_by_isl, "duration": names.duration_by_isl,
        }
        if self.by == "uncached":
            by_isl = {"ttft": names.ttft_by_uncached, "itl": names.itl_by_uncached,
                      "duration": names.duration_by_uncached}
        stock = {"ttft": names.ttft, "itl": names.itl, "cached": names.cached, "duration": names.duration}
        h = (by_isl if bucket is not None else stock)[self.family]
        label = self.label
        if self.kind == "quantile":
            return quantile_expr(h, self.q, bucket, window, model, label)
        if self.kind == "mean":
            return mean_expr(h, bucket, window, model, label)
        if self.kind == "rate":
            return count_expr(h, bucket, window, model, "rate", label)
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
    Figure("cache_hit_ratio", "Prefix-cache hit ratio (cached / prompt tokens) by input length", "percentunit",
           "hit_ratio", "cached"),
)
"""The per-bucket figures, in dashboard panel order (each its own panel: on one shared panel a p99
spike flattens everything else)."""

FIGURE_BY_KEY = {f.key: f for f in FIGURES}

UNCACHED_FIGURES: tuple[Figure, ...] = (
    Figure("ttft_mean", "TTFT mean by uncached prompt tokens", "s", "mean", "ttft", by="uncached"),
    Figure("ttft_p50", "TTFT p50 by uncached prompt tokens", "s", "quantile", "ttft", 0.5, by="uncached"),
    Figure("ttft_p95", "TTFT p95 by uncached prompt tokens", "s", "quantile", "ttft", 0.95, by="uncached"),
    Figure("ttft_p99", "TTFT p99 by uncached prompt tokens", "s", "quantile", "ttft", 0.99, by="uncached"),
    Figure("itl_p50", "ITL p50 by uncached prompt tokens", "s", "quantile", "itl", 0.5, by="uncached"),
    Figure("itl_p95", "ITL p95 by uncached prompt tokens", "s", "quantile", "itl", 0.95, by="uncached"),
    Figure("request_rate", "Request rate by uncached prompt tokens", "reqps", "rate", "duration", by="uncached"),
)
"""The figures per uncached bucket (label ``uncached_bucket``), with the opt-in families; the hit ratio
needs no such twin (it is what sorts requests into these buckets)."""

UNCACHED_FIGURE_BY_KEY = {f.key: f for f in UNCACHED_FIGURES}


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
