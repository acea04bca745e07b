"""``servelens demo``: the story (:mod:`servelens.demo_story`: three phases on the sim, ``explain``'s
verdicts), or with ``--trace`` (or another engine) one trace replay (:mod:`servelens.demo`)."""

from __future__ import annotations

import argparse

from servelens.cli.main import CliError
from servelens.demo import DEMO_TRACE, DEMO_TRACE_SMALL, ENGINES, DemoConfig, run_demo
from servelens.demo_story import StoryConfig, run_story
from servelens.engines.harness import HarnessError
from servelens.process import ServerStartError

# per engine: the defaults of --trace, --time-scale and --max-requests (the real engines on 2 cores are
# slower; a real 135M model on a CPU prefills ~100-250 tokens/s, so llama.cpp gets the shorter Azure prompts)
_DEFAULTS: dict[str, tuple[str, float, int | None]] = {
    "sim": (DEMO_TRACE, 0.5, None), "vllm": (DEMO_TRACE, 4.0, 30), "llama.cpp": (DEMO_TRACE_SMALL, 8.0, 10),
}


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``servelens demo``."""
    p = sub.add_parser(
        "demo",
        help="run the main job end to end on the embedded simulated engine",
        description="Tell the story per-bucket metrics exist for: three phases on the simulated engine behind "
        "the gateway (ISL buckets 512..16384) on free loopback ports: a baseline; the traffic shifted toward "
        "long prompts; the baseline's traffic on an engine slowed on long prompts. After each phase the "
        "per-bucket table (client and gateway: side by side, or one above the other on a narrow "
        "terminal), then servelens explain's verdict against the baseline "
        "(mix or latency, and where), and report.html with the single TTFT p95 line beside the same at the "
        "baseline's mix and the per-bucket lines over time. About 90 s. With --trace (or a real --engine): "
        "one replay of that trace instead.",
    )
    p.add_argument("--engine", choices=ENGINES, default="sim",
                   help="sim (default), vllm (vLLM CPU build with a tiny local model; installs on first use) or "
                   "llama.cpp (llama-server with SmolLM2-135M-Instruct; builds on first use, cached per machine)")
    p.add_argument("--trace", default=None, metavar="PATH|NAME",
                   help=f"replay this trace (path or packaged name, e.g. {DEMO_TRACE}) instead of the story "
                   f"(the real engines replay one always: default {DEMO_TRACE}, {DEMO_TRACE_SMALL} for llama.cpp)")
    p.add_argument("--time-scale", type=float, default=None, metavar="FACTOR",
                   help="multiply trace timestamps by F (default 0.5 for sim; 4 for vllm and 8 for llama.cpp, "
                   "whose 2-core engines are slower)")
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                   help="the story: each phase's length (default 20); a replay: stop starting requests after "
                   "SECONDS (default: the whole cut, ~70 s)")
    p.add_argument("--max-requests", type=int, default=None, metavar="N",
                   help="a replay: send at most N requests (default: all for sim, 30 for vllm, 10 for llama.cpp)")
    p.add_argument("--output-dir", default="servelens-demo", metavar="DIR",
                   help="where report.html, results.jsonl, summary.json and logs go (default servelens-demo)")
    p.add_argument("--keep-running", action="store_true",
                   help="leave the engine and gateway up after the run (for a dashboard) until Ctrl-C")
    p.add_argument("--engine-port", type=int, default=None, metavar="PORT",
                   help="a replay: the engine's loopback port, fixed so a Prometheus scrape config can be reused "
                   "(default: a free port, new each run)")
    p.add_argument("--gateway-port", type=int, default=None, metavar="PORT",
                   help="a replay: the gateway's loopback port, the one to scrape (default: a free port, new each "
                   "run)")
    p.add_argument("--speedup", type=float, default=None, metavar="FACTOR",
                   help="sim only: divide every simulated time by this (the story: default 1, real speed, on "
                   "16 engine replicas; a replay: default 8, one engine: the packaged trace carries more prefill "
                   "than one simulated H100 serves)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.engine != "sim" and args.speedup is not None:  # it was ignored in silence
        raise CliError(f"--speedup applies to --engine sim only ({args.engine} runs in real time)")
    trace, time_scale, max_requests = _DEFAULTS[args.engine]
    config = DemoConfig(  # checks the flags, story or replay, before anything starts
        engine=args.engine,
        trace=args.trace if args.trace is not None else trace,
        time_scale=args.time_scale if args.time_scale is not None else time_scale,
        duration_s=args.duration,
        max_requests=args.max_requests if args.max_requests is not None else max_requests,
        output_dir=args.output_dir,
        keep_running=args.keep_running,
        engine_port=args.engine_port or 0,
        gateway_port=args.gateway_port or 0,
        **({"sim_speedup": args.speedup} if args.speedup is not None else {}),
    )
    try:
        if args.trace is None and args.engine == "sim":
            return _story(args, config)
        result = run_demo(config)
    except ServerStartError as exc:  # the child's own one-line reason is in the message
        raise CliError(str(exc)) from None
    except HarnessError as exc:  # a real engine's build or start failed: its first line names the step and log
        raise CliError(str(exc).splitlines()[0]) from None
    return 0 if result.bench.records else 1


def _story(args: argparse.Namespace, config: DemoConfig) -> int:
    """The three-phase story (the default on the sim)."""
    for flag, value in (("--time-scale", args.time_scale), ("--max-requests", args.max_requests),
                        ("--keep-running", args.keep_running or None), ("--engine-port", args.engine_port),
                        ("--gateway-port", args.gateway_port)):
        if value is not None:
            raise CliError(f"{flag} applies to a trace replay (--trace), not to the story")
    story = StoryConfig(phase_s=args.duration or 20.0, output_dir=config.output_dir,
                        **({"sim_speedup": args.speedup} if args.speedup is not None else {}))
    result = run_story(story)
    return 0 if all(b.records for b in result.benches.values()) else 1
