"""The Grafana dashboard (JSON model), generated from :mod:`servelens.prometheus.names`.

Panels (each its own panel, one query per ISL bucket in numeric order, see
:mod:`servelens.dashboards.queries`): TTFT mean, p50, p95, p99; ITL p50, p95; request rate;
mean cached tokens; the prefix-cache hit ratio; the stock all-requests TTFT for contrast; then the bucket mix
(:mod:`servelens.dashboards.mix`): the all-requests TTFT p95 and mean beside the same at a
reference mix (the raw line moves when traffic shifts toward longer prompts, the adjusted line only
when buckets get slower), and each bucket's share of the requests over time. Template variables:
``datasource`` (any Prometheus-compatible data source) and ``model`` (multi-value, "All" = ``.*``).
With uncached buckets (opt-in) the same TTFT, ITL and request-rate panels per uncached bucket follow
(label ``uncached_bucket``, numeric order).
"""

from __future__ import annotations

from typing import Any

from servelens.core.buckets import IslBuckets
from servelens.dashboards.mix import (
    DEFAULT_REFERENCE,
    MixReference,
    adjusted_mean_expr,
    adjusted_quantile_expr,
    bucket_share_expr,
)
from servelens.dashboards.queries import (
    FIGURES,
    GRAFANA_MODEL_MATCHER,
    GRAFANA_WINDOW,
    UNCACHED_FIGURES,
    Figure,
    bucket_queries,
    count_expr,
    mean_expr,
    quantile_expr,
)
from servelens.prometheus.names import MetricNames

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39
PANEL_W = 12
PANEL_H = 8


def _ref_id(i: int) -> str:
    """Grafana refIds A..Z, then AA, AB, ... (at most 33 buckets + extras)."""
    letters = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        letters = chr(ord("A") + r) + letters
    return letters


def _panel(pid: int, title: str, unit: str, targets: list[tuple[str, str]], description: str) -> dict[str, Any]:
    x = ((pid - 1) % 2) * PANEL_W
    y = ((pid - 1) // 2) * PANEL_H
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"h": PANEL_H, "w": PANEL_W, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 0, "spanNulls": False}},
            "overrides": [],
        },
        # legend and tooltip keep the query order (numeric bucket order); no sorting by name
        "options": {
            "legend": {"displayMode": "table", "placement": "right", "showLegend": True, "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
        "targets": [
            {
                "refId": _ref_id(i),
                "datasource": DATASOURCE,
                "expr": expr,
                "legendFormat": legend,
                "range": True,
                "instant": False,
            }
            for i, (legend, expr) in enumerate(targets)
        ],
    }


def _figure_panel(pid: int, figure: Figure, names: MetricNames, buckets: IslBuckets) -> dict[str, Any]:
    qs = bucket_queries(figure, names, buckets, GRAFANA_WINDOW, GRAFANA_MODEL_MATCHER)
    if figure.by == "uncached":
        desc = (f"{figure.title}: one query per uncached bucket (uncached_bucket label), in numeric order. "
                "Bucket = usage.prompt_tokens minus prompt_tokens_details.cached_tokens, in tokens: the "
                "prefill work TTFT pays for.")
    else:
        desc = (
            f"{figure.title}: one query per ISL bucket (isl_bucket label), in numeric order. "
            "Bucket = usage.prompt_tokens range in tokens."
        )
    if figure.kind == "hit_ratio":
        desc += (" Hit ratio = cached tokens / prompt tokens of the requests that reported cached tokens; "
                 "no line where none did.")
    return _panel(pid, figure.title, figure.unit, [(q.bucket, q.expr) for q in qs], desc)


def mix_panels(first_id: int, names: MetricNames, buckets: IslBuckets, reference: MixReference) -> list[dict[str, Any]]:
    """The bucket-mix panels: TTFT p95 and mean of all requests, raw beside mix-adjusted, and each
    bucket's share of the requests (one query per bucket, numeric order)."""
    h, m, w = names.ttft_by_isl, GRAFANA_MODEL_MATCHER, GRAFANA_WINDOW
    raw_p95 = f"histogram_quantile(0.95, sum by (le) (rate({h}_bucket{{{m}}}[{w}])))"
    raw_mean = f"sum (rate({h}_sum{{{m}}}[{w}])) / sum (rate({h}_count{{{m}}}[{w}]))"
    why = (f"The raw line is every request's; the adjusted line is each bucket's latency weighted by "
           f"{reference.describe()}: when the raw line rises and the adjusted one does not, the traffic "
           "shifted toward longer prompts; when both rise, the buckets got slower. A gap: a bucket with a "
           "reference share had no request in the window.")
    return [
        _panel(first_id, "TTFT p95, all requests: raw and at the reference mix", "s",
               [("all requests", raw_p95), ("at the reference mix", adjusted_quantile_expr(h, 0.95, reference, w, m))],
               why),
        _panel(first_id + 1, "TTFT mean, all requests: raw and at the reference mix", "s",
               [("all requests", raw_mean), ("at the reference mix", adjusted_mean_expr(h, reference, w, m))], why),
        _panel(first_id + 2, "Bucket mix: share of the requests per ISL bucket", "percentunit",
               [(label, bucket_share_expr(h, label, w, m)) for label in buckets.labels],
               "Each ISL bucket's share of the requests with a first token (TTFT observations), one query per "
               "bucket in numeric order: the mix the adjusted lines correct for."),
    ]


def grafana_dashboard(
    names: MetricNames, buckets: IslBuckets, title: str | None = None, uid: str | None = None,
    reference: MixReference | None = None, uncached_buckets: IslBuckets | None = None,
) -> dict[str, Any]:
    """The dashboard as a JSON-serialisable dict (Grafana dashboard model, schemaVersion 39).

    Args:
        names: metric names (``MetricNames("dynamo_frontend")`` for Dynamo-style names).
        buckets: the ISL buckets the server exports (``--isl-buckets``); one query per bucket.
        title, uid: dashboard title and uid (defaults derive from the prefix).
        reference: the mix of the mix-adjusted panels (default: the mix over the last 24 h).
        uncached_buckets: the uncached buckets the server exports (``--uncached-buckets``), for the
            panels by uncached prompt tokens (None: no such panels).
    """
    panels = [_figure_panel(i + 1, f, names, buckets) for i, f in enumerate(FIGURES)]
    m = GRAFANA_MODEL_MATCHER
    w = GRAFANA_WINDOW
    stock = [
        ("mean", mean_expr(names.ttft, None, w, m)),
        ("p50", quantile_expr(names.ttft, 0.5, None, w, m)),
        ("p95", quantile_expr(names.ttft, 0.95, None, w, m)),
        ("p99", quantile_expr(names.ttft, 0.99, None, w, m)),
    ]
    panels.append(_panel(
        len(panels) + 1, "TTFT, all requests (stock histogram, for contrast)", "s", stock,
        "The stock TTFT histogram over every input length: the figure a p95 move shows up in "
        "without saying which prompt sizes moved it.",
    ))
    panels.append(_panel(
        len(panels) + 1, "Request rate, all requests", "reqps",
        [("all", count_expr(names.duration, None, w, m, "rate"))],
        "Every finished request (stock request duration histogram).",
    ))
    panels += mix_panels(len(panels) + 1, names, buckets, reference or DEFAULT_REFERENCE)
    if uncached_buckets is not None:
        panels += [_figure_panel(len(panels) + 1 + i, f, names, uncached_buckets)
                   for i, f in enumerate(UNCACHED_FIGURES)]
    return {
        "title": title or f"servelens: latency by input length ({names.prefix})",
        "uid": uid or f"servelens-isl-{names.prefix}"[:40],
        "tags": ["servelens", "llm", "latency"],
        "timezone": "browser",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                },
                {
                    "name": "model",
                    "label": "Model",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "definition": f"label_values({names.duration_by_isl}_count, model)",
                    "query": {
                        "query": f"label_values({names.duration_by_isl}_count, model)",
                        "refId": "model",
                    },
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "refresh": 2,
                    "sort": 1,
                    "hide": 0,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
        "description": f"ISL buckets: {buckets.spec} (tokens). Generated by servelens dashboard.",
    }


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Every ``(panel title, legend, expr)`` of a dashboard dict, in panel and target order."""
    return [
        (p["title"], t.get("legendFormat", ""), t["expr"])
        for p in dashboard.get("panels", [])
        for t in p.get("targets", [])
    ]


def substitute_variables(expr: str, window: str = "5m", model_regex: str = ".*") -> str:
    """A dashboard query with Grafana's variables filled in, ready to run on Prometheus
    (``$__rate_interval`` -> ``window``, ``$model`` -> ``model_regex``)."""
    return expr.replace("$__rate_interval", window).replace("$model", model_regex)
