"""Gateway TTFT accuracy against the sim's ground truth at 64 concurrent streams.

The sim and the gateway run as their own processes (``servelens sim --truth-log``,
``servelens gateway --request-log``); this process is the client. Both logs take
``time.perf_counter_ns()`` (CLOCK_MONOTONIC, shared by all processes of the machine), and the
gateway's log carries the sim's request id (``x-request-id``), so each request's two TTFTs join
exactly. Reported: the gateway's TTFT minus the engine's TTFT (sim arrival to the step that
emitted the first token), percentiles over requests, in ms. The difference is the real cost of
the hop (gateway -> engine request, engine -> gateway first chunk) plus scheduling noise on this
shared 2-core machine.

With ``--workers 1,2`` the gateway runs once per worker count (``servelens gateway --workers N``, one
request log that all workers append to), against the same sim, side by side.

Usage: ``python benchmarks/gateway_accuracy.py [--concurrency 64] [--requests 512] [--workers 1,2]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

from servelens.core.openai import parse_chunk
from servelens.core.sse import SSEDecoder
from servelens.gateway.requestlog import read_request_log
from servelens.process import ServerProcess

RAMP_S = 0.01


async def _client(url: str, concurrency: int, n: int, seed: int, prefix: str
                  ) -> tuple[float, dict[str, tuple[int, int]]]:
    """Closed loop of ``n`` streams, ``concurrency`` at a time.

    Returns (wall s, {request id: (send ns, first-output ns)}) as the client saw them.
    """
    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)
    first: dict[str, tuple[int, int]] = {}

    async def one(i: int, s: aiohttp.ClientSession) -> None:
        words = rng.randint(30, 2500)
        rid = f"{prefix}-{i}"
        body = {"model": "sim-model", "max_tokens": rng.randint(16, 48), "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": f"{rid} " + "lorem ipsum dolor " * (words // 3)}]}
        dec = SSEDecoder()
        # spread the first wave (a 64-request burst queues in the engine's own loop); the rest
        # wait for it, then follow the closed loop
        await asyncio.sleep(min(i, concurrency) * RAMP_S)
        async with sem:
            t_send = time.perf_counter_ns()
            async with s.post(url + "/v1/chat/completions", json=body, headers={"x-request-id": rid}) as r:
                async for data in r.content.iter_any():
                    t = time.perf_counter_ns()
                    if rid not in first:
                        for blk in dec.decode(data):
                            if blk.data is not None and parse_chunk(blk.data).has_output:
                                first[rid] = (t_send, t)
                                break

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(one(i, s) for i in range(n)))
    return time.perf_counter() - t0, first


def _pct(values: list[float]) -> dict[str, float]:
    a = np.asarray(values)
    return {"n": float(len(a)), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def run(concurrency: int = 64, requests: int = 512, seed: int = 1, decode_base_s: float = 0.02,
        workers: tuple[int, ...] = (1,)) -> dict[str, dict[str, float]]:
    """Run the measurement; returns percentiles (ms) of the TTFT differences to the engine's truth.

    Keys: ``gateway`` (the gateway's logged TTFT), ``direct_client`` (a client talking to the sim
    directly, the same way: its own TTFT from sending), ``direct_request_leg`` and the two legs of
    the gateway's difference (``request_leg``: gateway arrival -> engine arrival;
    ``first_chunk_leg``: engine's first token -> gateway read). With several ``workers`` counts the
    gateway's keys get a suffix ``@N`` (N workers), the first count's keys stay unsuffixed too.
    """
    with tempfile.TemporaryDirectory() as tmp:
        truth = Path(tmp) / "truth.jsonl"
        reqlog = Path(tmp) / "requests.jsonl"
        sim_cmd = ["sim", "--truth-log", str(truth), "--decode-base-s", str(decode_base_s)]
        with ServerProcess(sim_cmd) as sim:
            asyncio.run(_client(sim.url, concurrency, concurrency, seed, "warm-direct"))
            _, direct_first = asyncio.run(_client(sim.url, concurrency, requests, seed, "direct"))
            for n in workers:
                log = reqlog.with_name(f"requests-{n}.jsonl")
                with ServerProcess(["gateway", "--upstream", sim.url, "--request-log", str(log),
                                    "--workers", str(n)]) as gw:
                    asyncio.run(_client(gw.url, concurrency, concurrency, seed, f"warm-gw{n}"))
                    asyncio.run(_client(gw.url, concurrency, requests, seed, f"gw{n}"))
        truth_by_id = {}
        for line in truth.read_text().splitlines():
            rec = json.loads(line)
            truth_by_id[rec["request_id"]] = rec
        out: dict[str, dict[str, float]] = {}
        for k, n in enumerate(workers):
            diffs, legs_in, legs_out = [], [], []
            for e in read_request_log(reqlog.with_name(f"requests-{n}.jsonl")):
                rid = str(e["upstream_request_id"])
                rec = truth_by_id.get(rid)
                if (not rid.startswith(f"gw{n}-") or rec is None or rec["first_token_ns"] is None
                        or e["ttft_s"] is None):
                    continue
                engine_ttft_s = (rec["first_token_ns"] - rec["arrival_ns"]) / 1e9
                diffs.append((float(e["ttft_s"]) - engine_ttft_s) * 1e3)  # type: ignore[arg-type]
                legs_in.append((rec["arrival_ns"] - int(e["arrival_ns"])) / 1e6)  # type: ignore[call-overload]
                legs_out.append((int(e["first_output_ns"]) - rec["first_token_ns"]) / 1e6)  # type: ignore[call-overload]
            for key, vals in (("gateway", diffs), ("request_leg", legs_in), ("first_chunk_leg", legs_out)):
                out[f"{key}@{n}"] = _pct(vals)
                if k == 0:
                    out[key] = out[f"{key}@{n}"]
        direct, direct_in = [], []
        for rid, (t_send, t_first) in direct_first.items():
            rec = truth_by_id.get(rid)
            if rec is None or rec["first_token_ns"] is None:
                continue
            direct.append(((t_first - t_send) - (rec["first_token_ns"] - rec["arrival_ns"])) / 1e6)
            direct_in.append((rec["arrival_ns"] - t_send) / 1e6)
    return {**out, "direct_client": _pct(direct), "direct_request_leg": _pct(direct_in)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--decode-base-s", type=float, default=0.02, help="sim decode step base time (ITL)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", default="1", help="gateway worker counts to run side by side, e.g. 1,2")
    args = ap.parse_args(argv)
    workers = tuple(int(x) for x in args.workers.split(","))
    r = run(args.concurrency, args.requests, args.seed, args.decode_base_s, workers)
    print(f"{args.concurrency} concurrent streams, {args.requests} measured requests per mode (ms)")
    labels: dict[str, str] = {}
    for n in workers:
        w = f" ({n} worker{'s' if n > 1 else ''})"
        labels |= {f"gateway@{n}": "gateway TTFT - engine TTFT" + w,
                   f"request_leg@{n}": "  request leg (gateway -> engine arrival)",
                   f"first_chunk_leg@{n}": "  first-chunk leg (engine token -> gateway read)"}
    labels |= {"direct_client": "direct client TTFT - engine TTFT",
               "direct_request_leg": "  request leg (client send -> engine arrival)"}
    for key, label in labels.items():
        p = r[key]
        print(f"{label:50s} n={int(p['n']):4d}  p50 {p['p50']:7.2f}  p90 {p['p90']:7.2f}  p99 {p['p99']:7.2f}  "
              f"max {p['max']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
