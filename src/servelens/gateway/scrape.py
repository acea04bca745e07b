"""``GET /metrics`` without stalling the streams: the scrape in paced slices, gzip off the loop, and
the optional metrics listener (``--metrics-port``).

The gateway relays every stream on one event loop, so whatever a scrape does on it in one go is a
pause in every stream's inter-token gaps. A scrape here is three steps:

1. **Copy** (:func:`~servelens.core.snapshot.copy_model`): each model's numbers under the state's lock,
   one model per turn of the loop (~0.2-0.4 ms each at 33 ISL buckets and ~140 ``le`` edges).
   Histograms that did not change since the last scrape keep their copy.
2. **Format** (:class:`~servelens.prometheus.exposition.TextExposition`): series by series, with a pause
   after every :data:`SLICE_BYTES` of text (:data:`PAUSE_S`, or as long as the slice took, so the scrape
   has at most half of the loop's time). A series unchanged since the last scrape is not formatted again.
3. **Send**: with ``Accept-Encoding: gzip`` (what Prometheus sends) the text is compressed in a worker
   thread (zlib releases the GIL while it deflates, :data:`COMPRESS_BYTES` at a time); written in
   :data:`WRITE_BYTES` writes, each awaited. The thread keeps the default CPU priority: at a lower one,
   a host short of CPU would leave it unscheduled while the loop waits to get the GIL back from it.

Why paced slices on the loop rather than a thread: formatting is Python code, which holds the GIL. A
thread formatting the whole text takes the GIL whenever the loop waits for I/O, and the loop then waits
up to the interpreter's switch interval (5 ms) to get it back, at every wake-up while the thread runs.
In slices the longest step is one slice (well under a millisecond of CPU here), and the pause after it
leaves the streams at least half of the loop even on a host short of CPU, where a turn of the loop
alone (``asyncio.sleep(0)``) would let the scrape take most of it (``benchmarks/scrape_stall.py``:
ways ``new``, ``unpaced``, ``thread``).

With a metrics listener (``metrics_port``), ``/metrics`` is served on its own port (same process and
loop) and the API port answers 404 for it: the API port does not expose the metrics.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from servelens.core.snapshot import ModelSnapshot, StateSnapshot, copy_model
from servelens.gateway.config import GatewayConfig
from servelens.gateway.http import get_only
from servelens.prometheus import FrontendMetrics
from servelens.serving import listen_error

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SLICE_BYTES = 64 * 1024
"""Text formatted between two pauses (~0.2-0.7 ms of CPU here; one series is at most ~15 KB)."""
PAUSE_S = 0.001
"""Least pause after a slice (the loop's timer grain); a slice that took longer is followed by a pause
as long, so that a scrape never has more than half of the loop, even on a host short of CPU."""
WRITE_BYTES = 256 * 1024
"""Bytes per write to the client (each awaited, so a slow scraper holds no more than this buffered)."""
COMPRESS_BYTES = 1024 * 1024
"""Text compressed per zlib call (one GIL release each; joining a run holds the GIL ~0.1 ms)."""
GZIP_LEVEL = 1
"""zlib level: 11.6 MB of exposition to 0.49 MB in 20-30 ms of CPU; level 6 wrote ~13 % less for ~3x the CPU."""


def accepts_gzip(accept_encoding: str) -> bool:
    """True when an ``Accept-Encoding`` value accepts ``gzip`` (named, or ``*``, with a q above 0; a
    ``gzip;q=0`` refuses it even after ``*``). Prometheus sends ``Accept-Encoding: gzip``."""
    star = named = None
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        coding = coding.strip().lower()
        q = 1.0
        for param in params.split(";"):
            key, _, val = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(val)
                except ValueError:
                    q = 0.0
        if coding in ("gzip", "x-gzip"):
            named = q > 0
        elif coding == "*":
            star = q > 0
    return named if named is not None else bool(star)


def _joined(parts: Iterable[bytes], size: int) -> Iterator[bytes]:
    """``parts`` joined into runs of at least ``size`` bytes (a bigger part alone), in order."""
    run: list[bytes] = []
    n = 0
    for p in parts:
        run.append(p)
        n += len(p)
        if n >= size:
            yield b"".join(run)
            run, n = [], 0
    if run:
        yield b"".join(run)


def gzip_parts(parts: Iterable[bytes], level: int = GZIP_LEVEL) -> bytes:
    """The gzip member (RFC 1952) of ``parts`` laid end to end. Called in a worker thread: zlib
    releases the GIL while it compresses each :data:`COMPRESS_BYTES` run, and the thread takes the GIL
    back only between runs (each time, the loop may wait for it: a few times per scrape)."""
    z = zlib.compressobj(level, zlib.DEFLATED, 31)  # wbits 31: gzip header and trailer
    out = [z.compress(run) for run in _joined(parts, COMPRESS_BYTES)]
    out.append(z.flush())
    return b"".join(out)


class MetricsScrape:
    """The ``/metrics`` handler of a gateway (see the module docstring).

    Args:
        metrics: the metrics to serve (their :attr:`~servelens.prometheus.FrontendMetrics.text` writer
            and last snapshot are shared with :meth:`FrontendMetrics.exposition`).
    """

    def __init__(self, metrics: FrontendMetrics) -> None:
        self.metrics = metrics

    async def snapshot(self) -> StateSnapshot:
        """Every model copied under the lock, one per turn of the loop, then the rest."""
        m = self.metrics
        last = m.last_snapshot
        previous = {s.name: s for s in last.models} if last is not None else {}
        models: list[ModelSnapshot] = []
        for name in list(m.state.models):
            models.append(copy_model(m.state, name, previous.get(name)))
            await asyncio.sleep(0)
        return m.snapshot(models)

    async def text(self, snap: StateSnapshot) -> list[bytes]:
        """``snap``'s exposition in pieces, formatted :data:`SLICE_BYTES` at a time with a pause after
        each (:data:`PAUSE_S`, or as long as the slice took), then that of the collectors added to the
        metrics (:meth:`~servelens.prometheus.FrontendMetrics.add_collector`)."""
        parts: list[bytes] = []
        since = 0
        clock = time.perf_counter
        start = clock()
        for piece in self.metrics.text.pieces(snap):
            parts.append(piece)
            since += len(piece)
            if since >= SLICE_BYTES:
                since = 0
                await asyncio.sleep(max(PAUSE_S, clock() - start))
                start = clock()
        added = self.added_exposition()  # the gateway's connection metrics: a few lines
        if added:
            parts.append(added)
        return parts

    def added_exposition(self) -> bytes:
        """The exposition of the collectors added to the metrics (the gateway's connection metrics)."""
        return self.metrics.added_exposition()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """``GET /metrics``: Prometheus text exposition (format 0.0.4), gzip when the client accepts it."""
        parts = await self.text(await self.snapshot())
        headers = {"Content-Type": METRICS_CONTENT_TYPE, "Vary": "Accept-Encoding"}
        if accepts_gzip(request.headers.get("Accept-Encoding", "")):
            parts = [await asyncio.to_thread(gzip_parts, parts)]
            headers["Content-Encoding"] = "gzip"
        resp = web.StreamResponse(headers=headers)
        resp.content_length = sum(map(len, parts))
        await resp.prepare(request)
        if request.method != "HEAD":
            for run in _joined(parts, WRITE_BYTES):
                await resp.write(run)
        await resp.write_eof()
        return resp


@dataclass(frozen=True)
class MetricsListener:
    """The metrics listener of a gateway: ``GET /metrics`` alone at :attr:`url`."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        """``http://host:port/metrics``."""
        return f"http://{self.host}:{self.port}/metrics"

    async def close(self) -> None:
        """Stop listening (a scrape in progress is cut after aiohttp's shutdown timeout)."""
        await self.runner.cleanup()


async def start_metrics_listener(scrape: MetricsScrape, config: GatewayConfig,
                                 reuse_port: bool = False) -> MetricsListener:
    """Serve ``GET /metrics`` alone on ``config.metrics_host`` (default ``config.host``) and
    ``config.metrics_port`` (0: a free port); every other path is a 404. ``reuse_port``: bind with
    ``SO_REUSEPORT`` (each worker of a gateway listens on the same port). Raises OSError (one line)
    when the address cannot be listened on."""
    host = config.metrics_host if config.metrics_host is not None else config.host
    port = config.metrics_port if config.metrics_port is not None else 0
    app = web.Application()
    app.router.add_get("/metrics", scrape.handle)
    app.router.add_route("*", "/metrics", get_only)  # another method: an OpenAI error, not aiohttp's text
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0,
                           keepalive_timeout=config.client_timeout_s)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
        await site.start()
    except BaseException as exc:
        await runner.cleanup()
        if isinstance(exc, OSError):
            raise listen_error(host, port, exc) from None
        raise
    server: Any = site._server  # the bound socket is exposed only here
    shown = host if host not in ("0.0.0.0", "") else "127.0.0.1"
    return MetricsListener(runner, shown, int(server.sockets[0].getsockname()[1]))
