"""``servelens bench``: load an OpenAI-compatible endpoint and print the per-ISL-bucket latency table."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from servelens.bench import BenchConfig, print_result, run_bench_sync
from servelens.bench.traces import PACKAGED_TRACES, TRACE_FORMATS, resolve_trace
from servelens.cli.main import HelpFormatter, interrupted
from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES
from servelens.formats.results import RESULTS_FILE

EPILOG = """\
examples:
  servelens bench --url http://127.0.0.1:8000 --isl 300:0.6,12000:0.4 \\
      --osl 128 --concurrency 16 --num-requests 200
  servelens bench --url http://127.0.0.1:8080 \\
      --trace mooncake_conversation_400.jsonl --time-scale 0.5 \\
      --max-context 32768 --long-requests clip \\
      --metrics-url http://127.0.0.1:8080/metrics    # a gateway on :8080

arrivals: --concurrency N alone is a closed loop of N workers; --rate R an
open loop (add --concurrency to cap requests in flight); a trace is sent at
its own timestamps (times --time-scale). With neither --concurrency nor
--rate a synthetic workload runs one request at a time (a closed loop of 1),
a trace uncapped.

length specs (tokens): 300 | uniform:A-B | lognormal:MEAN,SD | 300:0.6,12000:0.4
packaged traces (give the bare name to --trace):
""" + "".join(f"  {name}\n" for name in PACKAGED_TRACES)

DESCRIPTION = """\
Replay a synthetic workload or a real trace against an OpenAI-compatible
endpoint and print TTFT/ITL percentiles per input-length (ISL) bucket, from
the client and, with --metrics-url, from the server's /metrics (scraped
before and after the run)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench``."""
    p = subparsers.add_parser(
        "bench",
        help="load test an OpenAI-compatible endpoint; per-ISL-bucket TTFT/ITL table",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    g = p.add_argument_group("endpoint")
    g.add_argument("--url", required=True, metavar="URL",
                   help="endpoint base URL, e.g. http://127.0.0.1:8000 (/v1/... is appended)")
    g.add_argument("--model", metavar="NAME", help="model name (default: the first model GET /v1/models lists)")
    g.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                   help="chat: /v1/chat/completions, completions: /v1/completions (default: chat)")
    g.add_argument("--api-key", metavar="KEY", default=os.environ.get("OPENAI_API_KEY"),
                   help="bearer token (default: $OPENAI_API_KEY)")
    w = p.add_argument_group("workload")
    w.add_argument("--trace", metavar="PATH|NAME",
                   help="Mooncake JSONL or Azure CSV trace, a path or a packaged trace's name (default: none, "
                   "a synthetic workload)")
    w.add_argument("--trace-format", choices=TRACE_FORMATS, help="trace format (default: detected)")
    w.add_argument("--time-scale", type=float, default=1.0, metavar="FACTOR",
                   help="multiply trace timestamps by FACTOR: 0.1 replays ten times faster, 0 sends every "
                   "request at once, capped by --concurrency (default: 1.0)")
    w.add_argument("--isl", default=None, metavar="SPEC", help="synthetic input lengths, tokens (default: 512)")
    w.add_argument("--osl", default=None, metavar="SPEC", help="synthetic output lengths, tokens (default: 128)")
    w.add_argument("--num-requests", type=int, default=None, metavar="N",
                   help="synthetic workload size (default: 100)")
    w.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed of the lengths, Poisson arrivals and prompt texts (default: 0)")
    w.add_argument("--max-requests", type=int, metavar="N", help="send at most N requests (default: no limit)")
    w.add_argument("--duration", type=float, metavar="SECONDS",
                   help="stop starting requests after SECONDS; those in flight finish (default: no limit)")
    w.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer.json of a real engine (default: the sim's tokenizer, one token per word)")
    w.add_argument("--max-context", type=int, metavar="TOKENS",
                   help="context length in tokens (default: max_model_len from /v1/models, if reported)")
    w.add_argument("--long-requests", choices=("drop", "clip"), default="drop",
                   help="requests whose ISL+OSL exceeds the context: drop them, or clip the prompt to fit, "
                   "leaving room for the chat template (default: drop)")
    a = p.add_argument_group("arrivals (neither --concurrency nor --rate: one request at a time)")
    a.add_argument("--concurrency", type=int, metavar="N",
                   help="closed loop with N workers; with --rate or --trace: cap on requests in flight "
                   "(default: 1 for a synthetic workload without --rate, else no cap)")
    a.add_argument("--rate", type=float, metavar="PER_SECOND",
                   help="open loop at PER_SECOND requests/s (default: none, a closed loop)")
    a.add_argument("--arrival", choices=("poisson", "constant"), default="poisson",
                   help="with --rate: Poisson or evenly spaced arrivals (default: poisson)")
    a.add_argument("--ramp-up", type=float, metavar="SECONDS",
                   help="closed loop: start the workers over SECONDS (default: 1 ms per worker, at most 2 s)")
    m = p.add_argument_group("measurement and output")
    m.add_argument("--isl-buckets", default=",".join(str(b) for b in DEFAULT_ISL_BOUNDARIES), metavar="B1,B2,...",
                   help="ISL bucket upper bounds, tokens (default: %(default)s)")
    m.add_argument("--uncached-buckets", metavar="B1,B2,...",
                   help="also a table by uncached prompt tokens (ISL minus cached tokens), bucket upper bounds, "
                   "tokens (default: none)")
    m.add_argument("--metrics-url", metavar="URL",
                   help="a gateway's or engine's /metrics, scraped before and after the run (default: none, "
                   "no server-side table)")
    m.add_argument("--metrics-prefix", default="servelens", metavar="PREFIX",
                   help="metric-name prefix at --metrics-url; dynamo_frontend for Dynamo's (default: %(default)s)")
    m.add_argument("--output-dir", default="bench-results", metavar="DIR",
                   help="where results.jsonl and summary.json go (default: %(default)s)")
    m.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="per-read timeout of a request (default: 600)")
    m.add_argument("--max-loop-lag-ms", type=float, default=10.0, metavar="MS",
                   help="client event-loop lag p99 above which the client figures are marked untrustworthy "
                   "(default: 10)")
    m.add_argument("--no-continuous-usage", action="store_true", help="do not ask for continuous_usage_stats")
    m.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos/min_tokens")
    m.add_argument("--no-progress", action="store_true", help="no progress bar")
    m.add_argument("--slo-ttft", metavar="SPEC",
                   help="TTFT SLO in seconds (2.0 | 0.5+0.0002*isl | 0-512=0.5,...): attainment per bucket and "
                   "goodput (default: none)")
    m.add_argument("--slo-itl", metavar="SPEC",
                   help="ITL SLO, judged on each request's mean ITL (TPOT), as --slo-ttft (default: none)")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Build the frozen config (raises ValueError for bad values)."""
    trace = str(resolve_trace(args.trace)) if args.trace else None
    if trace:
        given = [f for f, v in (("--isl", args.isl), ("--osl", args.osl), ("--num-requests", args.num_requests))
                 if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} describe a synthetic workload; with --trace the trace sets "
                             "the lengths (use --max-requests to bound it)")
    return BenchConfig(
        url=args.url,
        model=args.model,
        endpoint=args.endpoint,
        trace=trace,
        trace_format=args.trace_format,
        time_scale=args.time_scale,
        isl=args.isl or "512",
        osl=args.osl or "128",
        num_requests=args.num_requests if args.num_requests is not None else 100,
        seed=args.seed,
        max_requests=args.max_requests,
        duration_s=args.duration,
        concurrency=args.concurrency,
        rate=args.rate,
        arrival=args.arrival,
        ramp_up_s=args.ramp_up,
        tokenizer=args.tokenizer,
        max_context=args.max_context,
        long_requests=args.long_requests,
        isl_buckets=args.isl_buckets,  # type: ignore[arg-type]  # parsed in __post_init__
        uncached_buckets=args.uncached_buckets,  # parsed in __post_init__
        metrics_url=args.metrics_url,
        metrics_prefix=args.metrics_prefix,
        output_dir=args.output_dir or None,
        request_timeout_s=args.request_timeout,
        lag_threshold_ms=args.max_loop_lag_ms,
        continuous_usage=False if args.no_continuous_usage else None,
        ignore_eos=not args.no_ignore_eos,
        api_key=args.api_key,
        progress=not args.no_progress,
        slo_ttft=args.slo_ttft,
        slo_itl=args.slo_itl,
    )


def run(args: argparse.Namespace) -> int:
    """Run the bench and print the table; exit 0 (1 when every request failed)."""
    config = config_from_args(args)
    results = Path(config.output_dir) / RESULTS_FILE if config.output_dir else None
    before = _identity(results)
    try:
        result = run_bench_sync(config)
    except KeyboardInterrupt as exc:
        # written by this run (a results file of an earlier run in the folder is not this run's)
        now = _identity(results)
        if results is not None and now is not None and now != before:
            status, which = interrupted(exc)
            print(f"servelens: interrupted{which}; the requests that finished are in "
                  f"{results} (servelens report --results {config.output_dir})",
                  file=sys.stderr)
            return status
        raise
    print_result(result)
    return 1 if result.records and result.errors == len(result.records) else 0


def _identity(path: Path | None) -> tuple[int, int, int] | None:
    """``(inode, mtime ns, size)`` of ``path``, None when there is no such file: a file written in
    between differs (no clock is compared)."""
    try:
        st = path.stat() if path is not None else None
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size) if st is not None else None
