"""TTFT accuracy at 64 concurrent streams: the gateway's per-request TTFT (request log) against the
sim's ground truth (truth log), joined by the sim's ``x-request-id``.

The sim runs as its own process (its step loop and its 64 writers do not share our event loop);
``time.perf_counter_ns()`` is CLOCK_MONOTONIC, shared by the processes of the machine. The exact
figures, from ``benchmarks/gateway_accuracy.py``, are in docs/benchmarks.md (p99 of a few ms on an
idle machine; tens of ms when the 2 cores are oversubscribed, for a direct client just as much).
The bounds here are loose enough for a shared CI machine yet catch a wrong definition: the role-only
chunk taken as first token gives a negative difference (it is sent before prefill); a token late
adds a whole decode step (100 ms here) to every request.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import aiohttp
import numpy as np

from servelens.gateway.requestlog import read_request_log
from servelens.gateway.testing import run_gateway
from servelens.process import ServerProcess

CONCURRENCY = 64
REQUESTS = 128
ITL_S = 0.1  # the sim's decode step: a token late would add a whole step


async def test_ttft_matches_sim_truth_at_64_streams(tmp_path: Path) -> None:
    truth_path = tmp_path / "truth.jsonl"
    log = tmp_path / "requests.jsonl"
    rng = random.Random(7)
    with ServerProcess(["sim", "--truth-log", str(truth_path), "--decode-base-s", str(ITL_S)]) as sim:
        async with run_gateway(sim.url, request_log=str(log)) as gw:
            sem = asyncio.Semaphore(CONCURRENCY)

            async def one(i: int, s: aiohttp.ClientSession) -> None:
                # arrival pacing (not a wait for a condition): the first wave arrives over 0.3 s
                # instead of as one 64-request burst that queues inside the engine's own loop
                await asyncio.sleep(min(i, CONCURRENCY) * 0.005)
                body = {"model": "sim-model", "max_tokens": rng.randint(3, 8), "ignore_eos": True, "stream": True,
                        "messages": [{"role": "user", "content": f"q{i} " + "lorem ipsum " * rng.randint(5, 600)}]}
                async with sem, s.post(gw.url + "/v1/chat/completions", json=body,
                                       headers={"x-request-id": f"acc-{i}"}) as r:
                    assert r.status == 200
                    async for _ in r.content.iter_any():
                        pass

            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                await asyncio.gather(*(one(i, s) for i in range(REQUESTS)))
            await gw.gateway.wait_finished(REQUESTS)
    truth = {r["request_id"]: r for r in map(json.loads, truth_path.read_text().splitlines())}
    diffs = []
    for e in read_request_log(log):
        rec = truth[str(e["upstream_request_id"])]
        assert e["status"] == "success" and rec["outcome"] == "ok"
        engine_ttft_ms = (rec["first_token_ns"] - rec["arrival_ns"]) / 1e6
        diffs.append(float(e["ttft_s"]) * 1e3 - engine_ttft_ms)  # type: ignore[arg-type]
    d = np.asarray(diffs)
    assert len(d) == REQUESTS
    assert d.min() > 0  # the gateway's clock starts before the engine's and stops after it
    assert np.percentile(d, 50) < 20.0, np.percentile(d, [50, 90, 99])
    # p90, not p99: a definition error shifts every request, while a stall of this shared machine
    # (seconds, seen for direct clients too) hits a few; the p99 figure is in docs/benchmarks.md
    assert np.percentile(d, 90) < ITL_S * 1e3, np.percentile(d, [50, 90, 99])
