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
from typing import Any

import aiohttp
import numpy as np

from servelens.gateway.requestlog import read_request_log
from servelens.gateway.testing import run_gateway
from servelens.process import ServerProcess

CONCURRENCY = 64
REQUESTS = 128
ITL_S = 0.1  # the sim's decode step: a token late would add a whole step


ATTEMPTS = 3


async def _measure(gw_url: str, wait: Any, attempt: int) -> None:
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
    await wait(REQUESTS * (attempt + 1))


async def test_ttft_matches_sim_truth_at_64_streams(tmp_path: Path) -> None:
    """Every difference is positive (hard); p50 < 20 ms and p90 < one decode step in at least one of
    three waves: a definition error shifts every request of every wave, while the multi-second
    stalls this shared machine shows now and then (direct clients suffer them too) spoil one wave."""
    truth_path = tmp_path / "truth.jsonl"
    log = tmp_path / "requests.jsonl"
    seen: list[list[float]] = []
    with ServerProcess(["sim", "--truth-log", str(truth_path), "--decode-base-s", str(ITL_S)]) as sim:
        async with run_gateway(sim.url, request_log=str(log)) as gw:
            for attempt in range(ATTEMPTS):
                await _measure(gw.url, gw.gateway.wait_finished, attempt)
                truth = {r["request_id"]: r for r in map(json.loads, truth_path.read_text().splitlines())}
                diffs = []
                for e in read_request_log(log):
                    rid = str(e["upstream_request_id"])
                    if not rid.startswith(f"acc{attempt}-"):
                        continue
                    rec = truth[rid]
                    assert e["status"] == "success" and rec["outcome"] == "ok"
                    engine_ttft_ms = (rec["first_token_ns"] - rec["arrival_ns"]) / 1e6
                    diffs.append(float(e["ttft_s"]) * 1e3 - engine_ttft_ms)  # type: ignore[arg-type]
                d = np.asarray(diffs)
                assert len(d) == REQUESTS
                assert d.min() > 0  # the gateway's clock starts before the engine's and stops after it
                p50, p90, p99 = np.percentile(d, [50, 90, 99])
                seen.append([p50, p90, p99])
                if p50 < 20.0 and p90 < ITL_S * 1e3:
                    return
    raise AssertionError(f"TTFT difference (p50, p90, p99 ms) too large in every wave: {seen}")
