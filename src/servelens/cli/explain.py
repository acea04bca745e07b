"""``servelens explain``: slower, or did the traffic shift? Two windows in, the split of each latency
change into a bucket-mix effect and a per-bucket latency effect out."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from servelens.cli.main import HelpFormatter
from servelens.core.buckets import IslBuckets
from servelens.core.slo import Slo, parse_threshold
from servelens.core.uncertainty import BOOTSTRAP_MAX_REQUESTS, INTERVALS
from servelens.core.windows import ExplainError, window_mix
from servelens.formats.mix_file import read_mix, write_mix
from servelens.prometheus.names import DEFAULT_PREFIX, MetricNames
from servelens.report.explain import ExplainOptions, explain_windows
from servelens.report.explain_output import render_text, to_json
from servelens.report.explain_windows import METRICS, WindowPairs, from_prometheus, from_results, from_scrapes

EPILOG = """\
examples:
  servelens explain --results run-monday/ run-tuesday/
  servelens explain --metrics t0.txt t1.txt t2.txt http://127.0.0.1:8080/metrics
  servelens explain --prometheus http://127.0.0.1:9090 --before 1h --after 10m \\
      --format json

ranges (--before, --after): DURATION ends now (--after) or where --after
starts (--before); DURATION@END ends at END: now, now-10m, unix seconds or
2026-01-31T12:00:00Z.
SLOs (--slo-ttft, --slo-itl), seconds: 2.0 | 0.5+0.0002*isl |
0-512=0.5,513-1024=0.8,... (ITL judges each request's mean ITL from results
files, each token from histograms)."""

USAGE = """\
%(prog)s [-h] (--results BEFORE AFTER | --metrics B0 B1 A0 A1 |
           --prometheus URL --before RANGE --after RANGE) [options]"""


def add_parser(subparsers: Any) -> None:
    """Register ``explain``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "explain",
        help="slower, or did the traffic shift? split a latency change into mix and latency effects",
        description="Compare two windows of per-ISL-bucket latency (TTFT, ITL, request duration) and split "
        "each mean's change exactly into a mix effect (bucket shares moved) and a latency effect (buckets "
        "got slower or faster), with intervals; show the later window at the earlier window's bucket mix "
        "(mean, p50/p95/p99) and the buckets whose own latency changed, ranked by contribution. The first "
        "lines are one verdict per metric: mix, latency, both or none.",
        epilog=EPILOG,
        usage=USAGE,
        formatter_class=HelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--results", nargs=2, metavar=("BEFORE", "AFTER"),
                     help="two bench results files (results.jsonl or their folders): exact figures")
    src.add_argument("--metrics", nargs=4, metavar=("B0", "B1", "A0", "A1"),
                     help="two pairs of /metrics scrapes (files or URLs): earlier window B1-B0, later A1-A0")
    src.add_argument("--prometheus", metavar="URL", help="Prometheus-compatible API base URL (Prometheus, "
                     "VictoriaMetrics), with --before and --after")
    p.add_argument("--before", metavar="RANGE",
                   help="with --prometheus: the earlier range, e.g. 1h (no default: required with --prometheus)")
    p.add_argument("--after", metavar="RANGE",
                   help="with --prometheus: the later range, e.g. 10m (no default: required with --prometheus)")
    p.add_argument("--metrics-prefix", default=DEFAULT_PREFIX, metavar="PREFIX",
                   help="metric name prefix (dynamo_frontend for Dynamo names; default: servelens)")
    p.add_argument("--model", metavar="NAME",
                   help="with --metrics or --prometheus: only this model (default: all summed)")
    p.add_argument("--isl-buckets", metavar="B1,B2,...",
                   help="ISL bucket boundaries (default: the bench runs' own, or the server's)")
    p.add_argument("--metric", default="ttft,itl,duration", metavar="NAME,NAME,...",
                   help="which metrics to explain, comma-separated (default: ttft,itl,duration)")
    p.add_argument("--quantile", type=float, default=0.95, metavar="Q",
                   help="the quantile the verdict line names (default: 0.95)")
    p.add_argument("--confidence", type=float, default=0.95, metavar="LEVEL",
                   help="interval level (default: 0.95)")
    p.add_argument("--resamples", type=int, default=2000, metavar="N",
                   help="bootstrap resamples, results files (default 2000)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="bootstrap seed (default: 0)")
    p.add_argument("--intervals", choices=INTERVALS, default="auto",
                   help="results files: how the intervals are made: the bootstrap over requests, or the normal "
                   f"approximation from per-request sums; auto bootstraps up to {BOOTSTRAP_MAX_REQUESTS:,} requests "
                   "a window and uses the normal approximation above (default: auto; the output's uncertainty "
                   "line names the method)"),
    p.add_argument("--reference-mix", metavar="FILE",
                   help="also show both windows at this bucket mix (a YAML file of shares per ISL bucket; "
                   "default: none)")
    p.add_argument("--write-mix", metavar="FILE",
                   help="write the earlier window's TTFT bucket mix as a reference-mix file (default: none)")
    p.add_argument("--slo-ttft", metavar="SPEC",
                   help="TTFT SLO in seconds: attainment per bucket and goodput (default: none)")
    p.add_argument("--slo-itl", metavar="SPEC",
                   help="ITL SLO in seconds, as --slo-ttft (--results: each request's mean ITL, its TPOT; histograms: "
                   "each token): attainment per bucket and goodput (default: none)")
    p.add_argument("--capacity", action="store_true",
                   help="with --results or --metrics: where the capacity is short in each window (TTFT split into "
                   "queue and prefill per bucket, the prefill throughput fit; see servelens report --capacity)")
    p.add_argument("--engine-log", nargs=2, metavar=("BEFORE", "AFTER"),
                   help="with --results --capacity: each run's engine log (request_id, queue_s, prefill_s) "
                   "(default: none)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    p.set_defaults(func=run)


def _metrics(spec: str) -> tuple[str, ...]:
    by = {m.lower(): m for m in METRICS}
    got = []
    for part in spec.split(","):
        key = part.strip().lower()
        if key not in by:
            raise ExplainError(f"--metric: unknown metric {part.strip()!r} (ttft, itl, duration)")
        got.append(by[key])
    return tuple(dict.fromkeys(got))


def read_windows(args: argparse.Namespace) -> WindowPairs:
    """The windows for parsed arguments. Raises ValueError (one line) for bad input."""
    buckets = IslBuckets.parse(args.isl_buckets) if args.isl_buckets is not None else None
    names = MetricNames(args.metrics_prefix)
    if (args.before or args.after) and not args.prometheus:
        raise ExplainError("--before and --after go with --prometheus (--results and --metrics name their windows)")
    if args.results:
        if args.model:
            raise ExplainError("--model applies to --metrics and --prometheus, not --results")
        return from_results(args.results[0], args.results[1], buckets, bool(args.slo_ttft or args.slo_itl))
    if args.metrics:
        return from_scrapes(args.metrics, names, args.model, buckets)
    if not (args.before and args.after):
        raise ExplainError("--prometheus needs --before RANGE and --after RANGE (e.g. --before 1h --after 10m)")
    return from_prometheus(args.prometheus, names, args.before, args.after, args.model, buckets)


def _with_capacity(args: argparse.Namespace, pairs: WindowPairs, out: str) -> str:
    """The explanation with each window's capacity analysis: lines after the text, or a
    ``capacity`` field (``before``, ``after``) in the JSON."""
    from servelens.core.capacity import verdict_line  # scipy: imported only when asked (half a second)
    from servelens.report import capacity_report
    from servelens.report.capacity_output import capacity_dict

    names = MetricNames(args.metrics_prefix)
    if args.results:
        buckets = pairs.buckets or IslBuckets.from_labels(pairs.labels)
        logs = args.engine_log or (None, None)
        reps = [capacity_report.from_results(path, buckets, log) for path, log in zip(args.results, logs, strict=True)]
    else:
        b0, b1, a0, a1 = args.metrics
        reps = [capacity_report.from_metrics(after, names, before, args.model, pairs.labels)
                for before, after in ((b0, b1), (a0, a1))]
    if args.format == "json":
        doc = json.loads(out)
        doc["capacity"] = {"before": capacity_dict(reps[0]), "after": capacity_dict(reps[1])}
        return json.dumps(doc, indent=2, allow_nan=False) + "\n"
    lines = [out.rstrip("\n"), ""]
    for when, rep in (("earlier window", reps[0]), ("later window", reps[1])):
        lines.append(f"{when}: {verdict_line(rep)}")
        lines.extend(f"  note: {n}" for n in rep.notes)
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Print the explanation."""
    metrics = _metrics(args.metric)
    if not 0 < args.quantile < 1:
        raise ExplainError(f"--quantile must be within (0, 1), got {args.quantile}")
    if not 0 < args.confidence < 1:
        raise ExplainError(f"--confidence must be within (0, 1), got {args.confidence}")
    if args.intervals == "bootstrap" and not args.results:
        raise ExplainError("--intervals bootstrap needs per-request samples (--results); histograms have the normal "
                           "approximation from counts")
    if args.resamples < 10:
        raise ExplainError(f"--resamples must be >= 10, got {args.resamples}")
    reference = read_mix(args.reference_mix) if args.reference_mix else None
    if args.engine_log and not (args.capacity and args.results):
        raise ExplainError("--engine-log goes with --results and --capacity")
    if args.capacity and args.prometheus:
        raise ExplainError("--capacity reads --results or --metrics; for Prometheus use servelens report "
                           "--prometheus URL --capacity --window")
    pairs = read_windows(args)
    slo = None
    if args.slo_ttft or args.slo_itl:
        buckets = pairs.buckets
        if buckets is None:
            raise ExplainError(f"SLOs need standard ISL bucket labels, got {', '.join(pairs.labels)}")
        slo = Slo(parse_threshold(args.slo_ttft, buckets) if args.slo_ttft else None,
                  parse_threshold(args.slo_itl, buckets) if args.slo_itl else None)
    options = ExplainOptions(headline=args.quantile, confidence=args.confidence, resamples=args.resamples,
                             seed=args.seed, reference=reference, slo=slo, metrics=metrics, intervals=args.intervals)
    report = explain_windows(pairs, options)
    if args.write_mix:
        earlier = pairs.windows["TTFT"][0]
        path = write_mix(args.write_mix, window_mix(earlier), f"the earlier window: {pairs.before_desc}")
        print(f"wrote {path}", file=sys.stderr)
    out = to_json(report) if args.format == "json" else render_text(report, args.quantile)
    if args.capacity:
        out = _with_capacity(args, pairs, out)
    sys.stdout.write(out)
    sys.stdout.flush()
    return 0
