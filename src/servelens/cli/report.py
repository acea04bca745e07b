"""``servelens report``: the per-bucket table from a bench results file, a ``/metrics`` scrape,
or a Prometheus-compatible HTTP API; optionally a self-contained HTML report."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from servelens.core.buckets import IslBuckets
from servelens.formats.results import summary_isl_buckets
from servelens.formats.table import FORMATS, format_rows, output_width
from servelens.prometheus.names import DEFAULT_PREFIX, MetricNames
from servelens.report.html import write_html
from servelens.report.promapi import parse_duration_s
from servelens.report.sources import Report, report_from_metrics, report_from_prometheus, report_from_results


def add_parser(subparsers: Any) -> None:
    """Register ``report``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help="per-input-length table from a results file, /metrics, or a Prometheus API",
        description="Print the per-ISL-bucket latency table from exactly one source: a bench results file "
        "(exact percentiles), a /metrics URL or saved text (histogram_quantile over since-start counts, "
        "or over the difference of two scrapes), or a Prometheus-compatible HTTP API (the dashboard's "
        "per-bucket queries over --window).",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--results", metavar="PATH", help="bench results file (results.jsonl or its folder)")
    src.add_argument("--metrics", metavar="URL|FILE", help="a /metrics URL or a saved scrape")
    src.add_argument("--prometheus", metavar="URL", help="Prometheus-compatible API base URL (Prometheus, "
                     "VictoriaMetrics)")
    p.add_argument("--metrics-before", metavar="URL|FILE",
                   help="with --metrics: an earlier scrape; report the difference")
    p.add_argument("--window", default=None,
                   help="with --prometheus: the window of the rate() percentiles and of the Requests count "
                   "(exact: last value in the window minus the value at its start; default: 5m)")
    p.add_argument("--range", dest="range_", default=None, metavar="DURATION",
                   help="with --prometheus: span of the p95-over-time chart in --html (default: 1h)")
    p.add_argument("--metrics-prefix", default=DEFAULT_PREFIX,
                   help="metric name prefix (dynamo_frontend for Dynamo names; default: servelens)")
    p.add_argument("--model", help="only this model (default: all models summed)")
    p.add_argument("--isl-buckets", metavar="B1,B2,...",
                   help="ISL bucket boundaries in tokens (default: the server's buckets for --metrics and "
                   "--prometheus; for --results the bench run's, from its summary.json, else 512,...,16384)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")
    p.add_argument("--title", default="servelens report", help="title of the table and HTML report")
    p.set_defaults(func=run)


def build_report(args: argparse.Namespace) -> Report:
    """The report for parsed arguments. Raises ValueError for bad input (one-line messages)."""
    names = MetricNames(args.metrics_prefix)
    buckets = IslBuckets.parse(args.isl_buckets) if args.isl_buckets else None
    if args.metrics_before and not args.metrics:
        raise ValueError("--metrics-before needs --metrics")
    for flag, value in (("--window", args.window), ("--range", args.range_)):
        if value is not None and not args.prometheus:
            raise ValueError(f"{flag} applies to --prometheus only (the other sources have no time window)")
    if args.range_ is not None and not args.html:
        raise ValueError("--range is the span of the HTML report's chart: give --html too")
    if args.results:
        if args.model:
            raise ValueError("--model applies to --metrics and --prometheus, not --results")
        bench_bounds = summary_isl_buckets(args.results)  # the buckets the bench run used
        default = IslBuckets(bench_bounds) if bench_bounds else IslBuckets.default()
        report = report_from_results(args.results, buckets or default)
        if not any(r.requests for r in report.rows):
            raise ValueError(f"{args.results}: no requests in it (an empty results file)")
        return report
    if args.metrics:
        return report_from_metrics(args.metrics, names, args.metrics_before, args.model, buckets)
    range_s = parse_duration_s(args.range_ or "1h") if args.html else None
    return report_from_prometheus(args.prometheus, names, args.window or "5m", buckets, args.model,
                                  range_s=range_s)


def run(args: argparse.Namespace) -> int:
    """Print the table; write the HTML report when asked."""
    report = build_report(args)
    # a terminal: its real width; a file or pipe: format_rows' wide default
    width = output_width()
    sys.stdout.write(format_rows(report.rows, args.format, args.title, width))
    sys.stdout.flush()
    if args.html:
        path = write_html(args.html, report.rows, report.timeseries, args.title, report.source)
        print(f"wrote {path}", file=sys.stderr)
    return 0
