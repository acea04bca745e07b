"""``servelens dashboard``: write a Grafana dashboard and Prometheus recording/alert rules."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES, IslBuckets
from servelens.core.edges import parse_edges
from servelens.core.slo import Slo, parse_threshold
from servelens.dashboards.kubernetes import KubernetesOptions, kubernetes_files, write_kubernetes
from servelens.dashboards.mix import MixReference
from servelens.dashboards.output import dashboard_documents, write_dashboard_files
from servelens.dashboards.rules import DEFAULT_TARGET, SLO_SOURCES, THRESHOLD_ALERT
from servelens.formats.mix_file import read_mix
from servelens.gateway.config import normalize_upstream
from servelens.prometheus.names import DEFAULT_PREFIX, MetricNames, default_edges
from servelens.report.promapi import parse_duration_s
from servelens.report.slo_report import COUNTERS_NEED_SLO


def add_parser(subparsers: Any) -> None:
    """Register ``dashboard``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "dashboard",
        help="write a Grafana dashboard and Prometheus recording/alert rules",
        description="Write grafana-dashboard.json (one query per ISL bucket, numeric order; datasource "
        "and model as variables; the all-requests TTFT p95 and mean raw beside the same at a reference "
        "bucket mix, and the bucket mix over time), recording-rules.yml (per-bucket TTFT/ITL p50/p95/p99 "
        "and mean over 5m, the bucket shares and the mix-adjusted TTFT; with --slo-ttft/--slo-itl the "
        "attainment per bucket) and alert-rules.yml (per-bucket TTFT p95 above --ttft-p95-slo; attainment "
        "below --attainment-target).",
    )
    p.add_argument("--output-dir", default=".", metavar="DIR", help="directory for the three files (default: .)")
    p.add_argument("--kubernetes", metavar="DIR",
                   help="instead, write Kubernetes manifests into DIR (kustomize: base/ with a PrometheusRule and the "
                   "dashboard ConfigMap, overlays/gateway and overlays/vllm-sidecar); the repository's deploy/ is "
                   "this with the defaults (default: none)")
    p.add_argument("--image", default=KubernetesOptions.image, metavar="IMAGE",
                   help="with --kubernetes: the gateway image, e.g. REGISTRY/servelens:0.1.0 (default: %(default)s)")
    p.add_argument("--engine-url", default=KubernetesOptions.engine_url, metavar="URL",
                   help="with --kubernetes: the engine Service the gateway Deployment relays to (default: %(default)s)")
    p.add_argument("--metrics-prefix", default=DEFAULT_PREFIX, metavar="PREFIX",
                   help="metric name prefix (dynamo_frontend gives Dynamo names; default: servelens)")
    p.add_argument("--isl-buckets", default=",".join(str(b) for b in DEFAULT_ISL_BOUNDARIES), metavar="B1,B2,...",
                   help="ISL bucket boundaries in tokens, as the server exports them (default: %(default)s)")
    p.add_argument("--uncached-buckets", metavar="B1,B2,...",
                   help="the gateway's --uncached-buckets: also panels and rules per uncached bucket (default: none)")
    p.add_argument("--ttft-p95-slo", type=float, default=2.0, metavar="SECONDS",
                   help="alert when a bucket's TTFT p95 over 5m exceeds this (default: 2.0)")
    ref = p.add_mutually_exclusive_group()
    ref.add_argument("--reference-mix", metavar="FILE",
                     help="the mix-adjusted TTFT at these fixed bucket shares (a YAML file, e.g. from servelens "
                     "explain --write-mix): a steady yardstick, kept by hand (default: none, --reference-window)")
    ref.add_argument("--reference-window", default="24h", metavar="DURATION",
                     help="else at the mix over this long a window, which follows slow drift (default: 24h)")
    p.add_argument("--slo-ttft", metavar="SPEC",
                   help="TTFT SLO (2.0 | 0.5+0.0002*isl | 0-512=0.5,...): per-bucket attainment rules and alerts, "
                   "counted at the largest le edge at or below the threshold (a lower bound unless it is an edge; "
                   "default: none)")
    p.add_argument("--slo-itl", metavar="SPEC",
                   help="ITL SLO, as --slo-ttft (histograms: the share of tokens within it; --slo-from counters: of "
                   "requests whose mean ITL, their TPOT, is; default: none)")
    p.add_argument("--ttft-edges", metavar="EDGES",
                   help="the TTFT le edges the server exports, for the attainment rules: fine, dynamo or "
                   "S1,S2,... as the gateway's flag (default: the prefix's, fine for servelens' names)")
    p.add_argument("--itl-edges", metavar="EDGES",
                   help="the ITL le edges the server exports, as --ttft-edges (default: the prefix's)")
    p.add_argument("--slo-from", choices=SLO_SOURCES, default="histograms",
                   help="histograms (any server's by-ISL histograms, at an le edge: a lower bound unless "
                   "the SLO is an edge) or counters (exact: the gateway's own --slo-ttft/--slo-itl counters, which "
                   "must be the SLOs given here; adds goodput per bucket) (default: %(default)s)")
    p.add_argument("--attainment-target", type=float, default=DEFAULT_TARGET, metavar="SHARE",
                   help=f"alert when a bucket's attainment over 5m is below this (default: {DEFAULT_TARGET})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the files and print their paths."""
    names = MetricNames(args.metrics_prefix)
    buckets = IslBuckets.parse(args.isl_buckets)
    try:
        uncached = IslBuckets.parse(args.uncached_buckets) if args.uncached_buckets else None
    except ValueError as exc:
        raise ValueError(f"--uncached-buckets: {exc}") from None
    if args.reference_mix:
        reference = MixReference(mix=read_mix(args.reference_mix))
    else:
        parse_duration_s(args.reference_window)  # one line for a bad duration
        reference = MixReference(window=args.reference_window)
    slo = None
    if args.slo_from == "counters" and not (args.slo_ttft or args.slo_itl):
        raise ValueError(COUNTERS_NEED_SLO)  # as report: counter rules without an SLO would be no rules at all
    if args.slo_ttft or args.slo_itl:
        slo = Slo(parse_threshold(args.slo_ttft, buckets) if args.slo_ttft else None,
                  parse_threshold(args.slo_itl, buckets) if args.slo_itl else None)
    edges = default_edges(names.prefix)
    if args.ttft_edges or args.itl_edges:
        edges = replace(edges, **({"ttft_s": parse_edges(args.ttft_edges, "ttft")} if args.ttft_edges else {}),
                        **({"itl_s": parse_edges(args.itl_edges, "itl")} if args.itl_edges else {}))
    if args.kubernetes is not None:
        if not args.kubernetes:
            raise ValueError("--kubernetes needs a folder (e.g. --kubernetes deploy)")
        docs = dashboard_documents(names, buckets, args.ttft_p95_slo, reference=reference, slo=slo,
                                   target=args.attainment_target, edges=edges, slo_source=args.slo_from,
                                   uncached_buckets=uncached)
        # the gateways must export what the rules read: the SLO counters, the uncached families
        flags: list[str] = []
        if args.slo_from == "counters":
            flags += [*(["--slo-ttft", args.slo_ttft] if args.slo_ttft else []),
                      *(["--slo-itl", args.slo_itl] if args.slo_itl else [])]
        if uncached is not None:
            flags += ["--uncached-buckets", uncached.spec]
        opts = KubernetesOptions(engine_url=normalize_upstream(args.engine_url), image=args.image,
                                 gateway_flags=tuple(flags))
        paths = write_kubernetes(args.kubernetes, kubernetes_files(names, buckets, docs, opts))
    else:
        files = write_dashboard_files(args.output_dir, names, buckets, args.ttft_p95_slo, reference=reference,
                                      slo=slo, target=args.attainment_target, edges=edges, slo_source=args.slo_from,
                                      uncached_buckets=uncached)
        paths = [files.dashboard, files.recording_rules, files.alert_rules]
    for path in paths:
        print(path)
    if slo is not None and args.slo_from == "counters":  # what the rules cannot check when they are written
        print(f"note: the SLO rules take the gateways' counters to be counted against the SLOs given here; "
              f"alert {THRESHOLD_ALERT} fires where a gateway's {names.slo_threshold_info} says otherwise",
              file=sys.stderr)
    return 0
