"""Conformance against a real engine and a real model: llama.cpp's llama-server (built from the
llama-cpp-python 0.3.36 sdist) serving SmolLM2-135M-Instruct (issue 18).

Marker ``llamacpp`` (excluded from the default run; ``.ci/run`` runs it as its own stage):
``python -m pytest -q -m llamacpp tests/engines``. The build is cached per machine by
:mod:`servelens.engines.llama_cpp_build` (~6 min once); one server (Q4_1, 4 slots) serves the module.

What is checked:

- The tokenizer.json made from the GGUF counts exactly as llama-server's ``/tokenize``.
- ``servelens bench`` (a mix of three prompt lengths, one per ISL bucket, 4 at a time) through
  ``servelens gateway`` through a recording tap in front of llama-server, every request tagged by
  the tap (one id joins the bench's record, the gateway's log line and the engine's reply):
  every request succeeds; the gateway's per-bucket counts equal the bench's; its ISL sum equals
  ``llamacpp:prompt_tokens_total`` + ``llamacpp:prompt_tokens_cached_total``, its OSL sum
  ``llamacpp:tokens_predicted_total``, its cached tokens ``llamacpp:prompt_tokens_cached_total``
  (> 0: the chat template's system prompt stays in a slot); per request and per bucket the
  engine's own prefill time (``timings.prompt_ms``) <= the gateway's TTFT <= the bench's.
- One request at a time, the gateway's TTFT is close to the engine's prefill time.
- A repeated prompt hits llama-server's prompt cache: ``cached_tokens`` in the usage, counted by
  the gateway, equal to the engine's ``timings.cache_n`` and its counter.
- An engine that sends no usage at all (the tap drops ``stream_options``, as llama-cpp-python's own
  server ignores them): the gateway with ``--tokenizer`` (the GGUF's) still buckets every request,
  its count low by the chat template's tokens; with ``--chat-template`` (the GGUF's) its count is the
  engine's exactly, next to a boundary and for a conversation.
- A prompt over the slot's context comes back as llama-server's own 400, counted once as an error.
- Streamed requests back to back straight to llama-server all succeed (the gateway resends a request
  that met llama-server's close-after-stream on a reused connection).
- A lower quantization (Q3_K_S) serves next to Q4_1 under its own name and still talks.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from servelens.core.buckets import IslBuckets
from servelens.engines.llama_cpp import LOW_VARIANT, LlamaServer
from servelens.formats.metrics_text import Scrape, parse_scrape
from servelens.formats.results import BenchRecord
from servelens.gateway.requestlog import read_request_log
from servelens.gateway.testing import run_gateway
from servelens.process import ServerProcess
from servelens.testing.engines import (
    Exchange,
    Tap,
    bench_bucket_counts,
    delta,
    gateway_bucket_counts,
    recording_tap,
    run_bench,
    scrape,
    tap_in_thread,
    wait_gateway_counted,
)

pytestmark = pytest.mark.llamacpp

ISL_BUCKETS = "128,256"
BUCKETS = IslBuckets.parse(ISL_BUCKETS)
ISL_MIX = "60:1,170:1,360:1"  # + the template's 30 tokens: about 90, 200 and 390, one per bucket
N_REQUESTS = 12
OSL = 16
WAIT_S = 30.0

PROMPT_TOKENS = "llamacpp:prompt_tokens_total"  # excludes cached tokens
CACHED_TOKENS = "llamacpp:prompt_tokens_cached_total"
PREDICTED_TOKENS = "llamacpp:tokens_predicted_total"


def post_json(url: str, body: dict[str, Any], timeout_s: float = 120.0) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def engine_prompt_tokens(ex: Exchange) -> int:
    """Prompt tokens as the engine counted them, from ``timings`` (present with or without usage)."""
    t = ex.final_event()["timings"]
    return int(t["prompt_n"]) + int(t["cache_n"])


def log_by_id(path: Path) -> dict[str, dict[str, Any]]:
    """The gateway's request log by ``upstream_request_id`` (the tap's id)."""
    return {str(e["upstream_request_id"]): cast(dict[str, Any], e) for e in read_request_log(path)}


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    with LlamaServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def template_tokens(llama: LlamaServer) -> int:
    """Tokens the chat template (with its default system prompt) adds around one user message."""
    prompt = post_json(llama.url + "/apply-template", {"messages": [{"role": "user", "content": "x"}]})["prompt"]
    toks = post_json(llama.url + "/tokenize", {"content": prompt, "add_special": True, "parse_special": True})
    return len(toks["tokens"]) - 1


# ---------------------------------------------------------------- the tokenizer made from the GGUF


def test_gguf_tokenizer_counts_as_llama_server(llama: LlamaServer) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(llama.tokenizer_path))
    licenses = sorted(p for p in Path("/usr/share/common-licenses").iterdir() if p.is_file())[:6]
    texts = [p.read_text(errors="replace")[:4000] for p in licenses] + [
        "<|im_start|>user\nHi 12345, ok?<|im_end|>\n", "naïve café — 東京 🙂 x\t\ty\n\n\n  z",
        "def f(x):\n    return x**2  # 3.14159\n",
    ]  # fmt: skip
    for text in texts:
        ours = tok.encode(text, add_special_tokens=False).ids
        theirs = post_json(llama.url + "/tokenize", {"content": text, "add_special": False, "parse_special": True})
        assert ours == theirs["tokens"], text[:60]


# ---------------------------------------------------------------- bench through the gateway


@dataclass(frozen=True)
class BenchRun:
    """One bench run through gateway and tap, and the scrapes around it. ``probe`` is the gateway's
    log line of the bench's one-token probe request (sent before the run; not in ``records``)."""

    records: tuple[BenchRecord, ...]
    gw_log: tuple[dict[str, Any], ...]
    probe: dict[str, Any]
    engine: dict[str, Exchange]
    gw_before: Scrape
    gw_after: Scrape
    llama_before: Scrape
    llama_after: Scrape
    wall_s: float


@pytest.fixture(scope="module")
def bench_run(llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> BenchRun:
    out = tmp_path_factory.mktemp("llama-bench")
    gw_log_path = out / "gateway-requests.jsonl"
    with tap_in_thread(llama.url, tag_requests=True) as tap, ServerProcess(
        ["gateway", "--upstream", tap.url, "--isl-buckets", ISL_BUCKETS, "--request-log", str(gw_log_path)],
        log_path=out / "gateway.log",
    ) as gw:
        l0, g0 = scrape(llama.url), scrape(gw.url)
        records, wall_s = run_bench(gw.url, [
            "--isl", ISL_MIX, "--osl", str(OSL), "--num-requests", str(N_REQUESTS), "--concurrency",
            str(llama.n_slots), "--seed", "1", "--tokenizer", str(llama.tokenizer_path), "--max-context",
            str(llama.bench_max_context), "--isl-buckets", ISL_BUCKETS,
        ], out, timeout_s=600)  # fmt: skip
        assert len(records) == N_REQUESTS
        g1 = wait_gateway_counted(gw.url, g0, N_REQUESTS + 1, WAIT_S)
        gw_log = tuple(read_request_log(gw_log_path))
        probes = [e for e in gw_log if e["osl"] == 1]
        assert len(gw_log) == N_REQUESTS + 1 and len(probes) == 1, gw_log
        run = BenchRun(records, gw_log, probes[0], tap.by_id(), g0, g1, l0, scrape(llama.url), wall_s)
    _write_figures(llama, run)
    return run


def _joined(run: BenchRun) -> list[tuple[BenchRecord, dict[str, Any], Exchange]]:
    """(bench record, gateway log line, engine exchange) per bench request, joined on the tap's id."""
    gw = {e["upstream_request_id"]: e for e in run.gw_log}
    out = []
    for r in run.records:
        assert r.request_id is not None and r.request_id.startswith("tap-"), "the gateway relays x-request-id"
        out.append((r, gw[r.request_id], run.engine[r.request_id]))
    return out


def _write_figures(llama: LlamaServer, run: BenchRun) -> None:
    """Per-bucket TTFT (bench, gateway) against the engine's prefill, for docs/llama-cpp.md."""
    per_bucket: dict[str, dict[str, Any]] = {}
    for r, g, ex in _joined(run):
        t = ex.final_event()["timings"]
        b = per_bucket.setdefault(g["bucket"], {"n": 0, "isl": 0, "cached": 0, "prompt_ms": 0.0, "gateway_ttft_ms": 0.0,
                                                "bench_ttft_ms": 0.0, "decode_tok_s": []})  # fmt: skip
        b["n"] += 1
        b["isl"] += g["isl"]
        b["cached"] += g["cached_tokens"] or 0
        b["prompt_ms"] += t["prompt_ms"]
        b["gateway_ttft_ms"] += g["ttft_s"] * 1e3
        b["bench_ttft_ms"] += (r.ttft_s or 0.0) * 1e3
        b["decode_tok_s"].append(t["predicted_per_second"])
    figures = {
        "requests": len(run.records), "bench_wall_s": round(run.wall_s, 1), "slots": llama.n_slots,
        "per_bucket_mean": {
            k: {"n": v["n"], "isl": round(v["isl"] / v["n"]), "cached": round(v["cached"] / v["n"]),
                "engine_prompt_ms": round(v["prompt_ms"] / v["n"], 1),
                "gateway_ttft_ms": round(v["gateway_ttft_ms"] / v["n"], 1),
                "bench_ttft_ms": round(v["bench_ttft_ms"] / v["n"], 1),
                "engine_decode_tok_s": round(sum(v["decode_tok_s"]) / v["n"], 1)}
            for k, v in sorted(per_bucket.items())
        },
    }  # fmt: skip
    path = llama.paths.scratch / "llama-conformance-figures.json"
    path.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    print(f"\nllama.cpp conformance figures ({path}): {json.dumps(figures)}")


def test_every_request_succeeds(bench_run: BenchRun) -> None:
    assert not [(r.index, r.http_status, r.error) for r in bench_run.records if not r.ok]
    assert all(r.osl == r.osl_target == OSL for r in bench_run.records), "ignore_eos: output length is the target"
    assert delta(bench_run.gw_after, bench_run.gw_before, "servelens_requests_total", {"status": "success"}) == (
        N_REQUESTS + 1
    )
    assert all(e["status"] == "success" for e in bench_run.gw_log)


def test_gateway_buckets_equal_bench_buckets(bench_run: BenchRun) -> None:
    bench_counts = bench_bucket_counts(bench_run.records, BUCKETS, [bench_run.probe["isl"]])  # with the probe
    assert gateway_bucket_counts(bench_run.gw_after, bench_run.gw_before, BUCKETS) == bench_counts
    assert len(bench_counts) == 3, "the mix spans every bucket"


def test_token_counts_equal_llamacpp_counters(bench_run: BenchRun) -> None:
    ga, gb, la, lb = bench_run.gw_after, bench_run.gw_before, bench_run.llama_after, bench_run.llama_before
    isl_gw = delta(ga, gb, "servelens_input_sequence_tokens_sum")
    assert delta(ga, gb, "servelens_input_sequence_tokens_count") == N_REQUESTS + 1
    assert isl_gw == delta(la, lb, PROMPT_TOKENS) + delta(la, lb, CACHED_TOKENS)
    assert isl_gw == bench_run.probe["isl"] + sum(r.isl_server or 0 for r in bench_run.records)
    assert delta(ga, gb, "servelens_output_sequence_tokens_sum") == delta(la, lb, PREDICTED_TOKENS) == (
        N_REQUESTS * OSL + 1
    )
    cached = delta(la, lb, CACHED_TOKENS)
    assert cached > 0, "the template's system prompt stays cached in a slot"
    assert delta(ga, gb, "servelens_cached_tokens_sum") == cached
    assert all(e["cached_tokens"] is not None for e in bench_run.gw_log), "llama-server always reports cached_tokens"
    assert la.value("llamacpp:requests_processing") == 0


def test_ttft_between_engine_prefill_and_client(bench_run: BenchRun) -> None:
    """Per request: the engine's prefill (``timings.prompt_ms``) lies inside the gateway's TTFT
    (arrival to first output chunk), which lies inside the bench's (send to first chunk); so do the
    per-bucket sums. The engine's usage equals the gateway's ISL and cached tokens, request by request."""
    sums: dict[str, list[float]] = {}
    for r, g, ex in _joined(bench_run):
        ev = ex.final_event()
        prompt_s = ev["timings"]["prompt_ms"] / 1e3
        assert r.ttft_s is not None and g["ttft_s"] is not None
        assert prompt_s <= g["ttft_s"] <= r.ttft_s, (prompt_s, g["ttft_s"], r.ttft_s)
        assert ev["usage"]["prompt_tokens"] == g["isl"] == engine_prompt_tokens(ex)
        assert ev["usage"]["prompt_tokens_details"]["cached_tokens"] == g["cached_tokens"] == ev["timings"]["cache_n"]
        s = sums.setdefault(g["bucket"], [0.0, 0.0, 0.0])
        s[0] += prompt_s
        s[1] += g["ttft_s"]
        s[2] += r.ttft_s
    gw_by_bucket = {
        label: delta(bench_run.gw_after, bench_run.gw_before, "servelens_time_to_first_token_by_isl_seconds_sum",
                     {"isl_bucket": label})
        for label in sums
    }  # fmt: skip
    for label, (engine_s, gw_s, bench_s) in sums.items():
        assert engine_s <= gw_s <= bench_s, label
        # the gateway's by-bucket histogram holds the same sums (plus the probe in its bucket)
        probe = bench_run.probe["ttft_s"] if BUCKETS.label(bench_run.probe["isl"]) == label else 0.0
        assert gw_by_bucket[label] == pytest.approx(gw_s + probe, rel=1e-6, abs=1e-6), label


# ---------------------------------------------------------------- one request at a time


async def _stream(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with s.post(url + "/v1/chat/completions", json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


def _prompt(n_words: int, seed: int) -> str:
    words = Path("/usr/share/common-licenses/GPL-3").read_text().split()
    return " ".join(words[(seed * 997 + i * 7) % len(words)] for i in range(n_words))


async def test_sequential_gateway_ttft_is_close_to_engine_prefill(llama: LlamaServer, tmp_path: Path) -> None:
    """Alone on the engine a request waits for no slot and no other prompt: the gateway's TTFT holds
    the engine's prefill and is held by the client's whole exchange (definitions, whatever the load;
    how close the TTFT comes to the prefill is a figure, printed here and kept in docs/llama-cpp.md)."""
    walls: list[float] = []
    async with recording_tap(llama.url, tag_requests=True) as tap, run_gateway(
        tap.url, isl_buckets=ISL_BUCKETS, request_log=str(tmp_path / "log.jsonl")
    ) as gw, aiohttp.ClientSession() as s:
        for i, n_words in enumerate((40, 150, 300)):
            body = {"model": llama.model, "messages": [{"role": "user", "content": _prompt(n_words, i)}],
                    "max_tokens": 4, "ignore_eos": True}  # fmt: skip
            t0 = time.monotonic()
            await _stream(s, gw.url, body)
            walls.append(time.monotonic() - t0)
        await gw.gateway.wait_finished(3, timeout=WAIT_S)
    log = log_by_id(tmp_path / "log.jsonl")
    gaps = []
    # one request at a time: the tap saw them in the order they were sent
    for (rid, ex), wall_s in zip(tap.by_id().items(), walls, strict=True):
        prompt_s, ttft_s = ex.final_event()["timings"]["prompt_ms"] / 1e3, log[rid]["ttft_s"]
        gaps.append((round(prompt_s, 4), round(ttft_s, 4), round(wall_s, 4)))
        # (0.5 ms: two clocks read in two processes)
        assert prompt_s <= ttft_s <= wall_s + 0.0005, gaps
    assert len(gaps) == 3
    print(f"\n(engine prompt_ms, gateway TTFT, client's whole exchange) one at a time, s: {gaps}")


async def test_repeated_prompt_hits_the_prompt_cache(llama: LlamaServer) -> None:
    text = _prompt(400, 7)
    body = {"model": llama.model, "messages": [{"role": "user", "content": text}], "max_tokens": 4,
            "ignore_eos": True}  # fmt: skip
    l0 = scrape(llama.url)
    async with recording_tap(llama.url) as tap, run_gateway(tap.url, isl_buckets=ISL_BUCKETS) as gw, \
            aiohttp.ClientSession() as s:  # fmt: skip
        await _stream(s, gw.url, body)
        await _stream(s, gw.url, body)
        await gw.gateway.wait_finished(2, timeout=WAIT_S)
        g = parse_scrape(gw.metrics.exposition().decode())
    first, second = (ex.final_event() for ex in tap.exchanges)
    n = first["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens"] == n > 400
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == second["timings"]["cache_n"] and second["timings"]["prompt_n"] == n - cached
    assert n - 4 <= cached < n, "all but the last token(s) come from the cache (one is evaluated again)"
    assert second["timings"]["prompt_ms"] < first["timings"]["prompt_ms"]
    c0 = first["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert g.value("servelens_cached_tokens_sum") == c0 + cached == delta(scrape(llama.url), l0, CACHED_TOKENS)


# ---------------------------------------------------------------- an engine that sends no usage


async def _no_usage_run(llama: LlamaServer, tmp_path: Path, prompts: list[str], **gateway: Any) -> tuple[
        Tap, dict[str, dict[str, Any]], Scrape]:  # fmt: skip
    """Each prompt once through the gateway to a tap that drops ``stream_options`` (no usage)."""
    log_path = tmp_path / f"log-{len(list(tmp_path.iterdir()))}.jsonl"
    async with recording_tap(llama.url, tag_requests=True, drop_stream_options=True) as tap, run_gateway(
        tap.url, isl_buckets=ISL_BUCKETS, request_log=str(log_path), **gateway
    ) as gw, aiohttp.ClientSession() as s:
        for text in prompts:
            body = {"model": llama.model, "messages": [{"role": "user", "content": text}], "max_tokens": 4,
                    "ignore_eos": True}  # fmt: skip
            await _stream(s, gw.url, body)
        await gw.gateway.wait_finished(len(prompts), timeout=WAIT_S)
        g = parse_scrape(gw.metrics.exposition().decode())
    for ex in tap.exchanges:
        assert b'"usage"' not in ex.body, "the engine sent no usage"
    return tap, log_by_id(log_path), g


async def test_no_usage_engine_is_bucketed_by_the_gguf_tokenizer(
    llama: LlamaServer, template_tokens: int, tmp_path: Path
) -> None:
    """Without usage the gateway counts the prompt with the tokenizer made from the GGUF: exactly
    the engine's count less the chat template's tokens, so every prompt clear of a boundary by
    more than that lands in the engine's own bucket."""
    prompts = [_prompt(n, i) for i, n in enumerate((30, 130, 300))]
    tap, log, g = await _no_usage_run(llama, tmp_path, prompts, tokenizer=str(llama.tokenizer_path))
    assert template_tokens == 30
    for rid, ex in tap.by_id().items():
        e, engine_isl = log[rid], engine_prompt_tokens(ex)
        assert e["isl_source"] == "tokenizer"
        assert e["isl"] + template_tokens == engine_isl
        assert e["bucket"] == BUCKETS.label(engine_isl)
    labels = {e["bucket"] for e in log.values()}
    assert len(labels) == 3
    assert sum(g.value("servelens_request_duration_by_isl_seconds_count", {"isl_bucket": b})
               for b in BUCKETS.labels) == 3  # fmt: skip


async def test_no_usage_engine_without_a_tokenizer_has_no_bucket(llama: LlamaServer, tmp_path: Path) -> None:
    """Without usage and without ``--tokenizer`` the request is counted, but in no bucket."""
    _tap, log, g = await _no_usage_run(llama, tmp_path, [_prompt(50, 1)])
    (e,) = log.values()
    assert e["status"] == "success" and e["isl"] is None and e["bucket"] is None
    assert g.value("servelens_requests_total", {"status": "success"}) == 1
    assert sum(g.value("servelens_request_duration_by_isl_seconds_count", {"isl_bucket": b})
               for b in BUCKETS.labels) == 0  # fmt: skip


async def test_no_usage_engine_bucket_is_exact_next_to_a_boundary_with_the_chat_template(
    llama: LlamaServer, template_tokens: int, tmp_path: Path
) -> None:
    """A prompt whose text is just under a boundary and whose templated prompt is over it: without the
    chat template the gateway's count is the text's (the bucket below: the documented bound, the
    template's tokens); with ``--chat-template`` (the GGUF's, as llama-server renders it with
    ``--jinja``) it is the engine's count exactly, so the engine's bucket; a conversation of several
    messages too."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(llama.tokenizer_path))
    words = _prompt(200, 3).split()
    text = next(" ".join(words[:k]) for k in range(len(words), 0, -1)
                if len(tok.encode(" ".join(words[:k]), add_special_tokens=False).ids) <= 120)  # fmt: skip
    _tap, log, _g = await _no_usage_run(llama, tmp_path, [text], tokenizer=str(llama.tokenizer_path))
    (e,) = log.values()
    assert e["isl"] <= 128 < e["isl"] + template_tokens  # the case is real: only the templated prompt is over 128
    assert e["bucket"] == "0-128", "without the template: the text's count, the bucket below"
    tap, log, _g = await _no_usage_run(llama, tmp_path, [text, _prompt(40, 5)], tokenizer=str(llama.tokenizer_path),
                                       chat_template=str(llama.chat_template_path))  # fmt: skip
    for rid, ex in tap.by_id().items():
        assert log[rid]["isl"] == engine_prompt_tokens(ex), "the rendered prompt: the engine's own count"
        assert log[rid]["bucket"] == BUCKETS.label(engine_prompt_tokens(ex))
    assert {e["bucket"] for e in log.values()} == {"0-128", "129-256"}


async def test_chat_template_count_equals_the_engine_for_a_conversation(llama: LlamaServer, tmp_path: Path) -> None:
    """System prompt, turns of user and assistant: the gateway's templated count is the engine's."""
    messages = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": _prompt(30, 1)},
                {"role": "assistant", "content": "Fine."}, {"role": "user", "content": _prompt(50, 2)}]  # fmt: skip
    async with recording_tap(llama.url, tag_requests=True, drop_stream_options=True) as tap, run_gateway(
        tap.url, isl_buckets=ISL_BUCKETS, request_log=str(tmp_path / "log.jsonl"),
        tokenizer=str(llama.tokenizer_path), chat_template=str(llama.chat_template_path),
    ) as gw, aiohttp.ClientSession() as s:
        await _stream(s, gw.url, {"model": llama.model, "messages": messages, "max_tokens": 2})
        await gw.gateway.wait_finished(1, timeout=WAIT_S)
    ((rid, ex),) = tap.by_id().items()
    assert log_by_id(tmp_path / "log.jsonl")[rid]["isl"] == engine_prompt_tokens(ex)


async def test_back_to_back_streams_through_the_gateway_all_succeed(llama: LlamaServer) -> None:
    """Streamed requests one right after another, gateway straight in front of llama-server, which
    closes its connection after every stream although its headers say keep-alive (its chunked
    provider returns false after done()): a request that met that close on a reused connection is
    resent on a fresh one (gateway/upstream.py), counted in ``servelens_gateway_upstream_retries_total``."""
    statuses = []
    async with run_gateway(llama.url, isl_buckets=ISL_BUCKETS) as gw, aiohttp.ClientSession() as s:
        for i in range(40):
            body = {"model": llama.model, "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 2,
                    "stream": True}  # fmt: skip
            async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                statuses.append(resp.status)
        await gw.gateway.wait_finished(40, timeout=WAIT_S)
        retries = gw.gateway.upstream_retries
        g = parse_scrape(gw.metrics.exposition().decode())
    assert statuses.count(200) == 40, f"{statuses.count(502)} of 40 got 502"
    assert g.value("servelens_requests_total", {"status": "success"}) == 40, "each counted once"
    print(f"\nresent on a fresh connection: {retries} of 40")


# ---------------------------------------------------------------- errors and variants


async def test_over_context_prompt_is_llama_servers_400_counted_once(llama: LlamaServer) -> None:
    body = {"model": llama.model, "messages": [{"role": "user", "content": "word " * (llama.max_model_len + 500)}],
            "max_tokens": 4, "stream": True}  # fmt: skip
    async with aiohttp.ClientSession() as s:
        async with s.post(llama.url + "/v1/chat/completions", json=body) as resp:
            direct_status, direct = resp.status, await resp.json(content_type=None)
        async with run_gateway(llama.url, isl_buckets=ISL_BUCKETS) as gw:
            async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
                status, got = resp.status, await resp.json(content_type=None)
            await gw.gateway.wait_finished(1, timeout=WAIT_S)
            g = parse_scrape(gw.metrics.exposition().decode())
    assert direct_status == 400 and direct["error"]["type"] == "exceed_context_size_error"
    assert (status, got) == (direct_status, direct), "llama-server's own error object, unchanged"
    assert g.value("servelens_requests_total") == 1
    assert g.value("servelens_requests_total", {"status": "error"}) == 1
    assert g.value("servelens_time_to_first_token_seconds_count") == 0


def test_lower_quantization_serves_beside_q4_1(llama: LlamaServer) -> None:
    """Two deployments that differ only in weight precision, side by side (what ``servelens eval``
    compares): each under its own name, each answering the same question in words."""
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 24,
            "temperature": 0}  # fmt: skip
    with LlamaServer(variant=LOW_VARIANT, n_slots=1) as low:
        assert low.model != llama.model and low.model_path.stat().st_size < llama.model_path.stat().st_size
        with urllib.request.urlopen(low.url + "/v1/models", timeout=10) as resp:
            models = json.loads(resp.read())
        assert [m["id"] for m in models["data"]] == [low.model]
        for srv in (llama, low):
            reply = post_json(srv.url + "/v1/chat/completions", {"model": srv.model, **body})
            text = reply["choices"][0]["message"]["content"]
            assert reply["model"] == srv.model and len(text.split()) >= 3, (srv.variant, text)


def test_harness_paths(llama: LlamaServer) -> None:
    """Build and models live in the machine's cache (keyed by version); logs in the scratch folder."""
    p = llama.paths
    for path in (p.server_bin, p.quantize_bin, llama.model_path, llama.tokenizer_path):
        assert path.is_file() and path.is_relative_to(p.build_dir)
    assert "0.3.36" in p.build_dir.name
    assert llama.log_path is not None and llama.log_path.is_relative_to(p.scratch)
