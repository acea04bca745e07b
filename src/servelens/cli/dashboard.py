"""``servelens dashboard``: write a Grafana dashboard and Prometheus recording/alert rules."""

from __future__ import annotations

import argparse
from typing import Any

from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES, IslBuckets
from servelens.dashboards.output import write_dashboard_files
from servelens.prometheus.names import DEFAULT_PREFIX, MetricNames


def add_parser(subparsers: Any) -> None:
    """Register ``dashboard``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "dashboard",
        help="write a Grafana dashboard and Prometheus recording/alert rules",
        description="Write grafana-dashboard.json (one query per ISL bucket, numeric order; datasource "
        "and model as variables), recording-rules.yml (per-bucket TTFT/ITL p50/p95/p99 and mean over "
        "5m) and alert-rules.yml (per-bucket TTFT p95 above --ttft-p95-slo).",
    )
    p.add_argument("--output-dir", default=".", help="directory for the three files (default: .)")
    p.add_argument("--metrics-prefix", default=DEFAULT_PREFIX,
                   help="metric name prefix (dynamo_frontend gives Dynamo names; default: servelens)")
    p.add_argument("--isl-buckets", default=",".join(str(b) for b in DEFAULT_ISL_BOUNDARIES),
                   help="ISL bucket boundaries in tokens, as the server exports them (default: %(default)s)")
    p.add_argument("--ttft-p95-slo", type=float, default=2.0, metavar="SECONDS",
                   help="alert when a bucket's TTFT p95 over 5m exceeds this (default: 2.0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the files and print their paths."""
    names = MetricNames(args.metrics_prefix)
    buckets = IslBuckets.parse(args.isl_buckets)
    files = write_dashboard_files(args.output_dir, names, buckets, args.ttft_p95_slo)
    for path in (files.dashboard, files.recording_rules, files.alert_rules):
        print(path)
    return 0
