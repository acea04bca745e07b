"""Does a ``/metrics`` scrape stall the gateway's relay loop? Scrapes on and off, and five ways of
writing the scrape, side by side in one run, at 10 models x 33 ISL buckets with fine TTFT/ITL edges.

Part 1, in this process: the scrape's own cost at the configurations of :data:`CONFIGS`: its size
(lines, bytes, gzip bytes) and CPU (thread time, best of ``--repeats``) for prometheus_client's
``generate_latest`` over the collector (``old``, the code before), for the copy and the writer of
``servelens.prometheus.exposition`` with every series changed since the last scrape (``fresh``, the
worst case; ``copy`` is its copy alone) and with none (``same``); the longest step between two pauses
of a fresh scrape as the gateway makes it (one model's copy, one slice of formatting; each step's best
of ``--repeats``); zlib level 1 (in a worker thread in the gateway).

Part 2, three processes: a fast streaming upstream (``benchmarks/gateway_overhead.py
--serve-upstream``: a first event after ``--ttft-ms``, then one every ``--itl-ms``), a gateway per way
(this script with ``--serve-gateway``: ``start_gateway`` with a heartbeat task on its loop, a 1 ms
``asyncio.sleep`` whose lateness is the loop's stall) configured for the same 10 models x 33 buckets and
pre-filled so that every series holds counts, and the client (this process: ``--streams`` streams over
the 10 models and every bucket, and ``--scrapers`` scrapers, an HA pair of Prometheus servers by
default, each sending ``Accept-Encoding: gzip`` every ``--scrape-every`` seconds, staggered). Phases,
in ``--rounds`` rounds in an order that rotates:

* ``off``: no scrapes (the baseline; on the ``new`` gateway).
* ``new``: the gateway as it is: models copied one per loop turn, 64 KB slices each followed by a pause
  (1 ms, or as long as the slice took), gzip in a worker thread.
* ``unpaced``: as ``new``, but 128 KB slices each followed by one turn of the loop (``asyncio.sleep(0)``),
  not by a pause: the scrape then has most of the loop while it runs.
* ``inline``: the same writer, all at once on the loop.
* ``thread``: the same writer, all at once in a worker thread (``asyncio.to_thread``): Python holding the GIL.
* ``old``: ``generate_latest`` on the loop, no gzip (the code before).

Columns (ms): scrapes and their wall time at the client; CPU/scrape, the gateway's CPU in the phase
beyond the ``off`` phases' (same requests), per scrape; ``in`` rows are the heartbeats and ITL gaps that
overlap a scrape (in the ``off`` phases, all): the heartbeat's lateness (what a stream feels, the host's
scheduling included), the loop thread's CPU while the heartbeat slept (the work on the loop meanwhile;
a wait for the GIL is in the lateness, not here); ``step``, the scrape's own CPU on the loop between two
of its pauses (the ways that pause); ITL p99 of the gaps in scrapes, of the same phases' other gaps
(``out``), and of the ``off`` phases; TTFT p99. Then each way's three latest heartbeats. Clocks:
``time.perf_counter_ns`` (CLOCK_MONOTONIC, shared by the processes).

Usage: ``python benchmarks/scrape_stall.py [--streams 64] [--requests 480] [--rounds 3]
[--ways new,unpaced,inline,thread,old] [--config large|default] [--skip-cost]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES
from servelens.core.edges import MetricEdges
from servelens.prometheus import FrontendMetrics
from servelens.testing.exporter import MANY_BOUNDARIES, many_series_metrics

HERE = Path(__file__).resolve().parent
HEARTBEAT_S = 0.001


CONFIGS: dict[str, tuple[int, tuple[int, ...], MetricEdges]] = {
    "1 model x 7 buckets, Dynamo's": (1, DEFAULT_ISL_BOUNDARIES, MetricEdges.dynamo()),
    "1 model x 7 buckets, fine": (1, DEFAULT_ISL_BOUNDARIES, MetricEdges()),
    "19 models x 7 buckets, fine": (19, DEFAULT_ISL_BOUNDARIES, MetricEdges()),
    "10 models x 33 buckets, fine": (10, MANY_BOUNDARIES, MetricEdges()),
}
"""Part 1's configurations: the gateway's default before the fine edges and now; the most models the
default series budget (50,000) allows with the fine edges; the large configuration (part 2's)."""


def configured(name: str) -> FrontendMetrics:
    """A configuration of :data:`CONFIGS`, every series fed."""
    models, boundaries, edges = CONFIGS[name]
    return many_series_metrics(models=models, boundaries=boundaries, edges=edges)


# ---------------------------------------------------------------- part 1: the scrape's own cost
def cpu_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Best thread CPU time of ``fn()`` over ``repeats`` calls, ms."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        fn()
        best = min(best, (time.thread_time_ns() - t0) / 1e6)
    return best


def longest_steps_ms(m: FrontendMetrics, repeats: int) -> tuple[float, float]:
    """The longest CPU between two pauses of a fresh scrape as the gateway makes it: one model's copy,
    one slice of formatting (:data:`~servelens.gateway.scrape.SLICE_BYTES`); each step's best of
    ``repeats`` passes, the longest step's."""
    from servelens.core.snapshot import copy_model, take_snapshot
    from servelens.gateway.scrape import SLICE_BYTES
    from servelens.prometheus.exposition import TextExposition

    copies: list[list[float]] = []
    slices: list[list[float]] = []
    for _ in range(repeats):
        models = []
        copies.append([])
        for name in list(m.state.models):
            t0 = time.thread_time_ns()
            models.append(copy_model(m.state, name))
            copies[-1].append((time.thread_time_ns() - t0) / 1e6)
        snap = take_snapshot(m.state, None, models)
        slices.append([])
        since = 0
        t0 = time.thread_time_ns()
        for piece in TextExposition(m.names, m.state.edges).pieces(snap):
            since += len(piece)
            if since >= SLICE_BYTES:
                t1 = time.thread_time_ns()
                slices[-1].append((t1 - t0) / 1e6)
                t0, since = t1, 0
        slices[-1].append((time.thread_time_ns() - t0) / 1e6)  # the last slice
    return float(np.max(np.min(copies, axis=0))), float(np.max(np.min(slices, axis=0)))


def scrape_cost(repeats: int) -> None:
    """Part 1 (see the module docstring), printed as a table."""
    from prometheus_client import CollectorRegistry, generate_latest

    from servelens.core.snapshot import take_snapshot
    from servelens.gateway.scrape import gzip_parts
    from servelens.prometheus.exposition import TextExposition

    print(f"the scrape's own cost: CPU ms, best of {repeats}; fresh = every series changed since the last "
          "scrape, same = none")
    print(f"{'config':30} {'lines':>8} {'MB':>6} {'gzip MB':>7} {'old':>8} {'fresh':>6} {'copy':>5} {'same':>5} "
          f"{'longest copy':>12} {'longest slice':>13} {'gzip':>5}")
    for name in CONFIGS:
        m = configured(name)
        large = len(m.state.models) > 1
        reg = CollectorRegistry(auto_describe=False)
        reg.register(m.collector)
        state, names = m.state, m.names
        old = cpu_ms(lambda: generate_latest(reg), max(1, repeats // 3) if large else repeats)  # noqa: B023
        fresh = cpu_ms(lambda: TextExposition(names, state.edges).render(take_snapshot(state)), repeats)  # noqa: B023
        copy = cpu_ms(lambda: take_snapshot(state), repeats)  # noqa: B023
        text = m.exposition()
        same = cpu_ms(m.exposition, repeats)
        longest_copy, longest_slice = longest_steps_ms(m, repeats)
        packed = gzip_parts([text])
        gz = cpu_ms(lambda: gzip_parts([text]), max(1, repeats // 3))  # noqa: B023
        assert gzip.decompress(packed) == text == generate_latest(reg)
        lines = text.count(b"\n")
        print(f"{name:30} {lines:8,d} {len(text) / 1e6:6.2f} {len(packed) / 1e6:7.3f} {old:8.1f} {fresh:6.1f} "
              f"{copy:5.1f} {same:5.1f} {longest_copy:12.2f} {longest_slice:13.2f} {gz:5.1f}")


# ---------------------------------------------------------------- part 2: the gateway (own process)
def use_way(way: str) -> None:
    """Replace the gateway's way of scraping (before the gateway is built) by ``way``."""
    from aiohttp import web
    from prometheus_client import CollectorRegistry, generate_latest

    from servelens.core.snapshot import StateSnapshot
    from servelens.gateway import scrape
    from servelens.gateway.scrape import METRICS_CONTENT_TYPE, MetricsScrape

    async def whole_snapshot(self: MetricsScrape) -> StateSnapshot:
        return self.metrics.snapshot()

    async def inline(self: MetricsScrape, snap: StateSnapshot) -> list[bytes]:
        return [self.metrics.text.render(snap)]

    async def threaded(self: MetricsScrape, snap: StateSnapshot) -> list[bytes]:
        return [await asyncio.to_thread(self.metrics.text.render, snap)]

    async def unpaced(self: MetricsScrape, snap: StateSnapshot) -> list[bytes]:
        parts: list[bytes] = []
        since = 0
        for piece in self.metrics.text.pieces(snap):
            parts.append(piece)
            since += len(piece)
            if since >= 128 * 1024:
                since = 0
                await scrape.asyncio.sleep(0)  # the gateway's asyncio (TimedAsyncio records the steps)
        return parts

    async def old(self: MetricsScrape, request: web.Request) -> web.StreamResponse:
        reg = CollectorRegistry(auto_describe=False)  # FrontendMetrics.exposition() before
        reg.register(self.metrics.collector)
        return web.Response(body=generate_latest(reg), headers={"Content-Type": METRICS_CONTENT_TYPE})

    if way in ("inline", "thread"):
        MetricsScrape.snapshot = whole_snapshot  # type: ignore[method-assign]
        MetricsScrape.text = inline if way == "inline" else threaded  # type: ignore[method-assign]
    elif way == "unpaced":
        MetricsScrape.text = unpaced  # type: ignore[method-assign]
    elif way == "old":
        MetricsScrape.handle = old  # type: ignore[method-assign]


class TimedAsyncio:
    """``asyncio`` as :mod:`servelens.gateway.scrape` sees it in the gateway of this benchmark: its
    ``sleep`` (the scrape's pauses) and ``to_thread`` (the compression) also record the loop thread's
    CPU since the scrape task last resumed, so ``spans`` holds the scrape's own steps on the loop (the
    first, one model's copy, is not seen)."""

    def __init__(self) -> None:
        self.spans: list[int] = []
        self._resumed: dict[asyncio.Task[Any], int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    def _mark(self) -> asyncio.Task[Any] | None:
        task = asyncio.current_task()
        now = time.thread_time_ns()
        if task in self._resumed:
            self.spans.append(now - self._resumed.pop(task))
        return task

    async def sleep(self, delay: float) -> None:
        task = self._mark()
        await asyncio.sleep(delay)
        if task is not None:
            self._resumed[task] = time.thread_time_ns()

    async def to_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._mark()  # the rest of the scrape is its response's writes
        return await asyncio.to_thread(fn, *args)


def serve_gateway(upstream: str, way: str, stats: Path, large: bool) -> None:
    """The gateway for ``upstream`` with a heartbeat on its loop (blocks until SIGTERM; then the
    heartbeat's ``(wake time, lateness, loop thread CPU while it slept)``, ns, go to ``stats``, a .npy
    file). Lateness is what a stream feels, the host's scheduling included; the loop thread's CPU while
    the heartbeat slept is the work done on the loop meanwhile, the host aside (a wait for the GIL is
    in the first, not in the second)."""
    import uvloop

    from servelens.gateway import scrape
    from servelens.gateway.config import GatewayConfig
    from servelens.gateway.server import start_gateway
    from servelens.serving import serve_until_signal

    use_way(way)
    timed = TimedAsyncio()
    scrape.asyncio = timed  # type: ignore[assignment]
    metrics = configured("10 models x 33 buckets, fine" if large else "1 model x 7 buckets, fine")
    buckets = metrics.isl_buckets
    assert buckets is not None
    config = GatewayConfig.from_mapping({"models": {name: upstream for name in metrics.state.models},
                                         "isl_buckets": buckets.spec, "port": 0, "models_refresh_s": 0})

    async def main() -> None:
        running = await start_gateway(config, metrics)
        woke: list[int] = []
        late: list[int] = []
        busy: list[int] = []

        async def heartbeat() -> None:
            clock, cpu = time.perf_counter_ns, time.thread_time_ns
            while True:
                t0, c0 = clock(), cpu()
                await asyncio.sleep(HEARTBEAT_S)
                t1, c1 = clock(), cpu()
                woke.append(t1)
                late.append(t1 - t0 - int(HEARTBEAT_S * 1e9))
                busy.append(c1 - c0)

        beat = asyncio.create_task(heartbeat())

        async def stop() -> None:
            beat.cancel()
            np.save(stats, np.array([woke, late, busy], dtype=np.int64))
            np.save(stats.with_suffix(".spans.npy"), np.array(timed.spans, dtype=np.int64))
            await running.close()

        await serve_until_signal("gateway", running.url, stop)

    uvloop.run(main())


# ---------------------------------------------------------------- part 2: the client (this process)
class Phase:
    """What one phase measured at the client (times in ns)."""

    def __init__(self, way: str) -> None:
        self.way = way
        self.ttft: list[int] = []
        self.gaps: list[tuple[int, int]] = []  # (previous event, this event)
        self.windows: list[tuple[int, int]] = []  # scrapes: sent, body read
        self.scraped_bytes: list[int] = []
        self.start = self.end = 0
        self.gateway_cpu_s = 0.0


async def run_phase(session: Any, url: str, way: str, models: list[str], isls: list[int], streams: int,
                    requests: int, tokens: int, scrape_every: float, scrapers: int) -> Phase:
    """``requests`` streams, ``streams`` at a time, over every model and ISL; ``scrapers`` scrapers
    (none for ``off``) scraping every ``scrape_every`` s, staggered, until the last stream ends."""
    ph = Phase(way)
    clock = time.perf_counter_ns
    sem = asyncio.Semaphore(streams)
    done = asyncio.Event()

    async def scraper(k: int) -> None:
        await asyncio.sleep(scrape_every * k / scrapers)
        while not done.is_set():
            t0 = clock()
            async with session.get(url + "/metrics", headers={"Accept-Encoding": "gzip"}) as r:
                body = await r.read()
            ph.windows.append((t0, clock()))
            ph.scraped_bytes.append(len(body))
            await asyncio.sleep(scrape_every)

    async def one(i: int) -> None:
        body = {"model": models[i % len(models)], "prompt": "w " * isls[i % len(isls)], "max_tokens": tokens,
                "stream": True}
        await asyncio.sleep(min(i, streams) * 0.002)  # the first wave's arrivals spread
        async with sem:
            t0 = last = clock()
            async with session.post(url + "/v1/completions", json=body) as r:
                async for data in r.content.iter_any():
                    t = clock()
                    k = data.count(b'"text"')
                    if not k:
                        continue
                    if last == t0:
                        ph.ttft.append(t - t0)
                    else:
                        ph.gaps.append((last, t))
                    ph.gaps += [(t, t)] * (k - 1)
                    last = t

    ph.start = clock()
    tasks = [asyncio.create_task(scraper(k)) for k in range(scrapers if way != "off" else 0)]
    await asyncio.gather(*(one(i) for i in range(requests)))
    done.set()
    await asyncio.gather(*tasks)
    ph.end = clock()
    return ph


def merged(windows: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """The union of ``windows`` as sorted starts and ends."""
    starts: list[int] = []
    ends: list[int] = []
    for a, b in sorted(windows):
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)


def overlapping(a: np.ndarray, b: np.ndarray, windows: list[tuple[int, int]]) -> np.ndarray:
    """Which intervals ``[a, b]`` overlap one of ``windows``."""
    starts, ends = merged(windows)
    if not len(starts):
        return np.zeros(len(a), dtype=bool)
    i = np.searchsorted(starts, b, side="right") - 1
    return (i >= 0) & (ends[np.maximum(i, 0)] > a)


def report(phases: list[Phase], beats: dict[str, np.ndarray], spans: dict[str, np.ndarray]) -> None:
    """Per way: the heartbeat and the ITL gaps overlapping scrapes, against the same phases' other gaps
    and against the ``off`` phases; the gateway's CPU per scrape beyond what the ``off`` phases used."""
    def pct(x: np.ndarray, q: float) -> float:
        return float(np.percentile(x, q)) / 1e6 if len(x) else float("nan")

    rows: dict[str, dict[str, Any]] = {}
    for ph in phases:
        row = rows.setdefault(ph.way, {k: [] for k in ("ttft", "in", "out", "late", "busy", "scrape", "bytes")}
                              | {"cpu": 0.0})
        woke, late, busy = beats["new" if ph.way == "off" else ph.way]
        sel = (woke >= ph.start) & (woke <= ph.end)
        woke, late, busy = woke[sel], late[sel], busy[sel]
        g = np.array(ph.gaps, dtype=np.int64).reshape(-1, 2)
        in_gap = overlapping(g[:, 0], g[:, 1], ph.windows) if ph.way != "off" else np.ones(len(g), dtype=bool)
        in_beat = (overlapping(woke - late - int(HEARTBEAT_S * 1e9), woke, ph.windows) if ph.way != "off"
                   else np.ones(len(woke), dtype=bool))
        gaps = g[:, 1] - g[:, 0]
        row["ttft"].append(np.array(ph.ttft))
        row["in"].append(gaps[in_gap])
        row["out"].append(gaps[~in_gap])
        row["late"].append(late[in_beat])
        row["busy"].append(busy[in_beat])
        row.setdefault("worst", []).extend(zip(late.tolist(), busy.tolist(), in_beat.tolist(), strict=True))
        row["scrape"] += [b - a for a, b in ph.windows]
        row["bytes"] += ph.scraped_bytes
        row["cpu"] += ph.gateway_cpu_s
    print("\nms. 'in': the heartbeats and ITL gaps that overlap a scrape (the off phases: all); 'out': the same "
          "phases' other gaps; late: the heartbeat's lateness; loop CPU: the loop thread's CPU while the "
          "heartbeat slept; CPU/scrape: the gateway's CPU beyond the off phases', per scrape; step: the scrape's own "
          "CPU on the loop between two of its pauses (ways with pauses)")
    print(f"{'way':7} {'scrapes':>7} {'wall p50':>8} {'max':>7} {'KB':>5} {'CPU/scrape':>10} {'late p99':>8} "
          f"{'max':>6} {'loop CPU p99':>12} {'max':>6} {'step p99':>8} {'max':>5} {'ITL p99 in':>10} {'out':>6} "
          f"{'off':>6} {'gaps in':>7} {'TTFT p99':>8}")
    off = np.concatenate(rows["off"]["in"]) if "off" in rows else np.array([])
    off_cpu = rows["off"]["cpu"] if "off" in rows else float("nan")
    for way, r in rows.items():
        inside, outside, late, busy = (np.concatenate(r[k]) for k in ("in", "out", "late", "busy"))
        sc = np.array(r["scrape"])
        cpu = (r["cpu"] - off_cpu) / len(sc) * 1e3 if len(sc) else float("nan")
        steps = spans.get(way, np.array([])) if way != "off" else np.array([])
        print(f"{way:7} {len(sc):7d} {pct(sc, 50):8.1f} {pct(sc, 100):7.1f} "
              f"{np.mean(r['bytes']) / 1e3 if r['bytes'] else 0:5.0f} {cpu:10.1f} {pct(late, 99):8.2f} "
              f"{pct(late, 100):6.2f} {pct(busy, 99):12.2f} {pct(busy, 100):6.2f} {pct(steps, 99):8.2f} "
              f"{pct(steps, 100):5.2f} {pct(inside, 99):10.2f} "
              f"{pct(outside, 99):6.2f} {pct(off, 99):6.2f} {len(inside):7d} {pct(np.concatenate(r['ttft']), 99):8.2f}")
    print("the 3 latest heartbeats of each way: (late ms, loop CPU ms meanwhile, in a scrape)")
    for way, r in rows.items():
        worst = sorted(r["worst"], reverse=True)[:3]
        print(f"  {way:7} " + "  ".join(f"({a / 1e6:.1f}, {b / 1e6:.1f}, {'in' if c else 'out'})" for a, b, c in worst))


async def measure(gateways: dict[str, tuple[str, int]], up_url: str, models: list[str], isls: list[int],
                  args: argparse.Namespace) -> list[Phase]:
    """Warm-up, then ``args.rounds`` rounds of every phase, in an order that rotates; ``gateways``: way ->
    (URL, pid)."""
    import aiohttp
    from gateway_overhead import cpu_seconds  # this folder is on sys.path: the script's own

    order = ["off", *args.ways.split(",")]
    phases: list[Phase] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False) as s:
        for url, _ in gateways.values():
            await run_phase(s, url, "off", models, isls, args.streams, args.streams, 4, 1.0, 0)
        for r in range(args.rounds):
            for way in order[r % len(order):] + order[:r % len(order)]:
                async with s.post(up_url + "/gc") as resp:
                    await resp.read()
                gc.collect()
                gc.disable()  # the client's own pauses kept out (the gateway keeps its collector)
                url, pid = gateways["new" if way == "off" else way]
                cpu0 = cpu_seconds([pid])
                try:
                    ph = await run_phase(s, url, way, models, isls, args.streams, args.requests, args.tokens,
                                         args.scrape_every, args.scrapers)
                finally:
                    gc.enable()
                ph.gateway_cpu_s = cpu_seconds([pid]) - cpu0
                phases.append(ph)
    return phases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--config", choices=("large", "default"), default="large",
                    help="large: 10 models x 33 buckets; default: 1 model x 7 buckets (both with the fine edges)")
    ap.add_argument("--ways", default="new,unpaced,inline,thread,old", help="ways of scraping to compare with 'off'")
    ap.add_argument("--streams", type=int, default=64, help="concurrent streams")
    ap.add_argument("--requests", type=int, default=480, help="streams per phase")
    ap.add_argument("--tokens", type=int, default=32, help="events per stream")
    ap.add_argument("--itl-ms", type=float, default=20.0, help="upstream gap between events")
    ap.add_argument("--ttft-ms", type=float, default=20.0, help="upstream delay before the first event")
    ap.add_argument("--scrapers", type=int, default=2, help="scrapers (an HA pair: 2)")
    ap.add_argument("--scrape-every", type=float, default=2.0, help="seconds between one scraper's scrapes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=9, help="part 1: best of this many")
    ap.add_argument("--skip-cost", action="store_true", help="part 2 only")
    ap.add_argument("--serve-gateway", metavar="UPSTREAM", help=argparse.SUPPRESS)
    ap.add_argument("--way", default="new", help=argparse.SUPPRESS)
    ap.add_argument("--stats", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    large = args.config == "large"
    if args.serve_gateway:
        serve_gateway(args.serve_gateway, args.way, args.stats, large)
        return 0
    if not args.skip_cost:
        scrape_cost(args.repeats)

    import uvloop

    from servelens.process import ServerProcess

    boundaries = MANY_BOUNDARIES if large else DEFAULT_ISL_BOUNDARIES
    models = [f"model-{k}" for k in range(10 if large else 1)]
    isls = [b - 256 for b in boundaries] + [boundaries[-1] + 256]  # one per bucket
    ways = args.ways.split(",")
    if "new" not in ways:
        ways.insert(0, "new")  # the off phases run on it
    upstream = ServerProcess([])
    upstream.args = [sys.executable, str(HERE / "gateway_overhead.py"), "--serve-upstream", "0", "--ttft-ms",
                     str(args.ttft_ms), "--itl-ms", str(args.itl_ms)]
    with tempfile.TemporaryDirectory(prefix="scrape-stall-") as tmp, upstream:
        stats = {way: Path(tmp) / f"{way}.npy" for way in ways}
        procs = {}
        for way in ways:
            p = ServerProcess([])
            p.args = [sys.executable, __file__, "--serve-gateway", upstream.url, "--way", way, "--stats",
                      str(stats[way]), "--config", args.config]
            procs[way] = p.start()
        try:
            running = {w: (p.url, p.proc.pid) for w, p in procs.items() if p.proc is not None}
            phases = uvloop.run(measure(running, upstream.url, models, isls, args))
        finally:
            for p in procs.values():
                p.stop()
        beats = {way: np.load(stats[way]) for way in ways}
        spans = {way: np.load(stats[way].with_suffix(".spans.npy")) for way in ways}
    print(f"\n{args.config} configuration; {args.streams} streams x {args.tokens} events, {args.ttft_ms:g} ms to the "
          f"first, {args.itl_ms:g} ms apart; {args.scrapers} scrapers, each every {args.scrape_every:g} s, gzip; "
          f"{args.rounds} rounds x {args.requests} streams per way; fine edges: TTFT {len(MetricEdges().ttft_s)}, "
          f"ITL {len(MetricEdges().itl_s)}")
    report(phases, beats, spans)
    return 0


if __name__ == "__main__":
    sys.exit(main())
