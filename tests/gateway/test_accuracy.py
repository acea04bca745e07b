"""TTFT at 64 concurrent streams, by definition: the gateway's per-request TTFT (request log) against
the sim's ground truth (truth log), joined by the sim's ``x-request-id``.

The sim and the gateway each run as their own process, as in production and in
``benchmarks/gateway_accuracy.py`` (an in-process gateway would share this client's event loop);
``time.perf_counter_ns()`` is CLOCK_MONOTONIC, shared by the processes of the machine. What is asserted
holds on a busy machine: the gateway's clock starts before the engine's and stops after the engine
emitted the first token (a role-only chunk taken as the first token fails this: it is sent before
prefill), and the chunk that stopped it is the first token's, not a later one: the gateway's first
output time is its first output chunk's arrival (``--request-log-chunks``), and it counted one output
chunk per token the engine generated. How close the two clocks are (a few milliseconds at p99), and how
many first outputs a busy machine delays past the engine's second token, are figures, measured in
``benchmarks/gateway_accuracy.py`` (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import aiohttp
import numpy as np

from servelens.gateway.requestlog import read_request_log
from servelens.process import ServerProcess

CONCURRENCY = 64
REQUESTS = 128
ITL_S = 0.1  # the sim's decode step: a token late would add a whole step


def _logged(log: Path) -> int:
    return len(log.read_bytes().splitlines()) if log.exists() else 0


async def _wait_logged(log: Path, n: int, timeout_s: float = 10.0) -> None:
    """Until the gateway's request log holds ``n`` entries (it writes one as each request ends)."""
    deadline = time.monotonic() + timeout_s
    while _logged(log) < n:
        assert time.monotonic() < deadline, f"the request log has {_logged(log)} of {n} entries"
        await asyncio.sleep(0.01)  # polling a condition with a deadline, not a timed wait


async def _measure(gw_url: str, log: Path, attempt: int) -> None:
    """One wave of REQUESTS streams, CONCURRENCY at a time, ids ``acc{attempt}-{i}``."""
    rng = random.Random(attempt)
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int, s: aiohttp.ClientSession) -> None:
        # arrival pacing (not a wait for a condition): the first wave arrives over 0.3 s
        # instead of as one 64-request burst that queues inside the engine's own loop
        await asyncio.sleep(min(i, CONCURRENCY) * 0.005)
        body = {"model": "sim-model", "max_tokens": rng.randint(3, 8), "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": f"q{i} " + "lorem ipsum " * rng.randint(5, 600)}]}
        async with sem, s.post(gw_url + "/v1/chat/completions", json=body,
                               headers={"x-request-id": f"acc{attempt}-{i}"}) as r:
            assert r.status == 200
            async for _ in r.content.iter_any():
                pass

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(one(i, s) for i in range(REQUESTS)))
    await _wait_logged(log, REQUESTS * (attempt + 1))


async def test_ttft_starts_before_and_stops_on_the_engines_first_token_at_64_streams(tmp_path: Path) -> None:
    """Every request: the gateway's TTFT is longer than the engine's (its clock starts first and stops
    after the first token was emitted); most requests: it stops before the engine's second token."""
    truth_path = tmp_path / "truth.jsonl"
    log = tmp_path / "requests.jsonl"
    with ServerProcess(["sim", "--truth-log", str(truth_path), "--decode-base-s", str(ITL_S)]) as sim, \
            ServerProcess(["gateway", "--upstream", sim.url, "--request-log", str(log), "--request-log-chunks"]) as gw:
        await _measure(gw.url, log, 0)
    truth = {r["request_id"]: r for r in map(json.loads, truth_path.read_text().splitlines())}
    diffs: list[float] = []
    late = 0
    for e in read_request_log(log):
        rec = truth[str(e["upstream_request_id"])]
        assert e["status"] == "success" and rec["outcome"] == "ok"
        times = rec["token_times_ns"]
        assert len(times) >= 3 and times[1] - times[0] >= ITL_S * 1e9 / 2
        assert int(e["arrival_ns"]) < rec["arrival_ns"]  # type: ignore[call-overload]
        first_ns = int(e["first_output_ns"])  # type: ignore[call-overload]
        assert first_ns > rec["first_token_ns"]
        # the clock stopped on the first output chunk, and every token came in a chunk of its own
        offsets, tokens = e["chunk_offsets_ns"], e["chunk_tokens"]
        assert isinstance(offsets, list) and isinstance(tokens, list)
        assert first_ns == int(e["arrival_ns"]) + offsets[0]  # type: ignore[call-overload]
        assert e["output_chunks"] == len(offsets) == len(times) == rec["osl"] and sum(tokens) == rec["osl"]
        late += first_ns >= times[1]  # a figure: a stall of this machine delays a request by a decode step
        diffs.append(float(e["ttft_s"]) * 1e3 - (rec["first_token_ns"] - rec["arrival_ns"]) / 1e6)  # type: ignore[arg-type]
    assert len(diffs) == REQUESTS
    assert min(diffs) > 0
    p50, p99 = np.percentile(diffs, [50, 99])
    print(f"{late} of {REQUESTS} first outputs after the engine's second token; TTFT difference p50 {p50:.1f} ms, "
          f"p99 {p99:.1f} ms")
