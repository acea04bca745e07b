"""``servelens report``: the per-bucket table from a bench results file, a ``/metrics`` scrape,
or a Prometheus-compatible HTTP API; optionally a self-contained HTML report."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from servelens.core.buckets import IslBuckets, label_sort_key
from servelens.core.slo import Slo, parse_threshold
from servelens.formats.results import summary_isl_buckets
from servelens.formats.table import FORMATS, format_rows, output_width
from servelens.prometheus.names import DEFAULT_PREFIX, MetricNames
from servelens.report import compare
from servelens.report.html import write_html
from servelens.report.promapi import parse_duration_s
from servelens.report.slo_output import slo_json, slo_markdown, slo_text
from servelens.report.slo_report import SloReport, slo_from_metrics, slo_from_prometheus, slo_from_results
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
    p.add_argument("--compare", metavar="PATH",
                   help="with --results: a second bench run, the candidate, compared bucket by bucket against "
                   "--results, the baseline (TTFT and ITL p50/p95/p99 in both, bootstrap intervals on candidate "
                   "minus baseline, a verdict per bucket: faster, slower or no significant change)")
    p.add_argument("--resamples", type=int, default=2000, help="with --compare: bootstrap resamples (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="with --compare: bootstrap seed (default 0)")
    p.add_argument("--slo-ttft", metavar="SPEC",
                   help="TTFT SLO (2.0 | 0.5+0.0002*isl | 0-512=0.5,...): attainment per bucket and goodput; "
                   "exact from --results, bounds from histograms (exact only at an le edge)")
    p.add_argument("--slo-itl", metavar="SPEC",
                   help="ITL SLO, as --slo-ttft (--results: each request's mean ITL; histograms: each token)")
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


def _buckets_of(report: Report, given: IslBuckets | None) -> IslBuckets:
    """The buckets the report's rows are in (the server's, unless given)."""
    if given is not None:
        return given
    return IslBuckets.from_labels(sorted((r.bucket for r in report.rows if r.bucket != "all"), key=label_sort_key))


def build_slo(args: argparse.Namespace, report: Report) -> SloReport | None:
    """SLO attainment for parsed arguments (None without an SLO flag). Raises ValueError."""
    if not (args.slo_ttft or args.slo_itl):
        return None
    if args.format == "csv":
        raise ValueError("SLO attainment is printed with --format table, markdown or json, not csv")
    given = IslBuckets.parse(args.isl_buckets) if args.isl_buckets else None
    if args.results:
        bench_bounds = summary_isl_buckets(args.results)
        buckets = given or (IslBuckets(bench_bounds) if bench_bounds else IslBuckets.default())
    else:
        buckets = _buckets_of(report, given)
    slo = Slo(parse_threshold(args.slo_ttft, buckets) if args.slo_ttft else None,
              parse_threshold(args.slo_itl, buckets) if args.slo_itl else None)
    names = MetricNames(args.metrics_prefix)
    if args.results:
        return slo_from_results(args.results, buckets, slo)
    if args.metrics:
        return slo_from_metrics(args.metrics, names, args.metrics_before, args.model, buckets, slo)
    return slo_from_prometheus(args.prometheus, names, args.window or "5m", args.model, buckets, slo)


def run_compare(args: argparse.Namespace) -> int:
    """``--results A --compare B``: the two runs bucket by bucket."""
    if not args.results:
        raise ValueError("--compare compares two bench runs: give the baseline with --results")
    if args.format not in ("table", "json"):
        raise ValueError("--compare prints --format table or json")
    if args.slo_ttft or args.slo_itl:
        raise ValueError("--slo-ttft/--slo-itl report one run; for two runs use servelens explain --results A B")
    if args.resamples < 10:
        raise ValueError(f"--resamples must be >= 10, got {args.resamples}")
    buckets = IslBuckets.parse(args.isl_buckets) if args.isl_buckets else None
    result = compare.compare_results(args.results, args.compare, buckets, resamples=args.resamples, seed=args.seed)
    sys.stdout.write(compare.to_json(result) if args.format == "json" else compare.render_text(result))
    sys.stdout.flush()
    if args.html:
        chosen = IslBuckets.from_labels(result.labels)
        base, cand = report_from_results(args.results, chosen), report_from_results(args.compare, chosen)
        series = [replace(ts, origin=f"{ts.origin}, baseline run") for ts in base.timeseries]
        path = write_html(args.html, base.rows, series, args.title, f"baseline {args.results}, "
                          f"candidate {args.compare}", compare_rows=cand.rows, names=("baseline", "candidate"))
        print(f"wrote {path}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    """Print the table; write the HTML report when asked."""
    if args.compare:
        return run_compare(args)
    report = build_report(args)
    slo = build_slo(args, report)
    # a terminal: its real width; a file or pipe: format_rows' wide default
    width = output_width()
    if args.format == "json" and slo is not None:
        sys.stdout.write(slo_json(report.rows, slo))
    else:
        sys.stdout.write(format_rows(report.rows, args.format, args.title, width))
        if slo is not None:
            sys.stdout.write(slo_markdown(slo) if args.format == "markdown" else slo_text(slo, width))
    sys.stdout.flush()
    if args.html:
        path = write_html(args.html, report.rows, report.timeseries, args.title, report.source)
        print(f"wrote {path}", file=sys.stderr)
    return 0
