"""Gateway relay overhead, side by side with nginx, against a fast streaming upstream.

Paths, interleaved in one run (each level's requests run in ``--rounds`` blocks; every block runs on
every path, in an order that rotates, on keep-alive connections kept for the whole run): (a) the client
talks to the upstream directly, (b) through ``servelens gateway`` (ISL buckets on, default settings:
usage injected and stripped), (c) through nginx (Debian package; one worker, ``proxy_buffering off``,
HTTP/1.1 keep-alive to the upstream); and for scale, three bare relays on uvloop protocols and httptools
(:func:`serve_bare`, no error handling): (d) ``floor``, the bytes passed through both ways, nothing
parsed; (e) ``lean``, the gateway's own measurement (usage injected and cut, metrics, StreamMeter) on
those protocols, without aiohttp's server; (f) ``tasked``, ``lean`` with a task per request. Every
process is separate: the upstream (this script with ``--serve-upstream``, aiohttp + uvloop), the proxy,
and the client (this process, aiohttp + uvloop).

The upstream streams ``/v1/completions`` like vLLM: a fixed "prefill" delay, then one token per
event every ``--itl-ms`` (cumulative usage on every chunk when ``continuous_usage_stats`` is asked
for, a final usage chunk when ``include_usage`` is). Measured at the client per request: TTFT
(send to the first event) and ITL (gap between events). Proxy CPU: user+system seconds of the
proxy's processes (``/proc/<pid>/task/*/schedstat``) over the run, divided by the events relayed.

The harness's own garbage collection is kept out of the figures: the upstream and the client run
each path with Python's collector off, and collect between paths (``POST /gc`` on the upstream). A
full collection in the upstream took 39 ms once its heap had grown over the earlier paths, and it
landed on whichever path ran then: +36 ms TTFT p99 at 64 streams for the gateway in one run, none
of it the gateway's. The proxies keep their own collectors: their pauses are theirs to pay.

Workers (issue 20): ``--workers 2`` (the default) adds the path ``gw-2w``, ``servelens gateway --workers 2``
(its CPU: the supervisor's and every worker's); ``--saturate STREAMS`` adds a saturation level, that many
streams of ``--saturate-tokens`` events sent back to back (no gap upstream), reporting relayed events per
second per path. Every row also says the client's (this process, the load generator) and the upstream's
CPU per event, which share the same two cores. ``--no-bare`` leaves out floor/lean/tasked.

Usage: ``python benchmarks/gateway_overhead.py [--levels 1,64,256] [--tokens 32] [--itl-ms 20] [--rounds 4]
[--workers 2] [--saturate 64] [--no-bare]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servelens.process import ServerProcess
from servelens.testing.nginx import run_nginx


# ---------------------------------------------------------------- the upstream (own process)
def serve_upstream(port: int, ttft_ms: float, itl_ms: float) -> None:
    """A minimal fast OpenAI-compatible streaming server (blocks)."""
    import msgspec
    import uvloop
    from aiohttp import web

    dec = msgspec.json.Decoder()
    head = (b'data: {"id":"cmpl-bench","object":"text_completion","created":1700000000,"model":"bench",'
            b'"choices":[{"index":0,"text":" tok')

    async def collect(request: web.Request) -> web.Response:
        gc.collect()
        return web.Response(text="ok")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = dec.decode(await request.read())
        n = int(body.get("max_tokens") or 32)
        gap_s = float(body.get("bench_itl_ms", itl_ms)) / 1000  # the saturation level sends back to back
        prompt_tokens = len(str(body.get("prompt", "")).split())
        so = body.get("stream_options") or {}
        usage = so.get("include_usage") is True
        cont = usage and so.get("continuous_usage_stats") is True
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await asyncio.sleep(ttft_ms / 1000)
        for i in range(n):
            fin = b'"length"' if i == n - 1 else b"null"
            ev = head + str(i).encode() + b'","logprobs":null,"finish_reason":' + fin + b"}]"
            if cont:
                ev += (b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}'
                       % (prompt_tokens, prompt_tokens + i + 1, i + 1))
            await resp.write(ev + b"}\n\n")
            if i < n - 1 and gap_s > 0:
                await asyncio.sleep(gap_s)
        if usage:
            await resp.write(b'data: {"id":"cmpl-bench","object":"text_completion","created":1700000000,'
                             b'"model":"bench","choices":[],"usage":{"prompt_tokens":%d,"total_tokens":%d,'
                             b'"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
                             % (prompt_tokens, prompt_tokens + n, n))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        app.router.add_post("/gc", collect)  # between paths: the collector runs off during them
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=2048)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        gc.collect()
        gc.disable()
        print(f"servelens upstream listening on http://127.0.0.1:{bound}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


# ---------------------------------------------------------------- bare relays (own process)
def serve_bare(upstream_port: int, measure: bool, tasked: bool = False) -> None:
    """A bare HTTP/1.1 relay on uvloop protocols and httptools (blocks), for scale; only for this
    benchmark's traffic (keep-alive, one streaming completion per request): no header forwarding,
    limits, timeouts or error handling.

    ``measure=False`` (path ``floor``): each client request's bytes go to a pooled upstream
    connection, each upstream read straight to the client. ``measure=True`` (path ``lean``): the
    gateway's own measurement on the same protocols: the body decoded, usage injected
    (``plan_injection``), ``FrontendMetrics.begin``/``finish`` with ISL buckets, each upstream read
    de-chunked, cut (``StreamMeter.relay``), re-chunked and sent, then measured after the loop's
    turn (``StreamMeter.measure``) -- what the gateway does per request and per event, without
    aiohttp's server. ``tasked=True`` (path ``tasked``): ``lean``, but each request is handled in a
    new task and the client's headers are written when that task wakes on the upstream's headers
    (two turns of the event loop, as an async handler on these protocols would take; ``lean``
    takes none).
    """
    import httptools
    import msgspec
    import uvloop

    from servelens.gateway.meter import StreamMeter
    from servelens.gateway.usage import plan_injection
    from servelens.prometheus import FrontendMetrics

    metrics = FrontendMetrics(isl_buckets="512,1024,2048,4096,8192,16384")
    metrics.register_model("bench")
    decode = msgspec.json.Decoder().decode
    now = time.monotonic_ns
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    idle: list[Any] = []
    connecting: set[asyncio.Task[None]] = set()  # held until done (the loop keeps only weak references)

    class Upstream(asyncio.Protocol):
        def __init__(self) -> None:
            self.transport: Any = None
            self.client: Any = None
            self.parser = httptools.HttpResponseParser(self)
            self.measure_due = False

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            if not measure and self.client is not None and self.client.transport is not None:
                self.client.transport.write(data)
            self.parser.feed_data(data)

        def on_headers_complete(self) -> None:
            if measure and self.client is not None and self.client.transport is not None:
                if tasked:
                    self.client.headers_arrived.set_result(None)
                else:
                    self.client.transport.write(head)

        def on_body(self, data: bytes) -> None:
            c = self.client
            if not measure or c is None:
                return
            out = c.meter.relay(now(), data)
            out = data if out is None else out
            if out:
                c.out(b"%x\r\n%b\r\n" % (len(out), out))
            if not self.measure_due:
                self.measure_due = True
                asyncio.get_running_loop().call_soon(self.measure, c.meter)

        def measure(self, meter: StreamMeter) -> None:
            self.measure_due = False
            meter.measure()

        def on_message_complete(self) -> None:
            c, self.client = self.client, None
            idle.append(self)
            if not measure or c is None:
                return
            meter = c.meter
            rest = meter.end(now())
            c.out((b"%x\r\n%b\r\n" % (len(rest), rest) if rest else b"") + b"0\r\n\r\n")
            status, error_type = meter.outcome()
            meter.live.finish(now(), status, error_type, osl=meter.osl, cached_tokens=meter.cached_tokens)

        def connection_lost(self, exc: Exception | None) -> None:
            if self in idle:
                idle.remove(self)

    class Client(asyncio.Protocol):
        def __init__(self) -> None:
            self.transport: Any = None
            self.parser = httptools.HttpRequestParser(self)
            self.buf: list[bytes] = []
            self.url = b"/"
            self.arrival = 0
            self.meter: Any = None
            self.headers_arrived: asyncio.Future[None] | None = None
            self.held: list[bytes] | None = None  # ``tasked``: the response until its head is written

        def out(self, data: bytes) -> None:
            if self.held is not None:
                self.held.append(data)
            elif self.transport is not None:
                self.transport.write(data)

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            if not measure:
                self.buf.append(data)
            self.parser.feed_data(data)

        def on_message_begin(self) -> None:
            self.arrival = now()

        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_body(self, body: bytes) -> None:
            if measure:
                self.buf.append(body)

        def on_message_complete(self) -> None:
            if tasked:
                task = asyncio.ensure_future(self.handle())
                connecting.add(task)
                task.add_done_callback(connecting.discard)
            else:
                self.send()

        async def handle(self) -> None:
            self.headers_arrived = asyncio.get_running_loop().create_future()
            self.held = []  # the upstream's head and first events can come in one read, before this wakes
            self.send()
            await self.headers_arrived
            held, self.held = self.held, None
            self.out(head + b"".join(held))

        def send(self) -> None:
            data, self.buf = b"".join(self.buf), []
            if measure:
                obj = decode(data)
                live = metrics.begin(obj["model"], "completions", "stream", self.arrival)
                inj = plan_injection(obj, data, inject_usage=True, continuous=True)
                self.meter = StreamMeter(live, inj.strip)
                data = (b"POST %b HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%b" % (self.url, len(inj.body), inj.body))
            if idle:
                up = idle.pop()
                up.client = self
                up.transport.write(data)
            else:
                task = asyncio.ensure_future(self.connect(data))
                connecting.add(task)
                task.add_done_callback(connecting.discard)

        async def connect(self, request: bytes) -> None:
            _, up = await asyncio.get_running_loop().create_connection(Upstream, "127.0.0.1", upstream_port)
            up.client = self
            up.transport.write(request)

        def connection_lost(self, exc: Exception | None) -> None:
            self.transport = None

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Client, "127.0.0.1", 0, backlog=2048)
        name = "tasked" if tasked else "lean" if measure else "floor"
        print(f"{name} relay listening on http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


# ---------------------------------------------------------------- measurement
def with_children(pid: int) -> list[int]:
    """``pid`` and its child processes (a ``--workers`` gateway: the supervisor and its workers)."""
    kids: list[int] = []
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            kids += [int(x) for x in f.read_text().split()]
    return [pid, *kids]


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds the processes' threads have run (``/proc/<pid>/task/*/schedstat``, ns resolution;
    the 10 ms ticks of ``/proc/<pid>/stat`` are too coarse for a few thousand events)."""
    total_ns = 0
    for pid in pids:
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                total_ns += int(stat.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that just ended
    return total_ns / 1e9


@dataclass
class RunResult:
    ttft_ms: list[float]
    itl_ms: list[float]
    events: int
    cpu_s: float
    wall_s: float
    client_cpu_s: float = 0.0
    """This process's CPU (the load generator) over the same time."""
    upstream_cpu_s: float = 0.0


async def load(s: Any, url: str, concurrency: int, requests: int, tokens: int,
               extra: dict[str, Any] | None = None) -> RunResult:
    """``requests`` streams through ``url``, ``concurrency`` at a time, on session ``s`` (its keep-alive
    connections persist across calls); per-request TTFT, per-event ITL (CPU is filled in by the caller)."""
    ttfts: list[float] = []
    itls: list[float] = []
    events = 0
    sem = asyncio.Semaphore(concurrency)
    body = {"model": "bench", "prompt": "hello " * 100, "max_tokens": tokens, "stream": True, **(extra or {})}

    async def one(i: int) -> None:
        nonlocal events
        # arrival pacing of the first wave (a burst of 256 connects would measure accept queues)
        await asyncio.sleep(min(i, concurrency) * 0.002)
        async with sem:
            t0 = time.perf_counter_ns()
            last = 0
            async with s.post(url + "/v1/completions", json=body) as r:
                async for data in r.content.iter_any():
                    t = time.perf_counter_ns()
                    k = data.count(b'"text"')
                    if not k:
                        continue
                    events += k
                    if last == 0:
                        ttfts.append((t - t0) / 1e6)
                    else:
                        itls.append((t - last) / 1e6)
                        itls.extend([0.0] * (k - 1))
                    last = t

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    return RunResult(ttfts, itls, events, 0.0, time.perf_counter() - t0)


async def run_level(up_url: str, targets: dict[str, tuple[str, list[int]]], sessions: dict[str, Any],
                    concurrency: int, requests: int, blocks: int, tokens: int, up_pid: int = 0,
                    extra: dict[str, Any] | None = None) -> dict[str, RunResult]:
    """Every path's ``requests`` streams in ``blocks`` blocks, the paths interleaved block by block in an
    order that rotates, so that a slow minute of this noisy machine lands on all paths alike. Before each
    block the upstream and this process collect, then run the block with the collector off (see the
    module docstring)."""
    names = list(targets)
    got = {name: RunResult([], [], 0, 0.0, 0.0) for name in names}
    per_block = [requests // blocks + (1 if b < requests % blocks else 0) for b in range(blocks)]
    for b, n in enumerate(per_block):
        if n == 0:
            continue
        for name in names[b % len(names):] + names[:b % len(names)]:
            url, pids = targets[name]
            async with sessions["direct"].post(up_url + "/gc") as r:
                await r.read()
            gc.collect()
            gc.disable()
            try:
                me0, up0 = cpu_seconds([os.getpid()]), cpu_seconds([up_pid]) if up_pid else 0.0
                cpu0 = cpu_seconds(pids)
                r = await load(sessions[name], url, concurrency, n, tokens, extra)
                cpu = cpu_seconds(pids) - cpu0
                me = cpu_seconds([os.getpid()]) - me0
                up = (cpu_seconds([up_pid]) - up0) if up_pid else 0.0
            finally:
                gc.enable()
            acc = got[name]
            acc.ttft_ms += r.ttft_ms
            acc.itl_ms += r.itl_ms
            acc.events += r.events
            acc.cpu_s += cpu
            acc.wall_s += r.wall_s
            acc.client_cpu_s += me
            acc.upstream_cpu_s += up
    return got


async def measure(up_url: str, targets: dict[str, tuple[str, list[int]]], levels: list[int], rounds: int,
                  tokens: int, up_pid: int = 0, saturate: int = 0, saturate_tokens: int = 256,
                  ) -> tuple[list[tuple[int, str, RunResult]], dict[str, RunResult]]:
    """All levels, one session per path for the whole run; warm-up first (connections, caches); then
    the saturation level (``saturate`` streams, no gap between events upstream) when asked."""
    import aiohttp

    rows: list[tuple[int, str, RunResult]] = []
    async with contextlib.AsyncExitStack() as stack:
        sessions = {name: await stack.enter_async_context(aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=120))) for name in targets}
        await run_level(up_url, targets, sessions, 8, 16, 1, 4)
        for level in levels:
            n = max(20, rounds * level)
            got = await run_level(up_url, targets, sessions, level, n, min(rounds, n), tokens, up_pid)
            rows += [(level, name, r) for name, r in got.items()]
        sat: dict[str, RunResult] = {}
        if saturate:
            sat = await run_level(up_url, targets, sessions, saturate, 2 * saturate, 2, saturate_tokens, up_pid,
                                  {"bench_itl_ms": 0})
    return rows, sat


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,64,256", help="concurrent streams, comma-separated")
    ap.add_argument("--tokens", type=int, default=32, help="events per stream")
    ap.add_argument("--itl-ms", type=float, default=20.0, help="upstream gap between events")
    ap.add_argument("--ttft-ms", type=float, default=20.0, help="upstream delay before the first event")
    ap.add_argument("--rounds", type=int, default=2,
                    help="requests per level and path = rounds x concurrency (>= 20), run in `rounds` "
                         "blocks, the paths interleaved block by block")
    ap.add_argument("--gateway-python", action="append", default=[], metavar="PYTHON",
                    help="also run the gateway under this interpreter (path gw-X.Y), side by side; it must "
                         "have servelens's dependencies installed (servelens itself comes from this checkout)")
    ap.add_argument("--gateway-src", action="append", default=[], metavar="LABEL=DIR",
                    help="also run the gateway from another checkout's src/ folder (path gw-LABEL), side by "
                         "side: e.g. base=../base/src to compare a change with the code before it")
    ap.add_argument("--workers", type=int, default=2,
                    help="also run `servelens gateway --workers N` (path gw-Nw), side by side (0: not; default 2)")
    ap.add_argument("--saturate", type=int, default=0, metavar="STREAMS",
                    help="add a saturation level: STREAMS streams, events back to back (default 0: none)")
    ap.add_argument("--saturate-tokens", type=int, default=256, help="events per stream at saturation")
    ap.add_argument("--no-bare", action="store_true", help="leave out the bare relays (floor, lean, tasked)")
    ap.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--serve-floor", type=int, metavar="UPSTREAM_PORT", help=argparse.SUPPRESS)
    ap.add_argument("--serve-lean", type=int, metavar="UPSTREAM_PORT", help=argparse.SUPPRESS)
    ap.add_argument("--serve-tasked", type=int, metavar="UPSTREAM_PORT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_upstream is not None:
        serve_upstream(args.serve_upstream, args.ttft_ms, args.itl_ms)
        return 0
    if args.serve_floor is not None:
        serve_bare(args.serve_floor, measure=False)
        return 0
    if args.serve_lean is not None or args.serve_tasked is not None:
        serve_bare(args.serve_lean or args.serve_tasked, measure=True, tasked=args.serve_tasked is not None)
        return 0

    levels = [int(x) for x in args.levels.split(",")]
    up_cmd = [sys.executable, __file__, "--serve-upstream", "0", "--ttft-ms", str(args.ttft_ms),
              "--itl-ms", str(args.itl_ms)]
    upstream = subprocess.Popen(up_cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert upstream.stdout is not None
    line = upstream.stdout.readline().decode()
    up_url = line.strip().rsplit(" ", 1)[-1]
    bare: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    for name in () if args.no_bare else ("floor", "lean", "tasked"):
        proc = subprocess.Popen([sys.executable, __file__, f"--serve-{name}", up_url.rsplit(":", 1)[1]],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        bare[name] = (proc, proc.stdout.readline().decode().strip().rsplit(" ", 1)[-1])
    gw_args = ["gateway", "--upstream", up_url, "--isl-buckets", "512,1024,2048,4096,8192,16384"]
    try:
        with ServerProcess(gw_args) as gw, run_nginx(up_url) as ngx, contextlib.ExitStack() as stack:
            assert gw.proc is not None
            targets = {"direct": (up_url, []), "gateway": (gw.url, [gw.proc.pid]), "nginx": (ngx.url, ngx.pids()),
                       **{name: (url, [proc.pid]) for name, (proc, url) in bare.items()}}
            if args.workers:
                multi = stack.enter_context(ServerProcess([*gw_args, "--workers", str(args.workers)]))
                assert multi.proc is not None
                targets[f"gw-{args.workers}w"] = (multi.url, with_children(multi.proc.pid))
            if args.gateway_python:  # servelens from this checkout, for the other interpreters
                os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
            for python in args.gateway_python:
                other = ServerProcess(gw_args)
                other.args[0] = python
                stack.enter_context(other)
                assert other.proc is not None
                ver = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                     capture_output=True, text=True, check=True).stdout.strip()
                targets[f"gw-{ver}"] = (other.url, [other.proc.pid])
            for spec in args.gateway_src:  # this interpreter, servelens from another checkout
                label, _, src = spec.partition("=")
                saved = os.environ.get("PYTHONPATH")
                os.environ["PYTHONPATH"] = str(Path(src).resolve())
                try:
                    other = stack.enter_context(ServerProcess(gw_args))
                finally:
                    if saved is None:
                        os.environ.pop("PYTHONPATH")
                    else:
                        os.environ["PYTHONPATH"] = saved
                assert other.proc is not None
                targets[f"gw-{label}"] = (other.url, [other.proc.pid])
            import uvloop

            rows, sat = uvloop.run(measure(up_url, targets, levels, args.rounds, args.tokens, upstream.pid,
                                           args.saturate, args.saturate_tokens))
    finally:
        for proc in (*(p for p, _ in bare.values()), upstream):
            proc.terminate()
            proc.wait(timeout=5)
    print(f"upstream: TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms, {args.tokens} events per stream; "
          f"times in ms at the client; CPU in us per relayed event")
    print(f"{'streams':>7} {'path':8} {'TTFT p50':>9} {'p99':>7} {'+p50':>6} {'+p99':>6} {'ITL p50':>8} {'p99':>7} "
          f"{'+p99':>6} {'CPU/ev':>7} {'events':>7} {'client/ev':>9} {'up/ev':>6}")
    for level in levels:
        base = next(r for lv, nm, r in rows if lv == level and nm == "direct")
        for lv, name, r in rows:
            if lv != level:
                continue
            cpu_us = r.cpu_s / r.events * 1e6 if name != "direct" and r.events else float("nan")
            print(f"{level:7d} {name:8} {_p(r.ttft_ms, 50):9.2f} {_p(r.ttft_ms, 99):7.2f} "
                  f"{_p(r.ttft_ms, 50) - _p(base.ttft_ms, 50):6.2f} {_p(r.ttft_ms, 99) - _p(base.ttft_ms, 99):6.2f} "
                  f"{_p(r.itl_ms, 50):8.2f} {_p(r.itl_ms, 99):7.2f} {_p(r.itl_ms, 99) - _p(base.itl_ms, 99):6.2f} "
                  f"{cpu_us:7.1f} {r.events:7d} {r.client_cpu_s / max(1, r.events) * 1e6:9.1f} "
                  f"{r.upstream_cpu_s / max(1, r.events) * 1e6:6.1f}")
    print("ratios gateway/nginx (added TTFT p50, added TTFT p99, CPU per event):")
    for level in levels:
        get = {nm: r for lv, nm, r in rows if lv == level}
        b, g, x = get["direct"], get["gateway"], get["nginx"]
        add = {k: (_p(v.ttft_ms, 50) - _p(b.ttft_ms, 50), _p(v.ttft_ms, 99) - _p(b.ttft_ms, 99)) for k, v in
               (("gateway", g), ("nginx", x))}
        cpu = (g.cpu_s / g.events) / (x.cpu_s / x.events) if x.cpu_s > 0 else float("inf")
        print(f"  {level:4d} streams: TTFT +p50 {add['gateway'][0]:.2f} vs {add['nginx'][0]:.2f} ms, "
              f"+p99 {add['gateway'][1]:.2f} vs {add['nginx'][1]:.2f} ms; CPU/event {cpu:.2f}x "
              f"({g.cpu_s:.2f} s vs {x.cpu_s:.2f} s)")
        for name in get:
            if name in ("direct", "gateway", "nginx"):
                continue
            f = get[name]
            print(f"  {'':4s} {name}/nginx: TTFT +p50 {_p(f.ttft_ms, 50) - _p(b.ttft_ms, 50):.2f} ms, "
                  f"+p99 {_p(f.ttft_ms, 99) - _p(b.ttft_ms, 99):.2f} ms; CPU/event "
                  f"{(f.cpu_s / f.events) / (x.cpu_s / x.events) if x.cpu_s > 0 else float('inf'):.2f}x")
    if sat:
        print(f"saturation: {args.saturate} streams of {args.saturate_tokens} events, no gap upstream "
              f"(CPU in us per event; cores: CPU seconds per wall second)")
        print(f"{'path':8} {'events/s':>9} {'proxy/ev':>8} {'cores':>6} {'client/ev':>9} {'cores':>6} "
              f"{'up/ev':>6} {'cores':>6}")
        for name, r in sat.items():
            ev = max(1, r.events)
            print(f"{name:8} {r.events / r.wall_s:9.0f} {r.cpu_s / ev * 1e6:8.1f} {r.cpu_s / r.wall_s:6.2f} "
                  f"{r.client_cpu_s / ev * 1e6:9.1f} {r.client_cpu_s / r.wall_s:6.2f} "
                  f"{r.upstream_cpu_s / ev * 1e6:6.1f} {r.upstream_cpu_s / r.wall_s:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
