"""Prometheus recording rules and example alert rules, generated from :mod:`servelens.prometheus.names`:

* per bucket: TTFT/ITL p50/p95/p99 and mean over 5m, the request rate, and the prefix-cache hit
  ratio (cached over prompt tokens of the requests that reported cached tokens);
* with uncached buckets (opt-in): per uncached bucket, TTFT/ITL p50/p95/p99 and mean and the request
  rate (``model_uncached_bucket:...``);
* the bucket mix (:mod:`servelens.dashboards.mix`): each bucket's share of the TTFTs, and the
  all-requests TTFT p50/p95/p99 and mean at a reference mix (the mix-adjusted line);
* with SLOs (:mod:`servelens.dashboards.slo`): per bucket, the share of TTFTs (tokens, for ITL)
  within the threshold, counted at an ``le`` edge;
* alerts: a bucket's TTFT p95 above an SLO; with SLOs, a bucket's attainment below a target.

Record names follow the Prometheus ``level:metric:operations`` convention, e.g.
``model_isl_bucket:servelens_time_to_first_token_by_isl_seconds:p95_rate5m`` (one series per model
and bucket) or ``model:servelens_time_to_first_token_by_isl_seconds:p95_ref24h_rate5m`` (one per model).
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from servelens.core.buckets import IslBuckets
from servelens.core.edges import MetricEdges
from servelens.core.slo import Slo
from servelens.dashboards.mix import (
    DEFAULT_REFERENCE,
    MixReference,
    adjusted_mean_expr,
    adjusted_quantile_expr,
    bucket_share_expr,
)
from servelens.dashboards.slo import AttainmentRule, attainment_rules
from servelens.prometheus.collector import format_le
from servelens.prometheus.names import MetricNames, default_edges

LEVEL = "model_isl_bucket"
UNCACHED_LEVEL = "model_uncached_bucket"
DEFAULT_TARGET = 0.95
"""Attainment below which the SLO alerts fire (a share of TTFTs, or of tokens for ITL)."""
QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


def _window_tag(window: str) -> str:
    return "rate" + window


def record_name(histogram: str, stat: str, window: str = "5m") -> str:
    """The record name of one statistic (``p95`` or ``mean``) of a by-ISL histogram."""
    return f"{LEVEL}:{histogram}:{stat}_{_window_tag(window)}"


def hit_ratio_record_name(names: MetricNames, window: str = "5m") -> str:
    """The record name of each ISL bucket's prefix-cache hit ratio."""
    return f"{LEVEL}:{names.cached_by_isl}:hit_ratio_{_window_tag(window)}"


def uncached_rules(names: MetricNames, window: str = "5m") -> list[dict[str, Any]]:
    """TTFT and ITL p50/p95/p99 and mean, and the request rate, per model and uncached bucket."""
    by = "model, uncached_bucket"
    rules: list[dict[str, Any]] = []
    for h in (names.ttft_by_uncached, names.itl_by_uncached):
        for stat, q in QUANTILES:
            rules.append({"record": f"{UNCACHED_LEVEL}:{h}:{stat}_{_window_tag(window)}",
                          "expr": f"histogram_quantile({q:g}, sum by (le, {by}) (rate({h}_bucket[{window}])))"})
        rules.append({"record": f"{UNCACHED_LEVEL}:{h}:mean_{_window_tag(window)}",
                      "expr": f"sum by ({by}) (rate({h}_sum[{window}])) / sum by ({by}) (rate({h}_count[{window}]))"})
    d = names.duration_by_uncached
    rules.append({"record": f"{UNCACHED_LEVEL}:{d}_count:{_window_tag(window)}",
                  "expr": f"sum by ({by}) (rate({d}_count[{window}]))"})
    return rules


def mix_record_name(histogram: str, stat: str, reference: MixReference, window: str = "5m") -> str:
    """The record name of a mix-adjusted statistic (``p95``, ``mean``), one series per model."""
    return f"model:{histogram}:{stat}_{reference.tag}_{_window_tag(window)}"


def share_record_name(histogram: str, window: str = "5m") -> str:
    """The record name of each bucket's share of ``histogram``'s observations."""
    return f"{LEVEL}:{histogram}_count:share_{_window_tag(window)}"


def attainment_record_name(histogram: str, window: str = "5m") -> str:
    """The record name of a bucket's SLO attainment (share within the threshold)."""
    return f"{LEVEL}:{histogram}:slo_attainment_{_window_tag(window)}"


def mix_rules(
    names: MetricNames, reference: MixReference = DEFAULT_REFERENCE, window: str = "5m"
) -> list[dict[str, Any]]:
    """Each bucket's share of the TTFTs, and TTFT p50/p95/p99 and mean at ``reference`` (by model).
    Rules in a group run in order at one evaluation time, so the adjusted rules read the window
    mix recorded just before them."""
    h = names.ttft_by_isl
    by = ("model",)
    rules: list[dict[str, Any]] = [{"record": share_record_name(h, window),
                                    "expr": bucket_share_expr(h, None, window, by=by)}]
    recorded = None
    if reference.window is not None:  # the long-window mix once per evaluation; the rules below read it
        recorded = share_record_name(h, reference.window)
        rules.append({"record": recorded, "expr": bucket_share_expr(h, None, reference.window, by=by)})
    for stat, q in QUANTILES:
        rules.append({"record": mix_record_name(h, stat, reference, window),
                      "expr": adjusted_quantile_expr(h, q, reference, window, by=by, recorded=recorded)})
    rules.append({"record": mix_record_name(h, "mean", reference, window),
                  "expr": adjusted_mean_expr(h, reference, window, by=by, recorded=recorded)})
    return rules


def _slo_pairs(names: MetricNames, slo: Slo, buckets: IslBuckets, edges: MetricEdges,
               window: str) -> list[tuple[str, str, list[AttainmentRule]]]:
    """``(metric, histogram, rules)`` for each SLO given."""
    out = []
    if slo.ttft is not None:
        out.append(("TTFT", names.ttft_by_isl, attainment_rules(names.ttft_by_isl, slo.ttft, buckets, edges.ttft_s,
                                                                  window)))
    if slo.itl is not None:
        out.append(("ITL", names.itl_by_isl, attainment_rules(names.itl_by_isl, slo.itl, buckets, edges.itl_s,
                                                                window)))
    return out


def slo_rules(names: MetricNames, slo: Slo, buckets: IslBuckets, edges: MetricEdges | None = None,
              window: str = "5m") -> list[dict[str, Any]]:
    """Per bucket and SLO, the attainment at an ``le`` edge (:mod:`servelens.dashboards.slo`); the
    edge used is the rule's ``slo_le`` label. ``edges``: those the server exports (default: the
    prefix's, :func:`~servelens.prometheus.names.default_edges`). Raises ValueError for a threshold
    below every edge."""
    rules = []
    for _, h, per_bucket in _slo_pairs(names, slo, buckets, edges or default_edges(names.prefix), window):
        for r in per_bucket:
            rules.append({"record": attainment_record_name(h, window), "expr": r.expr,
                          # isl_bucket repeats the expression's, so that the rules' label sets differ
                          "labels": {"isl_bucket": r.bucket, "slo_le": format_le(r.edge_s)}})
    return rules


SLO_SOURCES = ("histograms", "counters")
"""Where the attainment rules read: the by-ISL histograms at an ``le`` edge (a lower bound, exact at
an edge; any server exporting by-ISL histograms), or the gateway's exact SLO counters (a gateway
started with the same ``--slo-ttft``/``--slo-itl``)."""


def counter_record_name(names: MetricNames, what: str, window: str = "5m") -> str:
    """The record name of the attainment (``what="attainment"``, label ``slo``) or goodput from the
    gateway's SLO counters."""
    return f"{LEVEL}:{names.slo_by_isl}:{what}_{_window_tag(window)}"


def counter_slo_rules(names: MetricNames, slo: Slo, window: str = "5m") -> list[dict[str, Any]]:
    """From the gateway's exact counters (``{p}_requests_within_slo_by_isl_total``, a gateway run
    with the same SLOs): per bucket and ``slo`` label (ttft, itl, all) the share of the bucket's
    finished requests meeting it (over ``request_duration_by_isl_seconds_count``, the same
    requests), and goodput, the requests per second meeting all SLOs, per bucket."""
    by = "model, isl_bucket"
    c = names.slo_by_isl
    kinds = [k for k, th in (("ttft", slo.ttft), ("itl", slo.itl)) if th is not None] + ["all"]
    rules: list[dict[str, Any]] = [
        {"record": counter_record_name(names, "attainment", window),
         "expr": f'sum by ({by}) (rate({c}{{slo="{kind}"}}[{window}])) / '
                 f"sum by ({by}) (rate({names.duration_by_isl}_count[{window}]))",
         "labels": {"slo": kind}}
        for kind in kinds]
    rules.append({"record": counter_record_name(names, "goodput", window),
                  "expr": f'sum by ({by}) (rate({c}{{slo="all"}}[{window}]))'})
    return rules


def recording_rules(
    names: MetricNames,
    window: str = "5m",
    interval: str | None = None,
    reference: MixReference = DEFAULT_REFERENCE,
    slo: Slo | None = None,
    buckets: IslBuckets | None = None,
    edges: MetricEdges | None = None,
    slo_source: str = "histograms",
    uncached: bool = False,
) -> dict[str, Any]:
    """The recording rules file as a dict (dump with :func:`to_yaml`).

    For TTFT and ITL by ISL: p50, p95, p99 (``histogram_quantile`` over ``rate(..._bucket[window])``
    summed by ``le, model, isl_bucket``) and the mean (rate of ``_sum`` / rate of ``_count``);
    plus the per-bucket request rate. A second group holds the bucket mix and the TTFT at
    ``reference`` (:func:`mix_rules`); with ``slo`` (and the ``buckets``), a third the attainment
    per bucket (:func:`slo_rules`, or :func:`counter_slo_rules` with ``slo_source="counters"``); with
    ``uncached``, a last one per uncached bucket (:func:`uncached_rules`). Raises ValueError for an SLO
    below every ``le`` edge, or an unknown ``slo_source``.
    """
    if slo_source not in SLO_SOURCES:
        raise ValueError(f"slo_source must be one of {', '.join(SLO_SOURCES)}, got {slo_source!r}")
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
    rules.append({
        "record": hit_ratio_record_name(names, window),
        "expr": f"sum by ({by}) (rate({names.cached_by_isl}_sum[{window}])) / "
                f"sum by ({by}) (rate({names.prompt_tokens_by_isl}[{window}]))",
    })
    groups: list[dict[str, Any]] = [
        {"name": f"{names.prefix}_isl_bucket_latency", "rules": rules},
        {"name": f"{names.prefix}_isl_bucket_mix", "rules": mix_rules(names, reference, window)},
    ]
    if slo is not None:
        if buckets is None:
            raise ValueError("SLO rules need the ISL buckets")
        groups.append({"name": f"{names.prefix}_isl_bucket_slo_attainment",
                       "rules": slo_rules(names, slo, buckets, edges, window) if slo_source == "histograms"
                       else counter_slo_rules(names, slo, window)})
    if uncached:
        groups.append({"name": f"{names.prefix}_uncached_bucket_latency", "rules": uncached_rules(names, window)})
    if interval:
        for g in groups:
            g["interval"] = interval
    return {"groups": groups}


def alert_rules(
    names: MetricNames,
    ttft_p95_slo_s: float,
    window: str = "5m",
    for_: str = "5m",
    severity: str = "warning",
    slo: Slo | None = None,
    target: float = DEFAULT_TARGET,
    buckets: IslBuckets | None = None,
    edges: MetricEdges | None = None,
    slo_source: str = "histograms",
) -> dict[str, Any]:
    """Example alert rules: TTFT p95 of an ISL bucket above ``ttft_p95_slo_s`` seconds for ``for_``;
    with ``slo``, a bucket's attainment of each SLO below ``target`` for ``for_``.

    Uses the recording rules of :func:`recording_rules` (load both files, with the same ``slo``). A
    bucket without traffic has a NaN p95 and attainment and does not fire. Raises ValueError for an
    SLO that is not a finite number > 0 or below every ``le`` edge, or a target outside (0, 1].
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
    rules: list[dict[str, Any]] = [rule]
    if slo is not None:
        if not 0 < target <= 1:
            raise ValueError(f"attainment target must be within (0, 1], got {target}")
        if buckets is None:
            raise ValueError("SLO alerts need the ISL buckets")
        if slo_source == "counters":
            rules.append({
                "alert": "SLOAttainmentBelowTargetByInputLength",
                "expr": f"{counter_record_name(names, 'attainment', window)} < {target:g}",
                "for": for_,
                "labels": {"severity": severity},
                "annotations": {
                    "summary": "SLO attainment ({{ $labels.slo }}) of {{ $labels.isl_bucket }}-token prompts below "
                    f"{target:.0%} on model {{{{ $labels.model }}}}",
                    "description": "Share of the requests meeting the SLO ({{ $labels.slo }}), counted exactly by "
                    "the gateway, over " + window + " is {{ $value | humanizePercentage }}.",
                },
            })
            rules.append(threshold_alert(names, slo, severity))
            return {"groups": [{"name": f"{names.prefix}_isl_bucket_slo", "rules": rules}]}
        for metric, h, _ in _slo_pairs(names, slo, buckets, edges or default_edges(names.prefix), window):
            what = "TTFTs" if metric == "TTFT" else "tokens"
            rules.append({
                "alert": f"{metric}SLOAttainmentBelowTargetByInputLength",
                "expr": f"{attainment_record_name(h, window)} < {target:g}",
                "for": for_,
                "labels": {"severity": severity},
                "annotations": {
                    "summary": f"{metric} SLO attainment of {{{{ $labels.isl_bucket }}}}-token prompts below "
                    f"{target:.0%} on model {{{{ $labels.model }}}}",
                    "description": f"Share of {what} at or below le={{{{ $labels.slo_le }}}} s (the largest le edge "
                    "at or below the SLO; a lower bound of the attainment unless the SLO is that edge) over "
                    + window + " is {{ $value | humanizePercentage }}.",
                },
            })
    return {"groups": [{"name": f"{names.prefix}_isl_bucket_slo", "rules": rules}]}


THRESHOLD_ALERT = "SLOThresholdDiffersFromRules"
"""The alert of ``--slo-from counters`` that fires where a gateway counts against other SLOs than the rules'."""


def threshold_alert(names: MetricNames, slo: Slo, severity: str = "warning") -> dict[str, Any]:
    """An alert that fires while a gateway exports an SLO threshold (``{p}_slo_threshold_info``) other
    than ``slo``'s, or counts an SLO kind that ``slo`` leaves out: the counter rules would then report
    attainment of another SLO. The dashboard cannot check this when it writes the rules; Prometheus can
    while it scrapes. The thresholds compare as :attr:`~servelens.core.slo.Threshold.spec` writes them."""
    info = names.slo_threshold_info
    parts = []
    for kind, th in (("ttft", slo.ttft), ("itl", slo.itl)):
        parts.append(f'{info}{{slo="{kind}",threshold!="{th.spec}"}}' if th is not None else f'{info}{{slo="{kind}"}}')
    given = ", ".join(f"{k.upper()} {th.spec}" for k, th in (("ttft", slo.ttft), ("itl", slo.itl)) if th is not None)
    return {
        "alert": THRESHOLD_ALERT,
        "expr": " or ".join(parts),
        "labels": {"severity": severity},
        "annotations": {
            "summary": "A gateway counts SLO {{ $labels.slo }} against {{ $labels.threshold }} s, the rules assume "
            f"{given} (seconds)",
            "description": "The SLO attainment and goodput rules read the gateways' SLO counters as counted against "
            f"{given}; {{{{ $labels.instance }}}} counts against other thresholds: start it with the rules' "
            "--slo-ttft/--slo-itl, or regenerate the rules with its own.",
        },
    }


def to_yaml(doc: dict[str, Any]) -> str:
    """A rules dict as YAML text (keys in insertion order)."""
    return yaml.safe_dump(doc, sort_keys=False, width=1000)
