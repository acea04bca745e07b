"""``servelens gateway``: the measuring reverse proxy in front of an OpenAI-compatible engine."""

from __future__ import annotations

import argparse
from typing import Any

from servelens.gateway.config import CONTINUOUS_USAGE_MODES, GatewayConfig, load_config_file
from servelens.gateway.server import run as run_server


def add_parser(subparsers: Any) -> None:
    """Register ``servelens gateway``."""
    p = subparsers.add_parser(
        "gateway", help="run the measuring OpenAI-compatible proxy",
        description="A streaming reverse proxy for OpenAI-compatible servers (vLLM, SGLang, Dynamo, TGI, "
        "llama.cpp, the sim) that records TTFT/ITL/duration/ISL/OSL/cached tokens per model and ISL bucket "
        "and serves them at /metrics. Flags given here override the --config file (a YAML example is in "
        "the README, section Gateway).",
    )
    p.add_argument("--upstream", metavar="URL",
                   help="the engine's base URL, e.g. http://127.0.0.1:8000 (default: the --config file's)")
    p.add_argument("--config", metavar="FILE",
                   help="YAML file: models -> upstreams and any setting below (default: none)")
    p.add_argument("--model", action="append", metavar="NAME", dest="models",
                   help="a model served by --upstream (repeatable; default: what its /v1/models lists)")
    p.add_argument("--host", metavar="ADDRESS", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, metavar="PORT", help="port (0: pick a free one; default 8080)")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve /metrics on a listener of its own on PORT (0: a free one), not on --port "
                   "(default: /metrics on --port)")
    p.add_argument("--metrics-host", metavar="HOST", help="bind address of the metrics listener (default --host)")
    p.add_argument("--workers", metavar="N",
                   help="worker processes accepting on the same port (SO_REUSEPORT), each with its own event loop; "
                   "/metrics on any of them is the sum over all; a worker that dies is restarted and its counts "
                   "kept; auto: the cores available; at most 4 per core (default 1)")
    p.add_argument("--isl-buckets", metavar="B1,B2,...",
                   help="ISL bucket upper bounds in tokens (default 512,1024,2048,4096,8192,16384); 'off' turns "
                   "the by-ISL metrics off (an empty value is an error)")
    p.add_argument("--uncached-buckets", metavar="B1,B2,...",
                   help="also bucket by uncached prompt tokens (ISL minus cached tokens; label uncached_bucket), "
                   "same rules as --isl-buckets (default off)")
    p.add_argument("--metrics-prefix", metavar="PREFIX", help="metric name prefix (default servelens; "
                   "dynamo_frontend gives Dynamo's names)")
    p.add_argument("--ttft-edges", dest="ttft_edges_s", metavar="EDGES",
                   help="le edges of the TTFT histograms: fine (default: 2^(1/8) apart, ~1 ms to 128 s), dynamo "
                   "(Dynamo 1.6.1's), or seconds S1,S2,...; with --metrics-prefix dynamo_frontend only Dynamo's")
    p.add_argument("--itl-edges", dest="itl_edges_s", metavar="EDGES",
                   help="le edges of the ITL histograms: fine (default: 2^(1/8) apart, ~0.12 ms to 8 s), dynamo, "
                   "or seconds S1,S2,...")
    p.add_argument("--duration-edges", dest="duration_edges_s", metavar="EDGES",
                   help="le edges of the request-duration histograms: fine (default: 2^(1/8) apart, ~7.8 ms to "
                   "512 s), dynamo (0, 2, 4, ... s: every short request in one bucket), or seconds S1,S2,...")
    p.add_argument("--max-series", type=int, metavar="N",
                   help="series budget of /metrics: at most N / (series per model) models are registered "
                   "(default 50000; the start line says the series per model)")
    p.add_argument("--by-isl-only", action="store_true", default=None,
                   help="export only the by-ISL families and the assignment counter (sidecar mode)")
    p.add_argument("--continuous-usage", choices=CONTINUOUS_USAGE_MODES,
                   help="add stream_options.continuous_usage_stats for exact tokens per chunk: auto (default: "
                   "add it, and stop for an upstream that rejects it), on, off")
    p.add_argument("--no-usage-injection", dest="inject_usage", action="store_false", default=None,
                   help="never add stream_options.include_usage to client streams")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer.json to count prompt tokens at arrival; needs the tokenizers extra (default: "
                   "none, the ISL comes from the stream's usage)")
    p.add_argument("--chat-template", metavar="PATH",
                   help="with --tokenizer: the model's chat template (tokenizer_config.json or a Jinja file); chat "
                   "prompts are counted as rendered by it, exact when the engine uses the same template "
                   "(default: none, the messages' text)")
    p.add_argument("--request-log", metavar="PATH",
                   help="append one JSON line per measured request (default: none)")
    p.add_argument("--request-log-chunks", action="store_true", default=None,
                   help="the request log also holds every output chunk's arrival time and tokens")
    p.add_argument("--max-body-bytes", metavar="SIZE",
                   help="request body limit, bytes or a size: 16MiB, 512KiB, 16M (= 16MiB), 16MB (= 16,000,000); "
                   "413 above (default 16MiB)")
    p.add_argument("--connect-timeout", type=float, dest="connect_timeout_s", metavar="SECONDS",
                   help="upstream connect timeout (default 10 s)")
    p.add_argument("--response-timeout", type=float, dest="response_timeout_s", metavar="SECONDS",
                   help="wait for the upstream's response headers / unary body (default 600 s; 504 after)")
    p.add_argument("--read-timeout", type=float, dest="read_timeout_s", metavar="SECONDS",
                   help="longest silence inside a stream (default 600 s)")
    p.add_argument("--client-timeout", type=float, dest="client_timeout_s", metavar="SECONDS",
                   help="longest silence of a client sending its request: an idle or unfinished connection is "
                   "closed, a stalled body answered 408 (default 60 s)")
    p.add_argument("--models-refresh", type=float, dest="models_refresh_s", metavar="SECONDS",
                   help="re-poll the upstream's /v1/models every SECONDS (default 30; 0: never)")
    p.add_argument("--shutdown-timeout", type=float, dest="shutdown_timeout_s", metavar="SECONDS",
                   help="on SIGTERM, let requests in flight run up to SECONDS, then cut and count them "
                   "cancelled (default 25)")
    p.add_argument("--slo-ttft", metavar="SPEC",
                   help="count per ISL bucket the requests whose TTFT meets SPEC (2.0 | 0.5+0.0002*isl | "
                   "0-512=0.5,...; seconds), exactly, in {prefix}_requests_within_slo_by_isl_total (default: none, "
                   "no SLO counters)")
    p.add_argument("--slo-itl", metavar="SPEC",
                   help="the same for each request's mean ITL (its TPOT), seconds (as --slo-ttft; default: none)")
    p.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    p.set_defaults(func=run)


_FLAGS = (
    "metrics_port", "metrics_host",  # the metrics listener
    "workers",
    "upstream", "host", "port", "isl_buckets", "uncached_buckets", "metrics_prefix", "ttft_edges_s", "itl_edges_s",
    "duration_edges_s",
    "max_series",
    "by_isl_only", "continuous_usage", "inject_usage", "tokenizer", "chat_template", "request_log",
    "request_log_chunks",
    "max_body_bytes", "connect_timeout_s", "response_timeout_s",
    "read_timeout_s", "client_timeout_s", "models_refresh_s", "shutdown_timeout_s", "slo_ttft", "slo_itl",
)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """The :class:`GatewayConfig` for parsed arguments (flags override the file). Raises ValueError."""
    values: dict[str, Any] = load_config_file(args.config) if args.config else {}
    values.setdefault("port", 8080)
    for name in _FLAGS:
        v = getattr(args, name)
        if v is not None:
            values[name] = v
    if args.models:
        if not values.get("upstream"):
            raise ValueError("--model needs --upstream")
        values["models"] = list(args.models)
    if not values.get("upstream") and not values.get("models"):
        raise ValueError("give --upstream URL (or a --config file that maps models to upstreams)")
    return GatewayConfig.from_mapping(values)


def run(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM. Returns 0."""
    config = config_from_args(args)
    run_server(config, use_uvloop=not args.no_uvloop)
    return 0
