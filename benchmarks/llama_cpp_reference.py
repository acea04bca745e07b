"""llama.cpp reference (issue 18): what llama-server with SmolLM2-135M-Instruct does on this machine.

Run: python benchmarks/llama_cpp_reference.py [--variants Q4_1,Q3_K_S] [--isl 100,500,1000,2000]
         [--repeats 2] [--decode-tokens 64] [--output out/llama_cpp_reference.json]

Per variant, with :class:`servelens.engines.llama_cpp.LlamaServer` (built on first use):

- start: ``start()`` to ``/health`` 200 (s);
- per ISL (the engine's ``usage.prompt_tokens``, chat template included), --repeats streamed chat
  requests one at a time with cold prompts (fresh random words; the template's 24-token system
  prompt is cached from the second request on), ``max_tokens`` = --decode-tokens, ``ignore_eos``:
  client TTFT (send to the first chunk with content), the engine's ``timings.prompt_ms``, prefill
  rate (``prompt_n / prompt_ms``) and decode rate (``timings.predicted_per_second``);
- four streams at once (one per slot, ~100-token prompts): completion tokens / wall time;
- a repeated 1,000-token prompt: ``cached_tokens`` and ``prompt_ms``, first and second time;
- a greedy answer to one question, to see that the variant still talks.

Prints one JSON document (also written to --output). Figures move with the machine's load: the
load average before and after is recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
from tokenizers import Tokenizer

from servelens.engines.llama_cpp import LlamaServer
from servelens.testing.engines import sse_events

QUESTION = "What is the capital of France? Answer in one sentence."


def cold_prompt(tok: Tokenizer, n_tokens: int, rng: random.Random, words: list[str]) -> str:
    """Random license words, cut to ``n_tokens`` tokens of the model's own tokenizer."""
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids += tok.encode(" ".join(rng.choice(words) for _ in range(200)), add_special_tokens=False).ids
    return str(tok.decode(ids[:n_tokens]))


async def stream(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed chat request: client TTFT (s), wall (s), and the last event's usage/timings."""
    t0 = time.perf_counter()
    ttft = None
    raw = bytearray()
    async with s.post(url + "/v1/chat/completions", json={**body, "stream": True,
                                                           "stream_options": {"include_usage": True}}) as resp:
        resp.raise_for_status()
        async for data in resp.content.iter_any():
            raw += data
            if ttft is None and b'"content":"' in data and b'"content":""' not in data:
                ttft = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    last = json.loads([e for e in sse_events(bytes(raw)) if e != "[DONE]"][-1])
    return {"ttft_s": ttft, "wall_s": wall, "usage": last.get("usage"), "timings": last.get("timings")}


async def measure(srv: LlamaServer, args: argparse.Namespace) -> dict[str, Any]:
    tok = Tokenizer.from_file(str(srv.tokenizer_path))
    words = Path("/usr/share/common-licenses/GPL-3").read_text().split()
    rng = random.Random(0)
    out: dict[str, Any] = {"per_isl": {}}
    base = {"model": srv.model, "max_tokens": args.decode_tokens, "ignore_eos": True}
    # force_close: llama-server closes the connection after a stream despite its keep-alive header
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        for isl in args.isl:
            rows = []
            for _ in range(args.repeats):
                msg = cold_prompt(tok, isl - 30, rng, words)  # the template adds 30 tokens
                r = await stream(s, srv.url, {**base, "messages": [{"role": "user", "content": msg}]})
                t = r["timings"]
                rows.append({"isl": r["usage"]["prompt_tokens"], "cached": r["usage"]["prompt_tokens_details"][
                    "cached_tokens"], "ttft_client_s": r["ttft_s"], "prompt_ms": t["prompt_ms"],
                    "prefill_tok_s": t["prompt_n"] / t["prompt_ms"] * 1e3, "decode_tok_s": t["predicted_per_second"]})
            out["per_isl"][str(isl)] = {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]}
        msgs = [cold_prompt(tok, 70, rng, words) for _ in range(srv.n_slots)]
        t0 = time.perf_counter()
        res = await asyncio.gather(*(stream(s, srv.url, {**base, "messages": [{"role": "user", "content": m}]})
                                     for m in msgs))
        wall = time.perf_counter() - t0
        out["streams"] = {"n": len(msgs), "tok_s_total": round(sum(r["usage"]["completion_tokens"] for r in res)
                                                                 / wall, 1)}
        long = cold_prompt(tok, 1000, rng, words)
        first, second = [await stream(s, srv.url, {**base, "max_tokens": 4,
                                                    "messages": [{"role": "user", "content": long}]})
                         for _ in range(2)]
        out["repeat"] = [{"prompt_tokens": r["usage"]["prompt_tokens"],
                          "cached_tokens": r["usage"]["prompt_tokens_details"]["cached_tokens"],
                          "prompt_ms": round(r["timings"]["prompt_ms"], 1)} for r in (first, second)]
        async with s.post(srv.url + "/v1/chat/completions", json={"model": srv.model, "temperature": 0,
                          "max_tokens": 40, "messages": [{"role": "user", "content": QUESTION}]}) as resp:
            out["answer"] = (await resp.json())["choices"][0]["message"]["content"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="Q4_1,Q3_K_S")
    ap.add_argument("--isl", type=lambda v: [int(x) for x in v.split(",")], default=[100, 500, 1000, 2000])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--output", type=Path, default=Path("out/llama_cpp_reference.json"))
    args = ap.parse_args()
    doc: dict[str, Any] = {"load_before": os.getloadavg(), "variants": {}}
    for variant in args.variants.split(","):
        t0 = time.perf_counter()
        with LlamaServer(variant=variant) as srv:
            start_s = time.perf_counter() - t0
            res = asyncio.run(measure(srv, args))
            t1 = time.perf_counter()
        doc["variants"][variant] = {"start_s": round(start_s, 2), "stop_s": round(time.perf_counter() - t1, 2),
                                    "file_mb": round(srv.model_path.stat().st_size / 1e6, 1), **res}
    doc["load_after"] = os.getloadavg()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
