"""Where one stream's added TTFT goes: the request path and the first-event path, direct, through
``servelens gateway`` and through nginx, and inside the gateway where the request path's time is spent.

One stream, requests one after another (5 ms apart), each answered after 20 ms with one event, then
a second one and ``[DONE]``. Every process uses ``time.perf_counter_ns()`` (CLOCK_MONOTONIC, shared by
all processes), so stamps compare across them:

* request path: the client's send to the upstream handler's start;
* first-event path: the upstream's write of the first event to the client reading it.

The gateway runs in its own process with stamps added by this script's ``--stamped-gateway`` mode
(no change to the gateway's code): aiohttp's ``data_received`` of the request, the start of the
gateway's handler, taking an upstream connection, and the end of the write of the upstream request.
Its medians are printed when it stops. The last span includes the ``write`` call itself, during which
the upstream, woken by it, may run first (its arrival stamp then precedes the write's return).

Usage: ``python benchmarks/gateway_request_path.py [--requests 60] [--rounds 4]``
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

EVENT = (b'data: {"id":"c","object":"text_completion","created":1,"model":"bench","choices":[{"index":0,'
         b'"text":" tok","logprobs":null,"finish_reason":%b}]}\n\n')


def serve_upstream(port: int) -> None:
    """The upstream (blocks): stamps each request's arrival and first-event write; ``GET /times``."""
    import gc

    import uvloop
    from aiohttp import web

    times: list[tuple[str, int, int]] = []

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter_ns()
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(0.02)
        wrote = time.perf_counter_ns()
        await resp.write(EVENT % b"null")
        await asyncio.sleep(0.02)
        await resp.write(EVENT % b'"length"' + b"data: [DONE]\n\n")
        times.append((request.headers.get("x-i", ""), arrived, wrote))
        return resp

    async def get_times(request: web.Request) -> web.Response:
        out = list(times)
        times.clear()
        return web.json_response(out)

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/times", get_times)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        gc.disable()
        await asyncio.Event().wait()

    uvloop.run(main())


def stamped_gateway(argv: list[str]) -> int:
    """``servelens gateway`` with stamps on its request path; medians to stderr at exit."""
    import aiohttp.web_protocol as wp

    from servelens.cli.main import main
    from servelens.gateway import measured as gmeasured
    from servelens.gateway import upstream as gup

    spans: dict[str, list[float]] = {"bytes in -> handler": [], "handler -> upstream connection taken": [],
                                     "connection taken -> upstream request written": []}
    cur: dict[str, int] = {}

    def wrap_data_received(orig: Callable[..., Any]) -> Callable[..., Any]:
        def data_received(self: Any, data: bytes) -> Any:
            if data.startswith(b"POST /v1/completions"):
                cur.clear()
                cur["in"] = time.perf_counter_ns()
            return orig(self, data)
        return data_received

    def wrap_measured(orig: Callable[..., Any]) -> Callable[..., Any]:
        async def measured(self: Any, request: Any, endpoint: str) -> Any:
            cur["handler"] = time.perf_counter_ns()
            return await orig(self, request, endpoint)
        return measured

    def wrap_reuse(orig: Callable[..., Any]) -> Callable[..., Any]:
        def reuse(self: Any, key: Any) -> Any:
            conn = orig(self, key)
            if conn is not None:  # an idle connection taken; else _connect makes one
                cur["taken"] = time.perf_counter_ns()
            return conn
        return reuse

    def wrap_connect(orig: Callable[..., Any]) -> Callable[..., Any]:
        async def connect(self: Any, key: Any) -> Any:
            conn = await orig(self, key)
            cur["taken"] = time.perf_counter_ns()
            return conn
        return connect

    def wrap_send(orig: Callable[..., Any]) -> Callable[..., Any]:
        def send(self: Any, head: bytes, body: bytes) -> Any:
            resp = orig(self, head, body)
            now = time.perf_counter_ns()
            if {"in", "handler", "taken"} <= cur.keys():
                spans["bytes in -> handler"].append((cur["handler"] - cur["in"]) / 1e3)
                spans["handler -> upstream connection taken"].append((cur["taken"] - cur["handler"]) / 1e3)
                spans["connection taken -> upstream request written"].append((now - cur["taken"]) / 1e3)
            cur.clear()
            return resp
        return send

    wp.RequestHandler.data_received = wrap_data_received(wp.RequestHandler.data_received)  # type: ignore[method-assign]
    gmeasured.MeasuredEndpoints._measured = wrap_measured(gmeasured.MeasuredEndpoints._measured)  # type: ignore[method-assign]
    gup.UpstreamClient._reuse = wrap_reuse(gup.UpstreamClient._reuse)  # type: ignore[method-assign]
    gup.UpstreamClient._connect = wrap_connect(gup.UpstreamClient._connect)  # type: ignore[method-assign]
    gup._Connection.send = wrap_send(gup._Connection.send)  # type: ignore[method-assign]

    def report() -> None:
        for name, values in spans.items():
            if values:
                print(f"gateway: {name}: p50 {statistics.median(values):.0f} us, n={len(values)}",
                      file=sys.stderr, flush=True)

    atexit.register(report)
    return main(["gateway", *argv])


async def one_path(http: Any, url: str, upstream: str, requests: int, tag: str) -> tuple[list[float], list[float]]:
    """``requests`` requests through ``url``; (request-path us, first-event-path us) per request."""
    body = json.dumps({"model": "bench", "prompt": "hello world", "max_tokens": 2, "stream": True}).encode()
    sent: dict[str, int] = {}
    first: dict[str, int] = {}
    for i in range(requests):
        key = f"{tag}{i}"
        sent[key] = time.perf_counter_ns()
        async with http.post(url + "/v1/completions", data=body,
                             headers={"Content-Type": "application/json", "x-i": key}) as r:
            async for line in r.content:
                if line.startswith(b"data: {"):
                    first[key] = time.perf_counter_ns()
                    break
            await r.read()
        await asyncio.sleep(0.005)  # one stream, requests apart, as a lone user's
    async with http.get(upstream + "/times") as r:
        stamps = await r.json()
    req = [(arrived - sent[k]) / 1e3 for k, arrived, _ in stamps if k in sent]
    ev = [(first[k] - wrote) / 1e3 for k, _, wrote in stamps if k in first]
    return req, ev


async def run(requests: int, rounds: int, python: str | None) -> None:
    import aiohttp
    from gateway_overhead import run_nginx

    from servelens.process import ServerProcess, free_port

    port = free_port()
    up_proc = multiprocessing.Process(target=serve_upstream, args=(port,), daemon=True)
    up_proc.start()
    upstream = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(upstream + "/v1/models"):
                    break
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)  # startup poll of a child process
        log = Path(f"/tmp/servelens-request-path-{port}.log")
        gw = ServerProcess(["gateway", "--upstream", upstream], log_path=log)
        # the gateway's arguments follow "-m servelens gateway"
        gw.args = [python or sys.executable, __file__, "--stamped-gateway", *gw.args[4:]]
        if python:  # servelens from this checkout
            os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
        try:
            with gw, run_nginx(upstream) as ngx:
                paths = {"direct": upstream, "gateway": gw.url, "nginx": ngx.url}
                got: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in paths}
                for rnd in range(rounds):
                    for name, url in paths.items():
                        req, ev = await one_path(http, url, upstream, requests, f"{name}{rnd}-")
                        got[name][0].extend(req)
                        got[name][1].extend(ev)
            print(f"one stream, {requests * rounds} requests per path; us, p50 (p90)")
            base_req, base_ev = (statistics.median(v) for v in got["direct"])
            for name, (req, ev) in got.items():
                r50, e50 = statistics.median(req), statistics.median(ev)
                p90 = sorted(req)[int(0.9 * len(req))], sorted(ev)[int(0.9 * len(ev))]
                print(f"  {name:8s} request path {r50:6.0f} ({p90[0]:5.0f}) = direct {r50 - base_req:+5.0f} | "
                      f"first-event path {e50:6.0f} ({p90[1]:5.0f}) = direct {e50 - base_ev:+5.0f}")
            print("".join(line + "\n" for line in log.read_text().splitlines() if line.startswith("gateway:")),
                  end="")
        finally:
            up_proc.terminate()
            log.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--stamped-gateway"]:
        return stamped_gateway(args_in[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=60, help="requests per path and round")
    p.add_argument("--rounds", type=int, default=4, help="rounds, the paths interleaved in each")
    p.add_argument("--gateway-python", metavar="PYTHON",
                   help="run the gateway under this interpreter (with servelens's dependencies installed)")
    args = p.parse_args(args_in)
    asyncio.run(run(args.requests, args.rounds, args.gateway_python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
