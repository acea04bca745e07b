"""Starting and stopping a gateway on a TCP port (used by the CLI and by :mod:`.testing`)."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import sys
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from servelens.gateway.app import Gateway
from servelens.gateway.config import GatewayConfig
from servelens.gateway.connections import (
    MAX_FIELD_BYTES,
    MAX_HEADERS,
    MAX_REQUEST_LINE_BYTES,
    ConnectionGuard,
    GuardedSite,
    file_budget,
)
from servelens.gateway.published import Connections, MergedScrape, StatePublisher, WorkerContext
from servelens.gateway.scrape import MetricsListener, start_metrics_listener
from servelens.gateway.upstream import redacted_url
from servelens.prometheus import FrontendMetrics
from servelens.prometheus.connections import ConnectionsCollector
from servelens.serving import listen_error, open_files, raise_open_files_limit, serve_until_signal

CUT_S = 0.5
"""After the drain on shutdown, how long aiohttp waits for a handler before cancelling it (twice)."""
IDLE_GRACE_S = 1.0
"""On shutdown, how long keep-alive connections idle when the drain began stay open (seconds, at most the
shutdown timeout): a request a client sent on one just then is answered (``Connection: close``), not lost.
Well above a round trip on the networks a gateway serves, well below any shutdown timeout."""
GRACE_CHECK_S = 0.05
"""During that grace, how often the gateway looks whether every connection has gone (the grace then ends)."""

log = logging.getLogger("servelens.gateway")


@dataclass(frozen=True)
class RunningGateway:
    """A gateway listening on ``url`` (``http://host:port``); stop it with :meth:`close`."""

    gateway: Gateway
    runner: web.AppRunner
    host: str
    port: int
    guard: ConnectionGuard | None = None
    """The connection budget and the accept failures counted (see :mod:`.connections`)."""
    previous_handler: Any = None
    """The event loop's exception handler before the gateway set its own (restored by :meth:`close`)."""
    metrics_listener: MetricsListener | None = None
    publisher: StatePublisher | None = None
    """A worker's state publisher (:mod:`.published`); None for a gateway of one process."""
    cutting: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by :meth:`cut`: the drain of :meth:`close` ends at once."""

    @property
    def url(self) -> str:
        """Base URL of the gateway (``http://127.0.0.1:<port>``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Where the gateway serves ``/metrics``: its metrics listener's, or on :attr:`url`."""
        return self.metrics_listener.url if self.metrics_listener is not None else f"{self.url}/metrics"

    @property
    def metrics(self) -> FrontendMetrics:
        """The metrics the gateway records into."""
        return self.gateway.metrics

    def cut(self) -> None:
        """Cut now: a :meth:`close` draining (or about to) stops waiting for the requests in flight, which
        are cut and counted ``cancelled`` as after ``shutdown_timeout_s`` (a second SIGTERM/SIGINT)."""
        self.cutting.set()

    async def close(self) -> None:
        """Stop listening; let requests in flight run to their end for up to the config's
        ``shutdown_timeout_s``; cut the rest (counted ``cancelled``, their upstream requests closed);
        end the app (closes the upstream session and the request log).

        Keep-alive connections during the drain: every answer prepared from its start says ``Connection:
        close`` (the client opens its next connection elsewhere: another worker, another gateway behind
        the load balancer), and a connection idle when it began stays open :data:`IDLE_GRACE_S` (at most
        the shutdown timeout), so that a request its client sent on it just then is answered, not lost
        (``Can not write request body`` at the client, in no ``requests_total``). Then the idle ones are
        closed, and one busy with a request closes after its answer. What remains is HTTP/1.1's own race:
        a request sent on an idle connection just as it closes (after the grace, or as an answer that
        began before the drain, saying keep-alive, ends) meets the close; a client resending it on a new
        connection is answered by another process.

        aiohttp's own shutdown waits its timeout for a handler, then again after asking it to stop
        (which a handler awaiting its upstream does not notice): 2 x 60 s by default. Here it gets
        :data:`CUT_S` for each once the drain is over."""
        loop = asyncio.get_running_loop()
        timeout = self.gateway.config.shutdown_timeout_s
        self.gateway.draining = True  # answers from now on say Connection: close
        for site in list(self.runner.sites):
            await site.stop()  # no new connections
        server = self.runner.server
        drain = asyncio.ensure_future(self.gateway.drain(timeout))
        cutting = asyncio.ensure_future(self.cutting.wait())
        try:
            grace_end = loop.time() + min(IDLE_GRACE_S, timeout)
            while server is not None and server.connections and not cutting.done():
                left = grace_end - loop.time()
                if left <= 0:
                    break
                await asyncio.wait({cutting}, timeout=min(left, GRACE_CHECK_S))  # until no connection is left
            pre_shutdown = getattr(server, "pre_shutdown", None)
            if pre_shutdown is not None:
                pre_shutdown()  # idle connections close now, busy ones after their answer
            await asyncio.wait({drain, cutting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cutting.cancel()
            drain.cancel()
        if not drain.done() or drain.cancelled() or not drain.result():
            # aiohttp's cleanup still gives each handler CUT_S, so some may yet end on their own
            why = "second signal" if self.cutting.is_set() else "shutdown timeout over"
            log.warning("%s with %d request(s) in flight: those not done within %.1f s more are cut and counted "
                        "cancelled", why, self.gateway.active, CUT_S)
        await self.runner.cleanup()
        if self.metrics_listener is not None:  # scraped to the end, the drain included
            await self.metrics_listener.close()
        if self.guard is not None:
            asyncio.get_running_loop().set_exception_handler(self.previous_handler)
        if self.publisher is not None:
            self.publisher.write()  # the requests cut at the end included


async def start_gateway(config: GatewayConfig, metrics: FrontendMetrics | None = None,
                        worker: WorkerContext | None = None) -> RunningGateway:
    """Start a gateway in the running loop on ``config.host:config.port`` (0: a free port).

    ``worker``: this process is one worker of several (:mod:`.workers`): it listens with
    ``SO_REUSEPORT``, publishes its state and serves the sum over the workers on ``/metrics``
    (:mod:`.published`).

    Returns once it listens and the first model discovery poll has ended. Handlers are
    cancelled when their client disconnects (so the upstream request is closed at once); a client
    connection waiting for its request head longer than ``client_timeout_s`` is closed.
    Raises OSError when the address cannot be bound; ValueError for a bad tokenizer file.
    """
    gateway = Gateway(config, metrics)
    # keepalive_timeout: aiohttp closes a connection without a complete request head after it (from
    # the connection's start or the last response's end); its own default is an hour. lingering_time:
    # after answering a request whose body it did not read (/health, a 405), aiohttp reads the rest for
    # up to 10 s before closing: no longer than a client may be silent
    runner = web.AppRunner(
        gateway.app, handler_cancellation=True, access_log=None, shutdown_timeout=CUT_S,
        keepalive_timeout=config.client_timeout_s, lingering_time=min(10.0, config.client_timeout_s),
        max_line_size=MAX_REQUEST_LINE_BYTES, max_field_size=MAX_FIELD_BYTES, max_headers=MAX_HEADERS,
    )
    await runner.setup()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    guard = ConnectionGuard(file_budget(soft, hard, open_files() or 0))
    gateway.metrics.add_collector(ConnectionsCollector(lambda: guard.failures, guard.budget.max_connections,
                                                        lambda: gateway.upstream_retries))
    publisher: StatePublisher | None = None
    if worker is not None:
        publisher = StatePublisher(worker.directory, worker.key, gateway.metrics, lambda: Connections(
            dict(guard.failures), guard.budget.max_connections, gateway.upstream_retries))
        gateway.accounting.on_change = publisher.changed
        gateway.scrape = MergedScrape(gateway.metrics, publisher)
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(guard.exception_handler(previous))
    try:
        site = GuardedSite(runner, config.host, config.port, guard, backlog=1024, reuse_port=worker is not None)
        await site.start()
    except BaseException as exc:
        await runner.cleanup()
        loop.set_exception_handler(previous)
        if isinstance(exc, OSError):
            raise listen_error(config.host, config.port, exc) from None
        raise
    server: Any = site._server  # aiohttp exposes the bound socket only here (asyncio or uvloop Server)
    port = server.sockets[0].getsockname()[1]
    host = config.host if config.host not in ("0.0.0.0", "") else "127.0.0.1"
    try:
        listener = (await start_metrics_listener(gateway.scrape, config, reuse_port=worker is not None)
                    if config.metrics_port is not None else None)
    except BaseException:
        await runner.cleanup()
        loop.set_exception_handler(previous)
        raise
    if publisher is not None:
        publisher.write()  # its models at zero, before it says it is ready
    return RunningGateway(gateway, runner, host, int(port), guard, previous, listener, publisher)


async def serve_forever(config: GatewayConfig) -> None:
    """Run until SIGTERM/SIGINT; print ``servelens gateway listening on URL`` once ready. The soft
    open-files limit is raised to the hard one first (:func:`~servelens.serving.raise_open_files_limit`)."""
    raise_open_files_limit()
    running = await start_gateway(config)
    print(startup_summary(running), file=sys.stderr, flush=True)
    await serve_until_signal("gateway", running.url, running.close, cut=running.cut)


def startup_summary(running: RunningGateway) -> str:
    """One line for stderr at start: where requests go, the models known so far, the ISL buckets, the
    metric prefix, the histograms' edges with the series per model and the models they allow, and the
    open-files limit with the streams it allows (the ready line on stdout stays
    exactly ``servelens gateway listening on URL``)."""
    cfg = running.gateway.config
    models = [m if m.isprintable() else repr(m) for m in sorted(running.gateway.router.routes)]  # one line
    metrics = running.metrics
    buckets = metrics.isl_buckets
    edges = metrics.state.edges
    b = running.guard.budget if running.guard is not None else None
    return (f"servelens gateway: upstream {', '.join(redacted_url(u) for u in cfg.upstreams)}; "
            f"models {', '.join(models) if models else 'none yet (polling /v1/models)'}; "
            f"ISL buckets {', '.join(buckets.labels) if buckets else 'off'}; "
            + (f"uncached buckets {', '.join(metrics.uncached_buckets.labels)}; " if metrics.uncached_buckets else "")
            + f"metrics {cfg.metrics_prefix}_*{' (by-ISL only)' if cfg.by_isl_only else ''}"
            f"{f' at {running.metrics_url}' if running.metrics_listener is not None else ''}, "
            f"{len(edges.ttft_s)} TTFT, {len(edges.itl_s)} ITL and {len(edges.duration_s)} duration le edges, "
            f"{metrics.series_per_model:,} series "
            f"per model, at most {metrics.max_models} models"
            + (f"; open files {b.soft} (hard {b.hard}): up to {b.max_connections} streams" if b else ""))


async def serve_worker(config: GatewayConfig, worker: WorkerContext) -> None:
    """One worker of a gateway of several (:mod:`.workers`): start, say ``ready <start-up summary>`` on
    ``worker.ready_fd``, serve until SIGTERM/SIGINT, stop as :func:`serve_forever` does."""
    running = await start_gateway(config, worker=worker)

    def ready() -> None:
        os.write(worker.ready_fd, f"ready {startup_summary(running)}\n".encode())

    await serve_until_signal("gateway", running.url, running.close, announce=ready, cut=running.cut)


def run_loop(main: Coroutine[Any, Any, None], use_uvloop: bool = True) -> None:
    """Run ``main`` to its end on uvloop when installed (and wanted), else asyncio."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            uvloop = None  # type: ignore[assignment]
        if uvloop is not None:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(main)
            return
    asyncio.run(main)


def run(config: GatewayConfig, use_uvloop: bool = True) -> None:
    """Blocking entry point for the CLI: uvloop when installed (and wanted), else asyncio; with
    ``config.workers`` above 1, a supervisor and that many worker processes (:mod:`.workers`)."""
    if config.worker_count > 1:
        from servelens.gateway.workers import Supervisor

        Supervisor(config, use_uvloop).run()
        return
    run_loop(serve_forever(config), use_uvloop)
