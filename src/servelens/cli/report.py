"""``servelens report``: the per-bucket table from a bench results file, a ``/metrics`` scrape,
or a Prometheus-compatible HTTP API; optionally a self-contained HTML report."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servelens.core.buckets import IslBuckets, label_sort_key
from servelens.core.slo import Slo, parse_threshold
from servelens.formats.columnar import columns_for, is_columnar
from servelens.formats.columnar_write import convert_jsonl, export_jsonl
from servelens.formats.results import results_file_in, summary_isl_buckets
from servelens.formats.table import FORMATS, ISL_HEADER, UNCACHED_HEADER, format_rows, output_width
from servelens.prometheus.names import DEFAULT_PREFIX, MetricNames
from servelens.report import slo_report
from servelens.report.promapi import parse_duration_s
from servelens.report.slo_output import slo_json, slo_markdown, slo_text
from servelens.report.slo_report import SloReport, slo_from_metrics, slo_from_prometheus, slo_from_results
from servelens.report.sources import Report, report_from_metrics, report_from_prometheus, report_from_results

if TYPE_CHECKING:
    from servelens.core.capacity import CapacityReport

# capacity (scipy), compare and the HTML report (plotly) are imported where used: a plain table from a
# results file starts in a fraction of the time


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
    p.add_argument("--convert", action="store_true",
                   help="with --results FILE.jsonl: write its columns (results.cols beside it, which later "
                   "reports of that file read, seconds for a million requests) and stop")
    p.add_argument("--export-jsonl", metavar="PATH",
                   help="with --results FOLDER.cols: write it back as results.jsonl at PATH and stop (default: "
                   "no export)")
    src.add_argument("--prometheus", metavar="URL", help="Prometheus-compatible API base URL (Prometheus, "
                     "VictoriaMetrics)")
    p.add_argument("--metrics-before", metavar="URL|FILE",
                   help="with --metrics: an earlier scrape; report the difference (default: none, counts "
                   "since the server started)")
    p.add_argument("--window", default=None, metavar="DURATION",
                   help="with --prometheus: the window of the rate() percentiles and of the Requests count "
                   "(exact: last value in the window minus the value at its start; default: 5m)")
    p.add_argument("--range", dest="range_", default=None, metavar="DURATION",
                   help="with --prometheus: span of the p95-over-time chart in --html (default: 1h)")
    p.add_argument("--metrics-prefix", default=DEFAULT_PREFIX, metavar="PREFIX",
                   help="metric name prefix (dynamo_frontend for Dynamo names; default: servelens)")
    p.add_argument("--model", metavar="NAME", help="only this model (default: all models summed)")
    p.add_argument("--isl-buckets", metavar="B1,B2,...",
                   help="ISL bucket boundaries in tokens (default: the server's buckets for --metrics and "
                   "--prometheus; for --results the bench run's, from its summary.json, else 512,...,16384)")
    p.add_argument("--by", choices=("isl", "uncached"), default=None,
                   help="bucket by prompt length (isl, the default) or by uncached prompt tokens, ISL minus cached "
                   "tokens (uncached: the gateway's --uncached-buckets families; for --results each request's "
                   "usage; requests without cached tokens are in 'all requests' only)")
    p.add_argument("--uncached-buckets", metavar="B1,B2,...",
                   help="with --by uncached (implied): the boundaries (default: the server's for --metrics and "
                   "--prometheus, 512,...,16384 for --results)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    p.add_argument("--compare", metavar="PATH",
                   help="with --results: a second bench run, the candidate, compared bucket by bucket against "
                   "--results, the baseline (TTFT and ITL p50/p95/p99 in both, bootstrap intervals on candidate "
                   "minus baseline, a verdict per bucket: faster, slower or no significant change; default: none)")
    p.add_argument("--resamples", type=int, default=2000, metavar="N",
                   help="with --compare: bootstrap resamples (default 2000)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="with --compare: bootstrap seed (default 0)")
    p.add_argument("--slo-ttft", metavar="SPEC",
                   help="TTFT SLO in seconds (2.0 | 0.5+0.0002*isl | 0-512=0.5,...): attainment per bucket and "
                   "goodput; exact from --results, bounds from histograms (exact only at an le edge; default: none)")
    p.add_argument("--slo-itl", metavar="SPEC",
                   help="ITL SLO, as --slo-ttft (--results and --slo-from counters: each request's mean ITL, its "
                   "TPOT; histograms: each token; default: none)")
    p.add_argument("--slo-from", choices=("histograms", "counters"), default="histograms",
                   help="with --metrics/--prometheus: histograms (bounds, exact at an le edge) or counters "
                   "(exact: the gateway's --slo-ttft/--slo-itl counters; give the gateway's SLOs here) "
                   "(default: %(default)s)")
    p.add_argument("--capacity", action="store_true",
                   help="where the capacity is short: per bucket, TTFT split into queue and prefill time, and the "
                   "prefill throughput fitted from TTFT against uncached prompt tokens")
    p.add_argument("--engine-log", metavar="PATH",
                   help="with --results --capacity: the engine's queue and prefill time per request (JSONL with "
                   "request_id, queue_s, prefill_s; the sim's --truth-log is one) (default: none)")
    p.add_argument("--engine-metrics", metavar="URL|FILE",
                   help="with --metrics --capacity: the engine's /metrics (vLLM's request_queue_time and "
                   "request_prefill_time histograms; default: looked for in --metrics itself)")
    p.add_argument("--engine-metrics-before", metavar="URL|FILE",
                   help="with --engine-metrics: an earlier scrape of the engine; use the difference (default: none)")
    p.add_argument("--html", metavar="PATH",
                   help="also write a self-contained HTML report to PATH; its folder must exist (default: none)")
    p.add_argument("--title", default="servelens report", metavar="TEXT",
                   help="title of the table and HTML report (default: %(default)s)")
    p.set_defaults(func=run)


def _by(args: argparse.Namespace) -> str:
    """``isl`` or ``uncached`` (``--uncached-buckets`` implies ``--by uncached``). Raises ValueError."""
    if args.uncached_buckets and args.by == "isl":
        raise ValueError("--uncached-buckets goes with --by uncached, not --by isl")
    by: str = args.by or ("uncached" if args.uncached_buckets else "isl")
    return by


def build_report(args: argparse.Namespace) -> Report:
    """The report for parsed arguments. Raises ValueError for bad input (one-line messages)."""
    names = MetricNames(args.metrics_prefix)
    by = _by(args)
    if by == "uncached":
        if args.slo_ttft or args.slo_itl:
            raise ValueError("SLO attainment is per ISL bucket: drop --by uncached (or the SLO flags)")
        if args.isl_buckets is not None:
            raise ValueError("--by uncached takes its boundaries from --uncached-buckets, not --isl-buckets")
        try:
            buckets = IslBuckets.parse(args.uncached_buckets) if args.uncached_buckets is not None else None
        except ValueError as exc:
            raise ValueError(f"--uncached-buckets: {exc}") from None
    else:
        buckets = IslBuckets.parse(args.isl_buckets) if args.isl_buckets is not None else None
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
        default = IslBuckets(bench_bounds) if bench_bounds and by == "isl" else IslBuckets.default()
        report = report_from_results(args.results, buckets or default, by)
        if not any(r.requests for r in report.rows):
            raise ValueError(f"{args.results}: no requests in it (an empty results file)")
        return report
    if args.metrics:
        return report_from_metrics(args.metrics, names, args.metrics_before, args.model, buckets, by)
    range_s = parse_duration_s(args.range_ or "1h") if args.html else None
    return report_from_prometheus(args.prometheus, names, args.window or "5m", buckets, args.model,
                                  range_s=range_s, by=by)


def _buckets_of(report: Report, given: IslBuckets | None) -> IslBuckets:
    """The buckets the report's rows are in (the server's, unless given)."""
    if given is not None:
        return given
    return IslBuckets.from_labels(sorted((r.bucket for r in report.rows if r.bucket != "all"), key=label_sort_key))


def build_slo(args: argparse.Namespace, report: Report) -> SloReport | None:
    """SLO attainment for parsed arguments (None without an SLO flag). Raises ValueError."""
    if not (args.slo_ttft or args.slo_itl):
        if args.slo_from != "histograms":
            raise ValueError(slo_report.COUNTERS_NEED_SLO)
        return None
    if args.format == "csv":
        raise ValueError("SLO attainment is printed with --format table, markdown or json, not csv")
    given = IslBuckets.parse(args.isl_buckets) if args.isl_buckets is not None else None
    if args.results:
        bench_bounds = summary_isl_buckets(args.results)
        buckets = given or (IslBuckets(bench_bounds) if bench_bounds else IslBuckets.default())
    else:
        buckets = _buckets_of(report, given)
    slo = Slo(parse_threshold(args.slo_ttft, buckets) if args.slo_ttft else None,
              parse_threshold(args.slo_itl, buckets) if args.slo_itl else None)
    names = MetricNames(args.metrics_prefix)
    if args.results:
        if args.slo_from != "histograms":
            raise ValueError("--slo-from counters reads a gateway's counters: give --metrics or --prometheus")
        return slo_from_results(args.results, buckets, slo)
    if args.slo_from == "counters":
        if args.metrics:
            return slo_report.counters_from_metrics(args.metrics, names, args.metrics_before, args.model, buckets,
                                                    slo)
        return slo_report.counters_from_prometheus(args.prometheus, names, args.window or "5m", args.model,
                                                   buckets, slo)
    if args.metrics:
        return slo_from_metrics(args.metrics, names, args.metrics_before, args.model, buckets, slo)
    return slo_from_prometheus(args.prometheus, names, args.window or "5m", args.model, buckets, slo)


def check_capacity_flags(args: argparse.Namespace) -> None:
    """One-line errors for ``--capacity`` and its inputs given where they do not apply."""
    engine_flags = [f for f, v in (("--engine-log", args.engine_log), ("--engine-metrics", args.engine_metrics),
                                   ("--engine-metrics-before", args.engine_metrics_before)) if v]
    if not args.capacity:
        if engine_flags:
            raise ValueError(f"{engine_flags[0]} is an input of --capacity: give --capacity too")
        return
    if args.format == "csv":
        raise ValueError("--capacity is printed with --format table, markdown or json, not csv")
    if args.engine_log and not args.results:
        raise ValueError("--engine-log joins per-request times to bench results: it needs --results")
    if (args.engine_metrics or args.engine_metrics_before) and not args.metrics:
        raise ValueError("--engine-metrics goes with --metrics (with --prometheus the engine's series are read "
                         "from the same server)")


def build_capacity(args: argparse.Namespace, report: Report) -> CapacityReport | None:
    """The capacity analysis for parsed arguments (None without ``--capacity``). Raises ValueError."""
    if not args.capacity:
        return None
    from servelens.report import capacity_report

    given = IslBuckets.parse(args.isl_buckets) if args.isl_buckets else None
    names = MetricNames(args.metrics_prefix)
    if args.results:
        bench_bounds = summary_isl_buckets(args.results)
        buckets = given or (IslBuckets(bench_bounds) if bench_bounds else IslBuckets.default())
        return capacity_report.from_results(args.results, buckets, args.engine_log)
    labels = _buckets_of(report, given).labels
    if args.metrics:
        return capacity_report.from_metrics(args.metrics, names, args.metrics_before, args.model, labels,
                                            args.engine_metrics, args.engine_metrics_before)
    return capacity_report.from_prometheus(args.prometheus, names, args.window or "5m", args.model, labels)


def run_compare(args: argparse.Namespace) -> int:
    """``--results A --compare B``: the two runs bucket by bucket."""
    if not args.results:
        raise ValueError("--compare compares two bench runs: give the baseline with --results")
    if args.format not in ("table", "json"):
        raise ValueError("--compare prints --format table or json")
    if args.slo_ttft or args.slo_itl:
        raise ValueError("--slo-ttft/--slo-itl report one run; for two runs use servelens explain --results A B")
    if _by(args) == "uncached":
        raise ValueError("--compare is per ISL bucket: drop --by uncached")
    if args.resamples < 10:
        raise ValueError(f"--resamples must be >= 10, got {args.resamples}")
    buckets = IslBuckets.parse(args.isl_buckets) if args.isl_buckets is not None else None
    from servelens.report import compare
    from servelens.report.html import write_html

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
    if args.convert or args.export_jsonl:
        return run_convert(args)
    if args.html:
        check_html_path(args.html)  # before any query or file is read
    if args.compare:
        if args.capacity:
            raise ValueError("--capacity reports one run; give it without --compare")
        return run_compare(args)
    check_capacity_flags(args)
    report = build_report(args)
    slo = build_slo(args, report)
    cap = build_capacity(args, report)
    # a terminal: its real width; a file or pipe: format_rows' wide default
    width = output_width()
    if cap is not None:
        from servelens.report.capacity_output import capacity_dict, capacity_markdown, capacity_text
    if args.format == "json" and (slo is not None or cap is not None):
        sys.stdout.write(slo_json(report.rows, slo, capacity_dict(cap) if cap is not None else None))
    else:
        header = UNCACHED_HEADER if _by(args) == "uncached" else ISL_HEADER
        sys.stdout.write(format_rows(report.rows, args.format, args.title, width, label_header=header))
        if slo is not None:
            sys.stdout.write(slo_markdown(slo) if args.format == "markdown" else slo_text(slo, width))
        if cap is not None:
            sys.stdout.write(capacity_markdown(cap) if args.format == "markdown" else capacity_text(cap, width))
    sys.stdout.flush()
    if report.last_sample_s is not None:
        print(data_until(report.last_sample_s, time.time()), file=sys.stderr)
    if args.html:
        from servelens.report.html import write_html

        path = write_html(args.html, report.rows, report.timeseries, args.title, report.source,
                          label_header=UNCACHED_HEADER if _by(args) == "uncached" else ISL_HEADER)
        print(f"wrote {path}", file=sys.stderr)
    return 0


def run_convert(args: argparse.Namespace) -> int:
    """``--convert`` (JSONL to columns) or ``--export-jsonl`` (columns to JSONL)."""
    if not args.results:
        raise ValueError("--convert and --export-jsonl work on a bench results file: give --results")
    if args.convert and args.export_jsonl:
        raise ValueError("--convert writes columns from a JSONL, --export-jsonl the other way: give one")
    if args.convert:
        if is_columnar(args.results):
            raise ValueError(f"{args.results} is columns already (--export-jsonl writes them as JSONL)")
        # checked before the writer makes its folder: a failed conversion left an empty results.cols behind
        src = results_file_in(args.results) if Path(args.results).is_dir() else Path(args.results)
        if not src.is_file():
            raise ValueError(f"cannot convert {args.results}: {src} does not exist")
        try:
            out = convert_jsonl(args.results)
        except OSError as exc:
            raise ValueError(f"cannot convert {args.results}: {exc.strerror or exc}") from None
    else:
        cols = columns_for(args.results)
        if cols is None:
            raise ValueError(f"{args.results}: no results.cols there (convert a JSONL with --convert)")
        try:
            out = export_jsonl(cols, args.export_jsonl)
        except OSError as exc:
            raise ValueError(f"cannot write {args.export_jsonl}: {exc.strerror or exc}") from None
    print(f"wrote {out}", file=sys.stderr)
    return 0


def data_until(last_sample_s: float, now_s: float) -> str:
    """The line that says up to when a Prometheus API's data goes: its last scrape's time (UTC) and
    how long before ``now_s`` that was (requests that ended since come with the next scrape)."""
    at = datetime.fromtimestamp(last_sample_s, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    ago = max(now_s - last_sample_s, 0.0)
    return (f"data up to {at} ({ago:.0f} s ago), the last scrape: requests that ended since then are counted "
            "after the next scrape")


def check_html_path(path: str) -> None:
    """ValueError (one line) unless ``path``'s folder exists: a typo in a folder name must not create a
    new tree of folders in silence (the bench's --output-dir, a folder it owns, is created)."""
    folder = Path(path).expanduser().parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise ValueError(f"--html {path}: the folder {folder} {what} (create it first)")
