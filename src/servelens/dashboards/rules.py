"""Prometheus recording rules (per-bucket TTFT/ITL p50/p95/p99 and mean over 5m) and example
alert rules (per-bucket TTFT p95 above an SLO), generated from :mod:`servelens.prometheus.names`.

Record names follow the Prometheus ``level:metric:operations`` convention, e.g.
``model_isl_bucket:servelens_time_to_first_token_by_isl_seconds:p95_rate5m``. Each rule keeps the
``model`` and ``isl_bucket`` labels, so it yields one series per model and bucket.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from servelens.prometheus.names import MetricNames

LEVEL = "model_isl_bucket"
QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


def _window_tag(window: str) -> str:
    return "rate" + window


def record_name(histogram: str, stat: str, window: str = "5m") -> str:
    """The record name of one statistic (``p95`` or ``mean``) of a by-ISL histogram."""
    return f"{LEVEL}:{histogram}:{stat}_{_window_tag(window)}"


def recording_rules(names: MetricNames, window: str = "5m", interval: str | None = None) -> dict[str, Any]:
    """The recording rules file as a dict (dump with :func:`to_yaml`).

    For TTFT and ITL by ISL: p50, p95, p99 (``histogram_quantile`` over ``rate(..._bucket[window])``
    summed by ``le, model, isl_bucket``) and the mean (rate of ``_sum`` / rate of ``_count``);
    plus the per-bucket request rate.
    """
    by = "model, isl_bucket"
    rules: list[dict[str, Any]] = []
    for h in (names.ttft_by_isl, names.itl_by_isl):
        for stat, q in QUANTILES:
            rules.append({
                "record": record_name(h, stat, window),
                "expr": f"histogram_quantile({q:g}, sum by (le, {by}) (rate({h}_bucket[{window}])))",
            })
        rules.append({
            "record": record_name(h, "mean", window),
            "expr": f"sum by ({by}) (rate({h}_sum[{window}])) / sum by ({by}) (rate({h}_count[{window}]))",
        })
    rules.append({
        "record": f"{LEVEL}:{names.duration_by_isl}_count:{_window_tag(window)}",
        "expr": f"sum by ({by}) (rate({names.duration_by_isl}_count[{window}]))",
    })
    group: dict[str, Any] = {"name": f"{names.prefix}_isl_bucket_latency", "rules": rules}
    if interval:
        group["interval"] = interval
    return {"groups": [group]}


def alert_rules(
    names: MetricNames, ttft_p95_slo_s: float, window: str = "5m", for_: str = "5m", severity: str = "warning"
) -> dict[str, Any]:
    """Example alert rules: TTFT p95 of an ISL bucket above ``ttft_p95_slo_s`` seconds for ``for_``.

    Uses the recording rule of :func:`recording_rules` (load both files). A bucket without traffic
    has a NaN p95 and does not fire. Raises ValueError for an SLO that is not a finite number > 0.
    """
    if not (math.isfinite(ttft_p95_slo_s) and ttft_p95_slo_s > 0):  # an inf SLO would never fire
        raise ValueError(f"TTFT p95 SLO must be a finite number of seconds > 0, got {ttft_p95_slo_s}")
    p95 = record_name(names.ttft_by_isl, "p95", window)
    rule = {
        "alert": "TTFTp95AboveSLOByInputLength",
        "expr": f"{p95} > {ttft_p95_slo_s:g}",
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {
            "summary": "TTFT p95 above {{ $labels.isl_bucket }}-token prompts' SLO "
            f"({ttft_p95_slo_s:g} s) on model {{{{ $labels.model }}}}",
            "description": "TTFT p95 over " + window + " for input length bucket {{ $labels.isl_bucket }} "
            "is {{ $value | humanizeDuration }} (SLO " + f"{ttft_p95_slo_s:g} s).",
        },
    }
    return {"groups": [{"name": f"{names.prefix}_isl_bucket_slo", "rules": [rule]}]}


def to_yaml(doc: dict[str, Any]) -> str:
    """A rules dict as YAML text (keys in insertion order)."""
    return yaml.safe_dump(doc, sort_keys=False, width=1000)
