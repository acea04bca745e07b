"""The gateway application: its state, its routes and its lifecycle.

Routes, and the module that answers each:

* ``POST /v1/chat/completions``, ``POST /v1/completions``: relayed and measured, streaming and unary
  (:mod:`.measured`: the request flow, top to bottom; :mod:`.relay`: a stream, chunk by chunk, byte for
  byte, the only change being the removal of usage the gateway injected, :mod:`.usage`;
  :mod:`.accounting`: how each request is counted, once).
* ``GET /metrics`` (on the metrics listener instead, with ``metrics_port``): :mod:`.scrape`; in a worker
  of ``--workers N``, the sum over the workers (:mod:`.published`).
* ``GET /health``, ``GET /ready``, ``GET /v1/models`` (merged over upstreams when
  models are mapped to several), and the 405 for other methods on a measured path, ``/metrics``,
  ``/health`` or ``/ready`` (OpenAI errors, never relayed): :mod:`.admin`.
* Any other path (other ``/v1/*`` and the engine's own endpoints): relayed unmeasured,
  :mod:`.passthrough`.

Measured requests go upstream through :mod:`.upstream` (a keep-alive HTTP/1.1 client whose connection
callback meters each read and writes it to the client at once); the other routes use aiohttp's
client. Headers, error replies and request bodies: :mod:`.http`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, MultiMapping

from servelens.gateway.accounting import Accounting
from servelens.gateway.admin import AdminEndpoints
from servelens.gateway.config import GatewayConfig
from servelens.gateway.http import get_only, response_headers
from servelens.gateway.measured import MEASURED_PATHS, MeasuredEndpoints
from servelens.gateway.models import ModelRouter
from servelens.gateway.passthrough import Passthrough
from servelens.gateway.prompt import PromptCounter
from servelens.gateway.requestlog import RequestLog
from servelens.gateway.scrape import MetricsScrape
from servelens.gateway.upstream import UpstreamClient, redacted_url
from servelens.prometheus import FrontendMetrics

log = logging.getLogger("servelens.gateway")

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("servelens_gateway")


class Gateway:
    """Gateway state and handlers; :attr:`app` is the aiohttp application.

    Args:
        config: the configuration.
        metrics: metrics to record into (default: built from ``config``: prefix, buckets,
            edges, ``max_models``, ``max_series``, stock families unless ``by_isl_only``).

    Raises ValueError for a tokenizer that cannot be loaded; OSError for a request log that
    cannot be opened.
    """

    def __init__(self, config: GatewayConfig, metrics: FrontendMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or FrontendMetrics(
            prefix=config.metrics_prefix,
            isl_buckets=config.isl_buckets,
            uncached_buckets=config.uncached_buckets,
            edges=config.metric_edges,
            max_models=config.max_models,
            max_series=config.max_series,
            stock=not config.by_isl_only,
            slo=config.slo,
        )
        self.router = ModelRouter(config, self.metrics)
        self.prompt_counter = PromptCounter(config.tokenizer, config.chat_template) if config.tokenizer else None
        self.accounting = Accounting(
            self.metrics, RequestLog(config.request_log, config.request_log_chunks) if config.request_log else None)
        self._upstream_bases = tuple(u.rstrip("/") for u in config.upstreams)
        self._session: aiohttp.ClientSession | None = None
        self._upstream: UpstreamClient | None = None
        self.measured = MeasuredEndpoints(self)
        self.passthrough = Passthrough(self)
        self.admin = AdminEndpoints(self)
        self.scrape = MetricsScrape(self.metrics)
        self.draining = False
        """Shutting down: every answer prepared from now on says ``Connection: close`` (see
        :meth:`~servelens.gateway.server.RunningGateway.close`)."""
        self.app = self._build_app()

    # -- lifecycle -------------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app[GATEWAY_KEY] = self
        app.router.add_post("/v1/chat/completions", self.measured.chat_completions)
        app.router.add_post("/v1/completions", self.measured.completions)
        for path in MEASURED_PATHS:  # other methods: an OpenAI error, not text
            app.router.add_route("*", path, self.admin.post_only)
        app.router.add_get("/v1/models", self.admin.list_models)
        app.router.add_get("/metrics", self._metrics if self.config.metrics_port is None
                           else self.admin.metrics_elsewhere)
        app.router.add_get("/health", self.admin.health)
        app.router.add_get("/ready", self.admin.ready)
        for path in ("/health", "/ready"):  # other methods: an OpenAI error, not aiohttp's text
            app.router.add_route("*", path, get_only)
        app.router.add_route("*", "/metrics", get_only if self.config.metrics_port is None
                             else self.admin.metrics_elsewhere)
        app.router.add_route("*", "/v1/{tail:.*}", self.passthrough.handle)
        # the engine's other endpoints (vLLM's /tokenize, /detokenize, /version, ...): relayed too, so
        # the gateway stays invisible; the gateway's own /metrics, /health and /ready take precedence
        app.router.add_route("*", "/{tail:.*}", self.passthrough.handle)
        app.cleanup_ctx.append(self._lifecycle)
        app.on_response_prepare.append(self._closing_when_draining)
        return app

    async def _closing_when_draining(self, request: web.Request, response: web.StreamResponse) -> None:
        """While draining, an answer says ``Connection: close``: its client's next request goes to a
        process that is not stopping."""
        if self.draining:
            response.force_close()  # the connection closes after this answer
            response.headers["Connection"] = "close"  # (aiohttp made the head before this hook)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        return await self.scrape.handle(request)  # looked up per scrape: a worker replaces it (.published)

    async def _lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        cfg = self.config
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            cookie_jar=aiohttp.DummyCookieJar(),  # a proxy keeps no cookies (and skips their cost)
        )
        # measured requests go through the gateway's own HTTP/1.1 client (see gateway.upstream)
        self._upstream = UpstreamClient(connect_timeout_s=cfg.connect_timeout_s, read_timeout_s=cfg.read_timeout_s,
                                        headers_timeout_s=cfg.response_timeout_s)
        result = await self.router.poll(self._session)
        if result is not None and not result.ok:
            log.warning("cannot list models at %s yet: %s (will retry)",
                        ", ".join(map(redacted_url, cfg.upstreams)), result.error)
        refresher = asyncio.create_task(self.router.refresh_forever(self._session))
        try:
            yield
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
            await self._session.close()
            await self._upstream.close()
            if self.accounting.request_log is not None:
                self.accounting.request_log.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The upstream client session (exists while the app runs)."""
        if self._session is None:
            raise RuntimeError("gateway is not running")
        return self._session

    @property
    def upstream(self) -> UpstreamClient:
        """The client of the measured requests (exists while the app runs)."""
        if self._upstream is None:
            raise RuntimeError("gateway is not running")
        return self._upstream

    @property
    def upstream_retries(self) -> int:
        """Measured requests resent on a fresh upstream connection (see :attr:`UpstreamClient.retries`)."""
        return self._upstream.retries if self._upstream is not None else 0

    def response_headers(self, headers: MultiMapping[str]) -> CIMultiDict[str]:
        """Upstream response headers as the client gets them (:func:`~.http.response_headers`, with a
        ``Location`` into an upstream made relative to the gateway)."""
        return response_headers(headers, self._upstream_bases)

    # -- counting (see gateway.accounting) ---------------------------------------------------
    @property
    def active(self) -> int:
        """Requests to the measured endpoints being answered now."""
        return self.accounting.active

    @property
    def finished_total(self) -> int:
        """Requests to the measured endpoints counted in ``requests_total`` so far."""
        return self.accounting.finished_total

    async def drain(self, timeout: float) -> bool:
        """:meth:`Accounting.drain <servelens.gateway.accounting.Accounting.drain>`: wait until no
        measured request is being answered, at most ``timeout`` seconds; True when none is."""
        return await self.accounting.drain(timeout)

    async def wait_finished(self, n: int, timeout: float = 30.0) -> None:
        """:meth:`Accounting.wait_finished <servelens.gateway.accounting.Accounting.wait_finished>`: wait
        until at least ``n`` measured requests were counted. Raises TimeoutError."""
        await self.accounting.wait_finished(n, timeout)


def build_app(config: GatewayConfig, metrics: FrontendMetrics | None = None) -> web.Application:
    """The aiohttp application of a new :class:`Gateway` (its :data:`GATEWAY_KEY` holds the gateway).

    Run it as :func:`~servelens.gateway.server.start_gateway` does: an ``AppRunner`` with
    ``handler_cancellation=True`` (a client that leaves cancels its request, which closes the upstream
    request) and ``keepalive_timeout=config.client_timeout_s`` (connections without a whole request
    head are closed); the body timeout is the application's own."""
    return Gateway(config, metrics).app
