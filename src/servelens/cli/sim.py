"""``servelens sim``: run the simulated OpenAI-compatible engine."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from servelens.serving import serve_until_signal
from servelens.sim.config import SimConfig
from servelens.sim.faults import FAULT_MODES, parse_modes
from servelens.sim.model import ModelParams
from servelens.sim.presets import DEFAULT_PRESET, PRESETS
from servelens.sim.server import start_server

_PARAM_HELP = {
    "step_overhead_s": ("SECONDS", "fixed cost of every step"),
    "prefill_s_per_token": ("SECONDS", "linear prefill cost per uncached prompt token"),
    "prefill_attn_s_per_token_pair": ("SECONDS", "quadratic attention cost per (query, context) token pair"),
    "decode_base_s": ("SECONDS", "cost of a step with any decoding sequence"),
    "decode_s_per_seq": ("SECONDS", "decode cost per sequence in the batch"),
    "decode_s_per_kv_token": ("SECONDS", "decode cost per KV token held by decoding sequences"),
    "max_num_seqs": ("N", "most sequences running at once"),
    "max_num_batched_tokens": ("TOKENS", "token budget of one step (decode + chunked prefill)"),
    "kv_capacity_tokens": ("TOKENS", "KV cache size (admission reserves prompt + max_tokens)"),
    "block_size": ("TOKENS", "prefix-cache block size"),
    "prefix_cache_blocks": ("BLOCKS", "prefix-cache LRU capacity in blocks (0: off)"),
}
"""Timing-model flag -> (metavar, help); the default is the preset's value."""


def add_parser(subparsers: Any) -> None:
    """Register ``servelens sim``."""
    presets = "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values())
    p = subparsers.add_parser(
        "sim", help="run the simulated OpenAI-compatible engine",
        description="A simulated continuous-batching LLM engine with an OpenAI-compatible API, "
        "vLLM-named /metrics, ground-truth records and fault injection. Presets: " + presets,
    )
    p.add_argument("--host", default="127.0.0.1", metavar="ADDRESS", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, metavar="PORT", help="port (0: pick a free one; default 8000)")
    p.add_argument("--model", "--served-model-name", dest="model", default="sim-model", metavar="NAME",
                   help="served model name (default sim-model)")
    p.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), metavar="NAME",
                   help=f"timing preset: {', '.join(sorted(PRESETS))} (default {DEFAULT_PRESET})")
    p.add_argument("--speedup", type=float, default=1.0, metavar="FACTOR",
                   help="divide every simulated time by FACTOR (default 1: real time)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="generation and fault seed (default 0)")
    p.add_argument("--default-max-tokens", type=int, default=128, metavar="TOKENS",
                   help="max_tokens of a request that sets none (default 128)")
    p.add_argument("--eos-min-tokens", type=int, default=64, metavar="TOKENS",
                   help="a request without ignore_eos ends at a natural EOS drawn per request between "
                   "--eos-min-tokens and --eos-max-tokens output tokens (default 64)")
    p.add_argument("--eos-max-tokens", type=int, default=2048, metavar="TOKENS",
                   help="the high end of that range (default 2048)")
    p.add_argument("--max-model-len", type=int, default=131072, metavar="TOKENS",
                   help="context length; longer prompt + max_tokens get a 400 (default 131072)")
    p.add_argument("--truth-log", metavar="PATH",
                   help="append one JSON line per finished request (default: none)")
    p.add_argument("--debug", action="store_true", help="enable GET /debug/requests and /debug/stats")
    p.add_argument("--fault-rate", type=float, default=0.0, metavar="FRACTION",
                   help="probability, in [0, 1], that a request gets one of --fault-modes (default 0.0; a "
                   "request's own x-servelens-fault header works at any rate)")
    p.add_argument("--fault-modes", default="", metavar="MODE,MODE,...",
                   help="with --fault-rate: the comma-separated modes drawn from (default: all of them): "
                   + ", ".join(FAULT_MODES))
    p.add_argument("--spin-us", type=int, default=1000, metavar="MICROSECONDS",
                   help="spin (yielding) instead of sleeping this long before each step deadline, for "
                   "precise step times (default 1000)")
    p.add_argument("--data-parallel-size", type=int, default=1, metavar="N",
                   help="N independent engine replicas behind this one server, each request to the least "
                   "loaded (vLLM's --data-parallel-size; 1 to 1024; default 1)")
    p.add_argument("--keepalive-timeout", type=float, default=75.0, metavar="SECONDS",
                   help="close idle keep-alive connections after this (default 75, nginx's; vLLM: 5)")
    a = p.add_argument_group("eval items answered from a key (method checks of servelens eval)")
    a.add_argument("--answer-key", metavar="PATH", default=None,
                   help="JSONL answer key (servelens.eval.suites.answer_key writes one): chat requests whose last "
                        "user message is an item get its right or wrong reply (default: none)")
    a.add_argument("--answer-accuracy", type=float, default=1.0, metavar="FRACTION",
                   help="expected share of items answered right, in [0, 1] (default 1.0)")
    a.add_argument("--answer-independence", type=float, default=1.0, metavar="FRACTION",
                   help="share of items whose right/wrong draw is this deployment's own (--seed), not shared "
                        "with other deployments of the same --answer-shared-seed, in [0, 1] (default 1.0)")
    a.add_argument("--answer-shared-seed", type=int, default=0, metavar="N",
                   help="seed of the draws deployments of one model share (default 0)")
    g = p.add_argument_group("timing model (override the preset)")
    default_params = PRESETS[DEFAULT_PRESET].params
    for name, (metavar, text) in _PARAM_HELP.items():
        typ = float if name.endswith("_s") or "_s_per_" in name else int
        g.add_argument("--" + name.replace("_", "-"), type=typ, default=None, metavar=metavar,
                       help=f"{text} (default: the preset's; {getattr(default_params, name):g} in {DEFAULT_PRESET})")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The :class:`SimConfig` for parsed arguments. Raises ValueError for bad values."""
    model_kw = {name: getattr(args, name) for name in ModelParams.__dataclass_fields__}
    return SimConfig.build(
        host=args.host, port=args.port, model=args.model, preset=args.preset, speedup=args.speedup,
        seed=args.seed, default_max_tokens=args.default_max_tokens, eos_min_tokens=args.eos_min_tokens,
        eos_max_tokens=args.eos_max_tokens, max_model_len=args.max_model_len, truth_log=args.truth_log,
        debug=args.debug, fault_rate=args.fault_rate, fault_modes=tuple(sorted(parse_modes(args.fault_modes))),
        spin_us=args.spin_us, data_parallel_size=args.data_parallel_size, keepalive_timeout_s=args.keepalive_timeout,
        answer_key=args.answer_key,
        answer_accuracy=args.answer_accuracy, answer_independence=args.answer_independence,
        answer_shared_seed=args.answer_shared_seed, **model_kw,
    )


async def _serve(config: SimConfig) -> None:
    server = await start_server(config)
    await serve_until_signal("sim", server.url, server.stop)


def run(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM. Returns 0."""
    config = config_from_args(args)
    try:
        import uvloop  # optional speed-up

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(_serve(config))
    sys.stdout.flush()
    return 0
