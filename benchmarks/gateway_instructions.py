"""Instructions per relayed event of the gateway, counted by callgrind: a figure that does not move with
the machine's load (the wall-clock benchmarks of this folder do), for comparing two versions of the code.

One process runs a minimal streaming upstream (aiohttp), the gateway (from this checkout, or from
``--src DIR``, another checkout's ``src/``) and a client, on the default asyncio loop, and sends
``--requests`` streams of ``--tokens`` events one after another (no timers: every event is sent at
once). Run under ``valgrind --tool=callgrind`` twice, at two request counts, the difference of the two
totals divided by the extra events is the cost of one relayed event, per-request work included
(upstream and client included too: they are the same code in both versions, so a difference between
versions is the gateway's).

Usage::

    python benchmarks/gateway_instructions.py --compare base=../base/src,new=src --tokens 32

prints, per version, instructions per event (``(I(n2) - I(n1)) / ((n2 - n1) * tokens)``). A plain run
(``--requests N`` without ``--compare``) just does the work (that is what callgrind runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


async def _work(requests: int, tokens: int) -> int:
    from aiohttp import ClientSession, web

    from servelens.gateway.testing import run_gateway, serve_app

    head = b'data: {"id":"c","object":"text_completion","created":1,"model":"bench","choices":[{"index":0,"text":" t'

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        so = body.get("stream_options") or {}
        cont = so.get("continuous_usage_stats") is True
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(tokens):
            usage = b',"usage":{"prompt_tokens":100,"completion_tokens":%d,"total_tokens":%d}' % (
                i + 1, 101 + i) if cont else b""
            fin = b'"length"' if i == tokens - 1 else b"null"
            await resp.write(head + b'","finish_reason":' + fin + b"}]" + usage + b"}\n\n")
        if so.get("include_usage") is True:
            await resp.write(b'data: {"id":"c","object":"text_completion","created":1,"model":"bench","choices":[],'
                             b'"usage":{"prompt_tokens":100,"completion_tokens":%d,"total_tokens":%d}}\n\n'
                             % (tokens, 100 + tokens))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    events = 0
    async with serve_app(app) as up, run_gateway(up, isl_buckets="512,1024,2048,4096,8192,16384") as gw, \
            ClientSession() as s:
        body = {"model": "bench", "prompt": "hello " * 100, "max_tokens": tokens, "stream": True}
        for _ in range(requests):
            async with s.post(gw.url + "/v1/completions", json=body) as r:
                async for data in r.content.iter_any():
                    events += data.count(b'"text"')
    return events


def _count(src: str, requests: int, tokens: int) -> int:
    """Total instructions of one run under callgrind (servelens imported from ``src``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()), PYTHONHASHSEED="0")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
                        "--requests", str(requests), "--tokens", str(tokens)],
                       env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        m = re.search(r"^summary:\s+(\d+)", out.read_text(), re.M)
        assert m is not None, "no summary line in the callgrind output"
        return int(m.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10, help="streams in a plain run (default 10)")
    ap.add_argument("--tokens", type=int, default=32, help="events per stream (default 32)")
    ap.add_argument("--compare", metavar="LABEL=SRC,...", help="versions to count, each a checkout's src/ folder")
    ap.add_argument("--counts", default="10,40", metavar="N1,N2", help="the two request counts (default 10,40)")
    args = ap.parse_args(argv)
    if not args.compare:
        events = asyncio.run(_work(args.requests, args.tokens))
        assert events == args.requests * args.tokens, events
        return 0
    n1, n2 = (int(x) for x in args.counts.split(","))
    print(f"instructions per relayed event ({args.tokens} events per stream; {n2 - n1} streams' difference)")
    for spec in args.compare.split(","):
        label, _, src = spec.partition("=")
        i1, i2 = _count(src, n1, args.tokens), _count(src, n2, args.tokens)
        print(f"  {label:10s} {(i2 - i1) / ((n2 - n1) * args.tokens):12,.0f}   (totals {i1:,} and {i2:,})",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
