"""``servelens eval`` on a real model and a real engine: llama.cpp's llama-server with SmolLM2-135M-Instruct,
two deployments that differ only in weight precision (Q4_1 as shipped, and a lower quantization),
plus a rerun of Q4_1 (the self-comparison).

Needs the llama.cpp harness (:mod:`servelens.engines.llama_cpp`; it builds llama.cpp once per machine).
Each deployment is served alone (one llama-server at a time, 4 slots), every suite at temperature 0:

    python benchmarks/eval_llama.py --out .scratch/eval-llama

``--bfcl-limit N`` adds N BFCL multi-turn conversations per deployment (the servers then use the
harness's tools template, :data:`~servelens.engines.llama_cpp.TOOLS_TEMPLATE`).

Writes ``OUT/<deployment>/<suite>/`` (records, summary, cache: a second invocation costs nothing),
``OUT/compare-*.json`` and ``.html``, and prints the compare tables and the timings.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console

from servelens.eval.compare import compare_dirs
from servelens.eval.report import notes, rich_table, to_json, write_html
from servelens.eval.runner import EvalConfig, run_eval_sync


def suites(args: argparse.Namespace, first: bool) -> list[dict[str, Any]]:
    """The cuts run on a deployment: MGSM and MMLU on every one; GSM8K (replies for the lm-eval peer
    check, benchmarks/eval_lmeval_peer.py) on the first only."""
    groups = tuple(args.mgsm_groups.split(","))
    out: list[dict[str, Any]] = [
        {"suite": "mgsm", "groups": groups, "limit": args.mgsm_limit, "max_tokens": args.math_tokens},
        {"suite": "mmlu", "limit": args.mmlu_limit, "shots": args.shots, "max_tokens": 16},
    ]
    if first:
        out.append({"suite": "gsm8k", "limit": args.gsm8k_limit, "max_tokens": args.math_tokens})
    if args.bfcl_limit:
        out.append({"suite": "bfcl", "limit": args.bfcl_limit, "max_tokens": args.bfcl_tokens, "max_steps": 2})
    return out


def previous_port(out: Path) -> int:
    """The port a deployment was served on before (from its summaries), else 0 (a free one): the
    response cache is keyed by the endpoint URL, so the same deployment must come back at the same
    address for a second invocation to be answered from the cache."""
    for summary in sorted(out.glob("*/summary.json")):
        port = urlsplit(json.loads(summary.read_text())["url"]).port
        if port:
            return port
    return 0


def run_deployment(variant: str, out: Path, args: argparse.Namespace, first: bool,
                   only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Serve ``variant``, run the suites (``only`` these, when given) into ``out``; timings per suite."""
    from servelens.engines.llama_cpp import TOOLS_TEMPLATE, LlamaServer

    timings: dict[str, Any] = {}
    t0 = time.perf_counter()
    # BFCL needs tools in the prompt: SmolLM2's own template has none (llama-server drops them); the
    # tools template renders every request without tools exactly as the GGUF's template does
    template = TOOLS_TEMPLATE if args.bfcl_limit else None
    with LlamaServer(variant=variant, port=previous_port(out), chat_template_file=template) as srv:
        timings["start_s"] = time.perf_counter() - t0
        for spec in suites(args, first):
            if only is not None and spec["suite"] not in only:
                continue
            t1 = time.perf_counter()
            res = run_eval_sync(EvalConfig(url=srv.url, model=srv.model, output_dir=str(out), temperature=0.0,
                                           concurrency=4, progress=True, **spec))
            s = res.summary
            timings[spec["suite"]] = {
                "wall_s": time.perf_counter() - t1, "items": s["items"], "mean": s["mean"],
                "requests_sent": s["requests_sent"], "extraction_failures": s["extraction_failures"],
                "completion_tokens": s["fresh_completion_tokens"],
                "output_tokens_per_s": s["output_tokens_per_s_during_eval"],
            }
            print(f"{variant} {spec['suite']}: {json.dumps(timings[spec['suite']])}", flush=True)
    return timings


def main() -> None:
    from servelens.engines.llama_cpp import LOW_VARIANT, SOURCE_VARIANT

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(".scratch/eval-llama"))
    ap.add_argument("--low", default=LOW_VARIANT, help=f"the lower quantization (default {LOW_VARIANT})")
    ap.add_argument("--mgsm-groups", default="en,de,fr,es,zh")
    ap.add_argument("--mgsm-limit", type=int, default=20)
    ap.add_argument("--mmlu-limit", type=int, default=20)
    ap.add_argument("--gsm8k-limit", type=int, default=50)
    ap.add_argument("--shots", type=int, default=3)
    ap.add_argument("--math-tokens", type=int, default=200)
    ap.add_argument("--rerun-suites", default="mgsm,mmlu", help="the suites of the self-comparison rerun")
    ap.add_argument("--bfcl-limit", type=int, default=0,
                    help="BFCL multi-turn: this many conversations per deployment (default 0: not run; every "
                    "request carries ~4,600 prompt tokens of tool schemas), served with the tools template")
    ap.add_argument("--bfcl-tokens", type=int, default=96, help="BFCL reply budget (default 96)")
    args = ap.parse_args()
    # the rerun of A has its own folder, so its own cache: its first invocation asks the engine afresh
    plan = [(SOURCE_VARIANT, "a"), (SOURCE_VARIANT, "a-rerun"), (args.low, "b")]
    timings = {}
    for variant, name in plan:
        only = tuple(args.rerun_suites.split(",")) if name == "a-rerun" else None
        timings[name] = {"variant": variant,
                         **run_deployment(variant, args.out / name, args, first=name == "a", only=only)}
    (args.out / "timings.json").write_text(json.dumps(timings, indent=2))
    console = Console(width=160)
    for other, label in (("a-rerun", "self"), ("b", "quant")):
        c = compare_dirs(args.out / "a", args.out / other)
        (args.out / f"compare-{label}.json").write_text(to_json(c))
        write_html(args.out / f"compare-{label}.html", c)
        console.print(rich_table(c))
        for line in notes(c):
            console.print(line, highlight=False)


if __name__ == "__main__":
    main()
