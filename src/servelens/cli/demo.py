"""``servelens demo``: sim + gateway + a real trace, the per-bucket table and report.html."""

from __future__ import annotations

import argparse

from servelens.cli.main import CliError
from servelens.demo import DEMO_TRACE, ENGINES, DemoConfig, run_demo
from servelens.process import ServerStartError


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``servelens demo``."""
    p = sub.add_parser(
        "demo",
        help="run the main job end to end on the embedded simulated engine",
        description="Start the simulated engine and the gateway (ISL buckets 512..16384) on free loopback "
        "ports, replay a cut of the real Mooncake conversation trace through them, print the per-bucket "
        "table from the client and from the gateway's /metrics side by side, write report.html, stop.",
    )
    p.add_argument("--engine", choices=ENGINES, default="sim",
                   help="sim (default) or vllm (vLLM CPU build with a tiny local model; installs on first use)")
    p.add_argument("--trace", default=DEMO_TRACE, help=f"trace path or packaged name (default {DEMO_TRACE})")
    p.add_argument("--time-scale", type=float, default=None,
                   help="multiply trace timestamps by F (default 0.5 for sim; 4 for vllm, whose "
                   "2-core engine is slower)")
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                   help="stop starting requests after SECONDS of replay (default: the whole cut, ~70 s)")
    p.add_argument("--max-requests", type=int, default=None, help="send at most N requests")
    p.add_argument("--output-dir", default="servelens-demo", metavar="DIR",
                   help="where report.html, results.jsonl, summary.json and logs go (default servelens-demo)")
    p.add_argument("--keep-running", action="store_true",
                   help="leave the engine and gateway up after the run (for a dashboard) until Ctrl-C")
    p.add_argument("--speedup", type=float, default=None,
                   help="sim only: divide every simulated time by this (default 8: the packaged trace "
                   "carries more prefill than one simulated H100 serves)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    vllm = args.engine == "vllm"
    if vllm and args.speedup is not None:  # it was ignored in silence
        raise CliError("--speedup applies to --engine sim only (vLLM runs in real time)")
    config = DemoConfig(
        engine=args.engine,
        trace=args.trace,
        time_scale=args.time_scale if args.time_scale is not None else (4.0 if vllm else 0.5),
        duration_s=args.duration,
        max_requests=args.max_requests if args.max_requests is not None else (30 if vllm else None),
        output_dir=args.output_dir,
        keep_running=args.keep_running,
        **({"sim_speedup": args.speedup} if args.speedup is not None else {}),
    )
    try:
        result = run_demo(config)
    except ServerStartError as exc:  # the child's own one-line reason is in the message
        raise CliError(str(exc)) from None
    return 0 if result.bench.records else 1
