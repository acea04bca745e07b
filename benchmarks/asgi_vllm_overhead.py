"""The ASGI middleware inside a real vLLM (CPU build, tiny model): CPU of vLLM's API-server process per
streamed token, without and with ``--middleware servelens.asgi.MetricsMiddleware``, side by side (issue 20).

    python benchmarks/asgi_vllm_overhead.py [--tokens 256] [--requests 8] [--streams 2] [--rounds 3]

Two engines run at once (one plain, one with the middleware, this checkout's ``src`` on its
``PYTHONPATH``); rounds alternate between them. A round: ``--requests`` chat streams of ``--tokens``
tokens each (``ignore_eos``; the client asks for no usage, the worst case: usage added and cut again),
``--streams`` at a time. The API server's CPU (utime + stime of its process, ``/proc/PID/stat``, in clock
ticks of 10 ms; the engine core runs in a child process and is not counted) over the round, divided by
the tokens streamed. A third case, the plain engine with the client asking for continuous usage itself,
is vLLM's own work for the usage the middleware adds (``middleware_own`` = middleware - that).
Prints one JSON object (best round of each, the differences, the ratio, the load average). The
middleware's settings come from the environment (``SERVELENS_CONTINUOUS_USAGE=off python
benchmarks/asgi_vllm_overhead.py``: only the final usage chunk added).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp

from servelens.engines.vllm_cpu import VllmServer

SRC = Path(__file__).resolve().parents[1] / "src"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of one process (s)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


USAGE = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}


async def one_round(url: str, model: str, tokens: int, requests: int, streams: int, extra: dict[str, Any]) -> int:
    """Stream ``requests`` chats (``extra`` in the body); the output chunks received."""
    sem = asyncio.Semaphore(streams)
    body = {"model": model, "messages": [{"role": "user", "content": "count to a thousand"}], "max_tokens": tokens,
            "ignore_eos": True, "stream": True, **extra}
    chunks = 0

    async def one(s: aiohttp.ClientSession) -> None:
        nonlocal chunks
        async with sem, s.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            async for line in r.content:
                chunks += line.startswith(b"data: {")
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(s) for _ in range(requests)))
    return chunks


async def main_async(args: argparse.Namespace, plain: VllmServer, measured: VllmServer) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": args.tokens, "requests": args.requests, "streams": args.streams,
                           "rounds": args.rounds, "load_average_before": [round(x, 2) for x in os.getloadavg()]}
    cases: tuple[tuple[str, VllmServer, dict[str, Any]], ...] = (
        ("plain", plain, {}), ("plain_usage_asked", plain, USAGE), ("middleware", measured, {}))
    per: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    for srv in (plain, measured):
        await one_round(srv.url, srv.model, 8, 2, 2, {})  # warm
    for _ in range(args.rounds):
        for name, srv, extra in cases:
            assert srv.pid is not None
            c0 = cpu_s(srv.pid)
            await one_round(srv.url, srv.model, args.tokens, args.requests, args.streams, extra)
            per[name].append((cpu_s(srv.pid) - c0) / (args.tokens * args.requests) * 1e6)
    p, u, m = (min(per[name]) for name, _, _ in cases)
    out.update({"plain_us_per_token": round(p, 1), "plain_usage_asked_us_per_token": round(u, 1),
                "middleware_us_per_token": round(m, 1), "added_us_per_token": round(m - p, 1),
                "middleware_own_us_per_token": round(m - u, 1), "ratio": round(m / p, 3),
                "rounds_us_per_token": {k: [round(x, 1) for x in v] for k, v in per.items()},
                "load_average_after": [round(x, 2) for x in os.getloadavg()]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env = {"PYTHONPATH": str(SRC)}
    with VllmServer() as plain, VllmServer(extra_args=("--middleware", "servelens.asgi.MetricsMiddleware"),
                                           extra_env=env) as measured:
        print(json.dumps(asyncio.run(main_async(args, plain, measured)), indent=1))


if __name__ == "__main__":
    main()
