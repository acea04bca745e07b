"""The gateway: an aiohttp reverse proxy for OpenAI-compatible servers that measures every request.

Routes:

* ``POST /v1/chat/completions``, ``POST /v1/completions``: relayed and measured (streaming and
  unary). Streams are written to the client chunk by chunk as they arrive, byte for byte;
  the only change is the removal of usage the gateway injected (:mod:`servelens.gateway.usage`).
* ``GET /v1/models``: the upstream's list (merged over upstreams when models are mapped to
  several); other ``/v1/*`` paths: passed through unmeasured.
* ``GET /metrics`` (Prometheus text), ``GET /health`` (the gateway), ``GET /ready`` (every
  upstream answers ``/v1/models`` with a status below 500).

Measured requests go upstream through :mod:`servelens.gateway.upstream` (a keep-alive HTTP/1.1
client whose connection callback meters each read and writes it to the client at once); the other
routes use aiohttp's client.

Request and response headers are forwarded except hop-by-hop ones (and a request's
``Content-Encoding``: aiohttp decodes the body, which goes upstream decoded); ``Authorization`` passes
through and is never logged. Measured requests ask the upstream for an uncompressed body.

Outcomes, counted once each in ``requests_total`` (Dynamo's ``error_type`` vocabulary): a body that
cannot be read (bad ``Content-Encoding``), invalid JSON (nesting too deep included), a missing ``model``
or a ``stream`` that is not a boolean -> 400 ``validation``; body over ``max_body_bytes`` -> 413
``validation``; a body that stops arriving for ``client_timeout_s`` -> 408 ``validation``; unknown model
-> 404 ``not_found`` under ``model="unknown_model"`` (502 ``unavailable`` there when the upstream's
model list cannot be fetched); upstream unreachable -> 502 ``unavailable``; no response headers (or
body, for unary) within ``response_timeout_s``, or silence over ``read_timeout_s`` -> 504
``response_timeout``; a unary or error body over :data:`~servelens.gateway.upstream.MAX_BODY_BYTES` ->
502 ``backend_error``; upstream 400/4xx -> ``validation``, 404 -> ``not_found``, 429 and 503 ->
``overload``, other 5xx -> ``backend_error`` (the upstream's status and body are relayed); an ``error``
object or malformed chunk inside a 200 stream, or a body in a content coding other than gzip or
deflate (which are decoded) or that does not decode -> ``backend_error`` (a whole ``application/json`` or
``text/html`` reply to a stream request is measured as a unary reply); a stream ending with neither
``finish_reason`` nor ``[DONE]``, or cut by the upstream -> ``truncated_stream`` (a cut is passed on:
the client connection is closed without the final chunk); the client going away -> ``cancelled`` (the
upstream request is closed at once, so the engine stops generating); a bug of ours -> 500 ``internal``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, MultiMapping
from yarl import URL

from servelens.core.openai import decode_json, decode_json_strictness, error_body, parse_response
from servelens.core.state import LiveRequest
from servelens.core.status import error_type_for_status
from servelens.core.timing import RequestRecord
from servelens.gateway.config import GatewayConfig
from servelens.gateway.models import MAX_MODEL_LIST_BYTES, ModelRouter, read_capped
from servelens.gateway.prompt import PromptCounter
from servelens.gateway.relay import StreamMeter
from servelens.gateway.requestlog import RequestLog, RequestLogEntry
from servelens.gateway.upstream import UpstreamClient, UpstreamError, UpstreamResponse, redacted_url
from servelens.gateway.usage import (
    STRIP_CONTINUOUS,
    STRIP_CONTINUOUS_NULL,
    STRIP_NONE,
    Injection,
    plan_injection,
)
from servelens.prometheus import FrontendMetrics
from servelens.serving import unreadable_body

log = logging.getLogger("servelens.gateway")

_now = time.perf_counter_ns
_decode_json = decode_json  # raises msgspec.DecodeError, also for nesting too deep

HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
        "te", "trailer", "trailers", "transfer-encoding", "upgrade",
    }
)
# aiohttp hands the gateway a request body already decoded (gzip, deflate, br): it goes upstream as is
_REQ_DROP = HOP_BY_HOP | {"host", "content-length", "expect", "content-encoding"}
_RESP_DROP = HOP_BY_HOP | {"content-length"}
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CLOSING_CHECK_S = 0.05
"""While the relay waits for a slow client to drain, how often it checks that the client is still there
(seconds): a client gone with unread data is noticed within this, and the upstream request closed."""

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("servelens_gateway")
_MEASURED_PATHS = {"/v1/chat/completions": "chat_completions", "/v1/completions": "completions"}
_REJECTED = (400, 422)
"""Statuses of an upstream that refuses a request's content: OpenAI's and vLLM's 400, and 422, which
FastAPI answers for a field its model forbids (``extra="forbid"``)."""


def _dropped(headers: MultiMapping[str], base: frozenset[str]) -> frozenset[str]:
    conn = headers.get("Connection")
    if not conn:
        return base
    return base | {t.strip().lower() for t in conn.split(",") if t.strip()}


def forward_request_headers(headers: CIMultiDictProxy[str], measured: bool) -> CIMultiDict[str]:
    """Client request headers to send upstream: hop-by-hop, Host and Content-Length removed.

    ``measured``: also ask for an uncompressed body (the gateway reads the stream).
    """
    drop = _dropped(headers, _REQ_DROP)
    out: CIMultiDict[str] = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)
    if measured:
        out["Accept-Encoding"] = "identity"
        if "Content-Type" not in out:
            out["Content-Type"] = "application/json"
    return out


def forward_response_headers(headers: MultiMapping[str]) -> CIMultiDict[str]:
    """Upstream response headers to send to the client: hop-by-hop and Content-Length removed."""
    drop = _dropped(headers, _RESP_DROP)
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


def openai_error(
    status: int, message: str, type_: str, code: str | int | None = None, param: str | None = None
) -> web.Response:
    """An OpenAI-format error response ``{"error": {"message", "type", "param", "code"}}``."""
    return web.Response(
        status=status, body=error_body(message, type_, code, param), content_type="application/json"
    )


class ClientTooSlow(Exception):
    """The client's request body stopped arriving (see :func:`read_body`)."""


async def read_body(request: web.Request, max_bytes: int, silence_s: float) -> bytes:
    """The whole request body, as ``request.read()`` gives it, with a bound on a stalled client.

    A body already received whole (the common case: it came with the request head) is returned at
    once. Otherwise the client may be silent at most ``silence_s`` seconds between two reads (nginx's
    ``client_body_timeout`` semantics, not a bound on the whole transfer). Progress is counted in the
    body's bytes as received (before ``Content-Encoding`` decoding: gzip headers count; such bytes
    that decode to nothing yet restart the wait when it runs out, so the silence allowed is then up
    to twice ``silence_s``), not in chunked framing: size lines trickled without data are silence. A
    chunked body whose framing breaks after the head also ends here (aiohttp neither fails nor feeds
    the body then). ``max_bytes`` bounds the body both decoded and as sent.

    Raises :class:`ClientTooSlow` when a wait runs out; ``web.HTTPRequestEntityTooLarge`` past
    ``max_bytes``; ``web.RequestPayloadError`` for a body that cannot be read (broken chunked framing,
    a bad ``Content-Encoding``); ``ConnectionError``/``CancelledError`` when the client goes away.
    """
    content = request.content
    if content.is_eof():
        return await request.read()
    parts: list[bytes] = []
    size = 0
    while True:
        seen = content.total_raw_bytes
        if max(size, seen) > max_bytes:  # decoded, or as sent (compressed)
            raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=max(size, seen))
        try:
            async with asyncio.timeout(silence_s):
                part = await content.readany()
        except TimeoutError:
            if content.total_raw_bytes == seen:
                raise ClientTooSlow(f"the request body stopped arriving for {silence_s:g} s") from None
            continue  # compressed bytes came that decode to nothing yet: wait on
        if not part:
            return b"".join(parts)
        size += len(part)
        parts.append(part)


@dataclass
class _Outcome:
    """Mutable result of one measured request, filled in as it goes."""

    status: str = "error"
    error_type: str = "internal"
    http_status: int = 500
    upstream_request_id: str | None = None
    osl: int | None = None
    osl_source: str = "usage"
    cached_tokens: int | None = None
    isl_source: str = "unknown"

    def fail(self, error_type: str, http_status: int) -> None:
        self.status = "error"
        self.error_type = error_type
        self.http_status = http_status


class _UpstreamFailed(Exception):
    """The upstream could not be reached or did not answer in time (before any response)."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


class Gateway:
    """Gateway state and handlers; :attr:`app` is the aiohttp application.

    Args:
        config: the configuration.
        metrics: metrics to record into (default: built from ``config``: prefix, buckets,
            ``max_models``, stock families unless ``by_isl_only``).

    Raises ValueError for a tokenizer that cannot be loaded; OSError for a request log that
    cannot be opened.
    """

    def __init__(self, config: GatewayConfig, metrics: FrontendMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or FrontendMetrics(
            prefix=config.metrics_prefix,
            isl_buckets=config.isl_buckets,
            max_models=config.max_models,
            stock=not config.by_isl_only,
        )
        self.router = ModelRouter(config, self.metrics)
        self.prompt_counter = PromptCounter(config.tokenizer) if config.tokenizer else None
        self.request_log = RequestLog(config.request_log) if config.request_log else None
        # per upstream, learned in "auto" mode: may stream_options / continuous_usage_stats be sent
        self.stream_options_ok: dict[str, bool] = {}
        self.continuous_ok: dict[str, bool] = {}
        # per upstream: sends "usage": null on chunks of an include_usage stream (None: not known yet)
        self.usage_null: dict[str, bool] = {}
        self._session: aiohttp.ClientSession | None = None
        self._upstream: UpstreamClient | None = None
        self._urls: dict[tuple[str, str], URL] = {}
        self.finished_total = 0
        """Requests to the measured endpoints counted in ``requests_total`` so far."""
        self.active = 0
        """Requests to the measured endpoints being answered now."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._finished_event: asyncio.Event | None = None
        self._upstream_bases = tuple(u.rstrip("/") for u in config.upstreams)
        self.app = self._build_app()

    # -- lifecycle -------------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app[GATEWAY_KEY] = self
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        for path in ("/v1/chat/completions", "/v1/completions"):  # other methods: an OpenAI error, not text
            app.router.add_route("*", path, self._post_only)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_route("*", "/v1/{tail:.*}", self.passthrough)
        # the engine's other endpoints (vLLM's /tokenize, /detokenize, /version, ...): relayed too, so
        # the gateway stays invisible; the gateway's own /metrics, /health and /ready take precedence
        app.router.add_route("*", "/{tail:.*}", self.passthrough)
        app.cleanup_ctx.append(self._lifecycle)
        return app

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
            if self.request_log is not None:
                self.request_log.close()

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

    # -- plain endpoints -------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        """``GET /health``: the gateway itself is up."""
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        """``GET /ready``: 200 when every upstream answers ``/v1/models`` below 500, else 503."""

        async def probe(url: str) -> str:
            try:
                async with asyncio.timeout(2.0), self.session.get(f"{url}/v1/models") as resp:
                    # the status is the answer: the body is not read (the connection is not reused)
                    return "ok" if resp.status < 500 else f"HTTP {resp.status}"
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                return f"unreachable: {type(exc).__name__}"

        ups = self.config.upstreams
        states = await asyncio.gather(*(probe(u) for u in ups))
        ok = all(s == "ok" for s in states)
        return web.json_response(
            {"status": "ready" if ok else "not ready",
             "upstreams": {redacted_url(u): st for u, st in zip(ups, states, strict=True)}},
            status=200 if ok else 503,
        )

    async def metrics_handler(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text exposition of the gateway's metrics."""
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def list_models(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/models``: passed through (one upstream) or merged (models on several)."""
        if len(self.config.upstreams) == 1:
            return await self.passthrough(request)
        data: list[dict[str, Any]] = []
        seen: set[str] = set()
        headers = forward_request_headers(request.headers, measured=False)
        for url in self.config.upstreams:
            try:
                async with asyncio.timeout(5.0), self.session.get(f"{url}/v1/models", headers=headers) as resp:
                    obj = _decode_json(await read_capped(resp, MAX_MODEL_LIST_BYTES)) if resp.status == 200 else {}
            except (aiohttp.ClientError, OSError, TimeoutError, msgspec.DecodeError, ValueError):
                obj = {}
            entries = obj.get("data") if isinstance(obj, dict) else None
            for e in entries if isinstance(entries, list) else []:
                mid = e.get("id") if isinstance(e, dict) else None
                if isinstance(mid, str) and self.router.lookup(mid) == url and mid not in seen:
                    seen.add(mid)
                    data.append(e)
        for name in self.router.routes:
            if name not in seen:
                data.append({"id": name, "object": "model", "owned_by": "servelens"})
        return web.json_response({"object": "list", "data": data})

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        """Any other request (``/v1/*`` and the engine's own paths): forwarded unmeasured (routed by
        ``model`` when mapped). A POST whose decoded path is a measured one (``/v1/chat%2Fcompletions``:
        the engine's server decodes it so) is measured. A redirect is relayed, not followed."""
        if request.method == "POST":
            endpoint = _MEASURED_PATHS.get(request.path)
            if endpoint is not None:
                return await self._tracked(request, endpoint)
        try:
            body = await read_body(request, self.config.max_body_bytes, self.config.client_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            return self._too_large()
        except web.RequestPayloadError as exc:
            return self._unreadable(request, exc)
        except ClientTooSlow as exc:
            return await self._too_slow(request, exc)
        upstream = self.config.upstream or self.config.upstreams[0]
        if body and len(self.config.upstreams) > 1:
            with contextlib.suppress(msgspec.DecodeError):
                obj = _decode_json(body)
                if isinstance(obj, dict) and isinstance(obj.get("model"), str):
                    upstream = self.router.lookup(obj["model"]) or upstream
        headers = forward_request_headers(request.headers, measured=False)
        try:
            async with asyncio.timeout(self.config.response_timeout_s):
                # the request target exactly as the client sent it (no decoding, no dot-segment
                # resolution: the upstream sees the same path and query)
                up = await self.session.request(
                    request.method, URL(upstream + request.raw_path, encoded=True), data=body or None,
                    headers=headers, allow_redirects=False,
                )
        except TimeoutError:
            return openai_error(504, "upstream did not answer in time", "server_error", "upstream_timeout")
        except (aiohttp.ClientError, OSError) as exc:
            return openai_error(502, f"upstream unreachable: {type(exc).__name__}", "server_error",
                                "upstream_unavailable")
        try:
            resp = web.StreamResponse(status=up.status, reason=up.reason, headers=self._response_headers(up.headers))
            await resp.prepare(request)
            while True:
                try:
                    data = await up.content.readany()
                except (aiohttp.ClientError, OSError, TimeoutError):
                    request_gone(request)
                    return resp
                if not data:
                    break
                await resp.write(data)
            await resp.write_eof()
            return resp
        except ConnectionError:  # the client went away (a write failed)
            request_gone(request)
            return resp
        finally:
            up.close()

    async def _post_only(self, request: web.Request) -> web.Response:
        """Any method but POST on a measured path: 405 in the OpenAI error format."""
        resp = openai_error(405, f"{request.method} is not allowed on {request.path}; use POST",
                            "invalid_request_error", "method_not_allowed")
        resp.headers["Allow"] = "POST"
        return resp

    # -- measured endpoints ----------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions`` (measured)."""
        return await self._tracked(request, "chat_completions")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions`` (measured)."""
        return await self._tracked(request, "completions")

    async def _tracked(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        self.active += 1
        self._idle.clear()
        try:
            return await self._measured(request, endpoint)
        finally:
            self.active -= 1
            if not self.active:
                self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Wait until no request to a measured endpoint is being answered, at most ``timeout`` seconds;
        True when none is (used on shutdown, see ``shutdown_timeout_s``)."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def _too_large(self) -> web.Response:
        return openai_error(
            413, f"request body is larger than {self.config.max_body_bytes} bytes", "invalid_request_error",
            "request_too_large",
        )

    @staticmethod
    async def _too_slow(request: web.Request, exc: ClientTooSlow) -> web.Response:
        """408 for a stalled request body, sent now; then the connection is closed at once (aiohttp
        would first wait up to 10 s more for the rest of the body, its "lingering close")."""
        resp = openai_error(408, str(exc), "invalid_request_error", "request_timeout")
        resp.force_close()
        with contextlib.suppress(ConnectionError):
            await resp.prepare(request)
            await resp.write_eof()
        request.protocol.force_close()  # closes the transport once what was written has gone out
        return resp

    @staticmethod
    def _unreadable(request: web.Request, exc: web.RequestPayloadError) -> web.Response:
        """The request body could not be read (a bad Content-Encoding, a broken chunked body)."""
        return openai_error(400, f"cannot read the request body: {unreadable_body(request, exc)}",
                            "invalid_request_error", "invalid_body")

    async def _measured(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        arrival_ns = _now()
        state = self.metrics.state
        try:
            body = await read_body(request, self.config.max_body_bytes, self.config.client_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            self._rejected(endpoint, "unary", "validation", arrival_ns)
            return self._too_large()
        except web.RequestPayloadError as exc:
            self._rejected(endpoint, "unary", "validation", arrival_ns)
            return self._unreadable(request, exc)
        except ClientTooSlow as exc:
            self._rejected(endpoint, "unary", "validation", arrival_ns)
            return await self._too_slow(request, exc)
        except (asyncio.CancelledError, ConnectionError):
            # the client went away while sending its body: counted once, model unknown
            self._rejected(endpoint, "unary", "cancelled", arrival_ns)
            state.client_disconnected()
            raise
        try:
            obj, strict = decode_json_strictness(body)
        except msgspec.DecodeError as exc:
            self._rejected(endpoint, "unary", "validation", arrival_ns)
            return openai_error(400, f"invalid JSON in the request body: {exc}", "invalid_request_error",
                                "invalid_json")
        if not isinstance(obj, dict):
            self._rejected(endpoint, "unary", "validation", arrival_ns)
            return openai_error(400, "request body must be a JSON object", "invalid_request_error", "invalid_json")
        stream = obj.get("stream")
        if stream is not None and not isinstance(stream, bool):
            # an upstream may coerce "true" or 1 to a stream (pydantic does) that would then be
            # read as a unary answer: reject it, as the OpenAI API does
            self._rejected(endpoint, "unary", "validation", arrival_ns)
            return openai_error(400, f"'stream' must be a boolean, got {type(stream).__name__}",
                                "invalid_request_error", "invalid_type", "stream")
        stream = stream is True
        request_type = "stream" if stream else "unary"
        model = obj.get("model")
        if not isinstance(model, str) or not model:
            self._rejected(endpoint, request_type, "validation", arrival_ns)
            return openai_error(400, "'model' is required (a string)", "invalid_request_error", "missing_model")
        try:
            upstream = await self.router.resolve(model, self.session)  # awaits only for unknown names
        except asyncio.CancelledError:
            self._rejected(endpoint, request_type, "cancelled", arrival_ns)
            state.client_disconnected()
            raise
        if upstream is None:
            if self.router.upstream_down:
                self._rejected(endpoint, request_type, "unavailable", arrival_ns)
                return openai_error(502, "upstream unreachable: cannot list its models", "server_error",
                                    "upstream_unavailable")
            self._rejected(endpoint, request_type, "not_found", arrival_ns)
            return openai_error(404, f"The model '{model}' does not exist.", "invalid_request_error",
                                "model_not_found")
        live = self.metrics.begin(model, endpoint, request_type, arrival_ns)
        out = _Outcome()
        counting = self._count_prompt(obj, live) if self.prompt_counter is not None else None
        end_ns: int | None = None
        try:
            url = self._url(upstream, request.path, request.raw_path)
            if stream:
                resp = await self._stream(request, live, out, obj, body, upstream, url, strict)
            else:
                resp = await self._unary(request, live, out, body, url)
            if counting is not None and not counting.done():
                # a reply faster than the tokenizer: send it and end the request's timing now, then
                # give the count a moment to set the bucket (a client leaving meanwhile changes nothing)
                if not resp.prepared:
                    with contextlib.suppress(ConnectionError):
                        await resp.prepare(request)
                        await resp.write_eof()
                end_ns = _now()
                await asyncio.wait({counting}, timeout=1.0)
            return resp
        except asyncio.CancelledError:
            if end_ns is None:
                out.fail("cancelled", 499)
                state.client_disconnected()
            raise
        except _UpstreamFailed as exc:
            if exc.error_type == "response_timeout":
                out.fail("response_timeout", 504)
                return openai_error(504, str(exc), "server_error", "upstream_timeout")
            if exc.error_type == "backend_error":
                out.fail("backend_error", 502)
                return openai_error(502, str(exc), "server_error", "upstream_error")
            out.fail("unavailable", 502)
            return openai_error(502, str(exc), "server_error", "upstream_unavailable")
        except Exception:
            log.exception("internal error relaying %s request", endpoint)
            out.fail("internal", 500)
            return openai_error(500, "internal error in the servelens gateway", "server_error", "internal")
        finally:
            self._finish(live, out, end_ns)

    def _count_prompt(self, obj: dict[str, Any], live: LiveRequest) -> asyncio.Future[int | None]:
        """Count the prompt's tokens in a worker thread, concurrently with the upstream request;
        the bucket is set (source ``tokenizer``) as soon as the count is known."""
        counter = self.prompt_counter
        assert counter is not None
        fut = asyncio.get_running_loop().run_in_executor(None, counter.count, obj)

        def done(f: asyncio.Future[int | None]) -> None:
            if f.cancelled() or f.exception() is not None:
                return
            n = f.result()
            if n is not None and not live.finished:
                live.set_isl(n, "tokenizer")

        fut.add_done_callback(done)
        return fut

    async def wait_finished(self, n: int, timeout: float = 5.0) -> None:
        """Wait until at least ``n`` requests to the measured endpoints were counted in
        ``requests_total`` (rejected ones included). Raises TimeoutError."""
        async with asyncio.timeout(timeout):
            while self.finished_total < n:
                if self._finished_event is None:
                    self._finished_event = asyncio.Event()
                await self._finished_event.wait()

    def _counted(self) -> None:
        self.finished_total += 1
        ev = self._finished_event
        if ev is not None:
            self._finished_event = None
            ev.set()

    def _rejected(self, endpoint: str, request_type: str, error_type: str, arrival_ns: int) -> None:
        """Count a request that failed before its model was known (``model="unknown_model"``), with its
        duration, as Dynamo's frontend does."""
        self.metrics.state.count_unknown_model(endpoint, request_type, error_type,
                                               duration_s=max(0, _now() - arrival_ns) / 1e9)
        self._counted()

    def _finish(self, live: LiveRequest, out: _Outcome, end_ns: int | None = None) -> None:
        """Count the request once; ``end_ns``: when it ended (default: now)."""
        rec = live.finish(
            _now() if end_ns is None else end_ns, out.status, "" if out.status == "success" else out.error_type,
            osl=out.osl, cached_tokens=out.cached_tokens, isl_source=out.isl_source,
        )
        self._counted()
        if self.request_log is not None:
            self._log_request(live, out, rec)

    def _log_request(self, live: LiveRequest, out: _Outcome, rec: RequestRecord) -> None:
        assert self.request_log is not None
        src = live.isl_source
        try:
            self.request_log.write(RequestLogEntry(
                upstream_request_id=out.upstream_request_id,
                model=live.model,
                endpoint=live.endpoint,
                request_type=live.request_type,
                isl=rec.isl,
                isl_source=src,
                bucket=live.bucket_label,
                ttft_s=rec.ttft_s,
                duration_s=rec.duration_s,
                osl=rec.osl,
                osl_source=out.osl_source if rec.osl is not None else "unknown",
                cached_tokens=rec.cached_tokens,
                output_chunks=rec.output_chunks,
                status=rec.status,
                error_type=rec.error_type,
                http_status=out.http_status,
                arrival_ns=rec.arrival_ns,
                first_output_ns=rec.first_output_ns,
            ))
        except OSError as exc:  # a full disk must not fail requests: stop logging, say so once
            log.warning("request log %s disabled: %s", self.request_log.path, exc)
            self.request_log.close()

    def _url(self, upstream: str, path: str, raw_target: str) -> URL:
        """The upstream URL for a measured path (parsed once per upstream and path); a request
        target with a query string keeps it exactly as sent (not cached: clients choose it)."""
        if "?" in raw_target:
            return URL(upstream + raw_target, encoded=True)
        key = (upstream, path)
        url = self._urls.get(key)
        if url is None:
            url = self._urls[key] = URL(upstream + path, encoded=True)
        return url

    async def _send(self, url: URL, body: bytes, headers: CIMultiDict[str]) -> UpstreamResponse:
        """POST upstream and wait for the response headers (``response_timeout_s``)."""
        try:  # the client's own timer bounds the wait for headers (no asyncio.timeout per request)
            return await self.upstream.request("POST", url, headers, body)
        except UpstreamError as exc:
            raise self._failed(exc, "upstream unreachable") from None

    async def _read_body(self, up: UpstreamResponse) -> bytes:
        """The whole upstream body within ``response_timeout_s``; raises _UpstreamFailed otherwise."""
        try:
            async with asyncio.timeout(self.config.response_timeout_s):
                return await up.read()
        except TimeoutError:
            raise _UpstreamFailed("response_timeout", "upstream did not answer in time") from None
        except UpstreamError as exc:
            raise self._failed(exc, "upstream failed") from None

    @staticmethod
    def _failed(exc: UpstreamError, what: str) -> _UpstreamFailed:
        if exc.error_type == "response_timeout":
            return _UpstreamFailed("response_timeout", "upstream did not answer in time")
        if exc.error_type == "backend_error":  # a body too large to hold
            return _UpstreamFailed("backend_error", f"{what}: {exc}")
        return _UpstreamFailed("unavailable", f"{what}: {exc}")

    async def _error_reply(self, up: UpstreamResponse, out: _Outcome) -> web.Response:
        """Relay an upstream error response (status, headers, body) unchanged."""
        body = await self._read_body(up)
        out.fail(error_type_for_status(up.status), up.status)
        return web.Response(status=up.status, reason=up.reason, body=body,
                            headers=self._response_headers(up.headers))

    def _response_headers(self, headers: MultiMapping[str]) -> CIMultiDict[str]:
        """:func:`forward_response_headers`, with a ``Location`` into an upstream made relative to
        the gateway (as nginx's ``proxy_redirect default``): a redirect (FastAPI's 307 for a trailing
        slash) sends the client back through the gateway, not straight to the engine."""
        out = forward_response_headers(headers)
        loc = out.get("Location")
        if loc:
            for base in self._upstream_bases:
                if loc.startswith(base) and loc[len(base):len(base) + 1] in ("", "/", "?"):
                    out["Location"] = loc[len(base):] or "/"
                    break
        return out

    def _plan(self, obj: dict[str, Any], body: bytes, upstream: str, strict: bool) -> tuple[Injection, bool]:
        """What to add to a stream request, and whether this request teaches ``usage_null``.
        ``strict``: the body is strict UTF-8 JSON (see :func:`plan_injection`)."""
        cfg = self.config
        inject = cfg.inject_usage and self.stream_options_ok.get(upstream, True)
        continuous = cfg.continuous_usage == "on" or (
            cfg.continuous_usage == "auto" and self.continuous_ok.get(upstream, True)
        )
        null = self.usage_null.get(upstream)
        inj = plan_injection(obj, body, inject_usage=inject, continuous=continuous, null_usage=bool(null),
                             strict=strict)
        if null is None and inj.strip in (STRIP_CONTINUOUS, STRIP_CONTINUOUS_NULL):
            # the client wants include_usage only: learn how this upstream marks "no usage here"
            # from this one request, sent without continuous_usage_stats
            return plan_injection(obj, body, inject_usage=inject, continuous=False, strict=strict), True
        return inj, False

    async def _unary(
        self, request: web.Request, live: LiveRequest, out: _Outcome, body: bytes, url: URL
    ) -> web.StreamResponse:
        headers = forward_request_headers(request.headers, measured=True)
        up = await self._send(url, body, headers)
        try:
            out.upstream_request_id = up.headers.get("x-request-id")
            if up.status != 200:
                return await self._error_reply(up, out)
            return await self._unary_reply(up, live, out)
        finally:
            up.close()

    async def _unary_reply(self, up: UpstreamResponse, live: LiveRequest, out: _Outcome) -> web.Response:
        """Read a whole 200 reply, measure it (usage), relay it unchanged."""
        data = await self._read_body(up)
        info = parse_response(data)
        if info.error is not None or info.malformed:
            out.fail("backend_error", 200)
        else:
            out.status, out.error_type, out.http_status = "success", "", 200
            usage = info.usage
            if usage is not None:
                if usage.prompt_tokens is not None:
                    live.set_isl(usage.prompt_tokens, "final_usage")
                out.osl = usage.completion_tokens
                out.cached_tokens = usage.cached_tokens
        return web.Response(status=up.status, reason=up.reason, body=data,
                            headers=self._response_headers(up.headers))

    async def _stream(
        self, request: web.Request, live: LiveRequest, out: _Outcome, obj: dict[str, Any], body: bytes,
        upstream: str, url: URL, strict: bool,
    ) -> web.StreamResponse:
        headers = forward_request_headers(request.headers, measured=True)
        inj, learn = self._plan(obj, body, upstream, strict)
        up = await self._send(url, inj.body, headers)
        try:
            if up.status in _REJECTED and inj.body is not body and self.config.continuous_usage != "on":
                # (the first response is closed by the retry or, on any failure, by the finally below)
                inj, learn, up = await self._retry_without_injection(
                    obj, body, upstream, url, headers, inj, learn, up, strict)
            out.upstream_request_id = up.headers.get("x-request-id")
            if up.status != 200:
                return await self._error_reply(up, out)
            if up.headers.get("Content-Type", "").lower().startswith(("application/json", "text/html")):
                # a whole JSON reply to a stream request (an engine that ignores "stream"): measured as such;
                # an HTML page (a proxy's or a login page in front of the engine) too: backend_error, as unary
                return await self._unary_reply(up, live, out)
            meter = StreamMeter(live, inj.strip)
            resp = await self._relay(request, out, up, meter)
            if learn and out.status == "success" and meter.usage_key_on_chunks is not None:
                self.usage_null[upstream] = meter.usage_key_on_chunks
            return resp
        finally:
            up.close()

    async def _retry_without_injection(
        self, obj: dict[str, Any], body: bytes, upstream: str, url: URL, headers: CIMultiDict[str],
        inj: Injection, learn: bool, up: UpstreamResponse, strict: bool,
    ) -> tuple[Injection, bool, UpstreamResponse]:
        """An upstream rejected what we added (400, or FastAPI's 422, naming the field): resend once
        without it, and learn that only when the resent request is not rejected too (a 400 for
        another reason can name the field, e.g. a validation error echoing the whole request)."""
        try:
            text = await self._read_body(up)
        except _UpstreamFailed:
            return inj, learn, up
        flags: dict[str, bool]
        if inj.continuous and b"continuous_usage_stats" in text:
            flags, field = self.continuous_ok, "continuous_usage_stats"
        elif b"stream_options" in text or b"include_usage" in text:
            flags, field = self.stream_options_ok, "stream_options"
        else:
            return inj, learn, up  # a genuine client error: relay it (body already read, still readable)
        up.close()
        before = flags.get(upstream)
        flags[upstream] = False
        inj, learn = self._plan(obj, body, upstream, strict)
        retry = await self._send(url, inj.body, headers)
        if retry.status in _REJECTED:  # rejected without the field too: it was not the cause
            if before is None:
                flags.pop(upstream, None)
            else:
                flags[upstream] = before
        else:
            log.info("upstream %s rejects %s; not sending it again", redacted_url(upstream), field)
        return inj, learn, retry

    async def _relay(
        self, request: web.Request, out: _Outcome, up: UpstreamResponse, meter: StreamMeter
    ) -> web.StreamResponse:
        """Relay a 200 stream chunk by chunk, measuring it on the way.

        Each upstream read is metered and written to the client's transport inside the upstream
        connection's callback (no task switch per chunk); reading from the upstream pauses while the
        client's write buffer is over its high-water mark. Bytes that came with the upstream's headers
        go out with the client's headers, and the read that ends the body goes out with the final
        chunk (one send each).
        """
        resp = web.StreamResponse(status=up.status, reason=up.reason, headers=self._response_headers(up.headers))
        strip = meter.strip != STRIP_NONE
        feed = meter.feed

        def metered(t: int, data: bytes) -> bytes:
            """Meter ``data``; the bytes to send for it (injected usage cut out when stripping)."""
            stripped = feed(t, data)  # None when not stripping
            return data if stripped is None else stripped

        out.fail("cancelled", 499)  # until the stream ends one way or the other
        last: list[bytes] = []  # what the read that ended the body gave: sent with the final chunk
        if request.version == aiohttp.HttpVersion11:
            resp.enable_chunked_encoding()  # flush() below writes the chunk frames itself
        else:
            resp.force_close()  # HTTP/1.0: the body ends with the connection (even if keep-alive was asked)
        try:
            await resp.prepare(request)
            writer: Any = getattr(resp, "_payload_writer", None)
            # body bytes that came with the upstream's headers go out with ours, in one send; else
            # the headers go now (aiohttp would hold them until the first body write, and the upstream
            # sent its headers now, e.g. before a long prefill)
            held = up.take_held()
            first = b""
            if held:
                first = metered(_now(), held)
                if up.ended:  # the whole body came with the headers: all of it goes in one send at the end
                    last.append(first)
                elif first:
                    await resp.write(first)
            if not first and not up.ended:
                send_headers = getattr(writer, "send_headers", None)
                if send_headers is not None:
                    send_headers()
        except ConnectionError:
            self.metrics.state.client_disconnected()
            request_gone(request)
            return resp
        except Exception:
            if not resp.prepared:
                raise  # nothing sent yet: the caller answers with a 500 error object
            # a bug of ours after the headers went out (metering the bytes that came with the
            # upstream's headers): cut the stream; an error response here would be written into it
            log.exception("internal error relaying a stream")
            out.fail("internal", 200)
            request_gone(request)
            return resp
        transport = request.transport
        if transport is None or transport.is_closing():
            self.metrics.state.client_disconnected()
            return resp
        # the framing aiohttp chose (chunked for HTTP/1.1; also for a request line saying "HTTP/2.0",
        # which aiohttp's server reads as a version above 1.1)
        chunked = bool(getattr(writer, "chunked", resp.chunked))
        high = transport.get_write_buffer_limits()[1]
        write = transport.write
        buffered = transport.get_write_buffer_size
        closing = transport.is_closing
        relay = meter.relay
        failure: list[BaseException] = []
        pending: list[bytes] = []
        call_soon = asyncio.get_running_loop().call_soon
        measure_due: list[bool] = []  # non-empty while a measurement is scheduled

        def measure() -> None:
            """Measure the reads sent since the last call: scheduled once the event loop's turn has
            written out all it read (every stream's bytes go out before any stream is measured)."""
            measure_due.clear()
            try:
                meter.measure()
            except Exception as exc:  # a bug of ours: the next read stops the relay, which reports it
                failure.append(exc)

        def flush() -> bool:
            """After each upstream read: write what it gave to the client in one send (injected usage
            cut out on the bytes), then schedule its measurement (with this read's time)."""
            try:
                if failure:
                    return True
                data = pending[0] if len(pending) == 1 else b"".join(pending)
                pending.clear()
                t = _now()
                if closing():
                    failure.append(ConnectionResetError("the client went away"))
                    return True
                if up.ended:  # the body ended in this read: the relay sends it and the final chunk at once
                    last.append(metered(t, data))
                    return False
                if strip:
                    data = relay(t, data) or b""
                    if data:
                        write(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)
                else:
                    write(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)
                    relay(t, data)
                if not measure_due:
                    measure_due.append(True)
                    call_soon(measure)
                return buffered() > high
            except Exception as exc:  # a bug of ours: stop reading, let the relay coroutine report it
                failure.append(exc)
                return True

        async def drain() -> None:
            """Until the client's write buffer is below its low-water mark. A client that closed its
            side while not reading leaves a closing transport whose buffer never drains, and aiohttp
            reports no disconnect until it does: checked every CLOSING_CHECK_S while waiting."""
            if failure:
                raise failure[0]
            if writer is not None:
                await watched(writer.drain(), transport)

        cut: str | None = None
        try:
            try:
                await up.pump(pending.append, flush, drain)
            except UpstreamError as exc:
                # (backend_error: a compressed body that does not decode)
                cut = exc.error_type if exc.error_type in ("response_timeout", "backend_error") else "truncated_stream"
            finally:
                measure()  # what was sent is measured before the request is finished, on every path
            if failure:
                raise failure[0]
            if cut is None:
                last.append(meter.end(_now()) or b"")
        except ConnectionError:  # the client went away (a write failed)
            bug = next((f for f in failure if not isinstance(f, ConnectionError)), None)
            if bug is not None:  # the client left after a measurement failed: still said once
                log.error("internal error measuring a stream", exc_info=bug)
            self.metrics.state.client_disconnected()
            return resp
        except Exception:  # a bug of ours after the headers went out: cut the stream
            log.exception("internal error relaying a stream")
            out.fail("internal", 200)
            request_gone(request)
            return resp
        out.osl = meter.osl
        out.osl_source = "usage" if meter.osl_from_usage else "chunks"
        out.cached_tokens = meter.cached_tokens
        if cut is not None:
            # an event left unfinished by the cut is not measured: an SSE client drops it too
            out.fail(cut, 200)
            request_gone(request)  # pass the cut on: no final chunk
            return resp
        end = b"".join(last)
        try:
            await watched(resp.write_eof(end), transport)  # the last data and the final chunk in one send
        except ConnectionError:
            if end:  # the end of the stream did not reach the client
                self.metrics.state.client_disconnected()
                return resp
        out.status, out.error_type = meter.outcome()
        out.http_status = 200
        return resp


async def watched(coro: Coroutine[Any, Any, None], transport: asyncio.BaseTransport) -> None:
    """Await ``coro`` (aiohttp's ``drain`` or ``write_eof``), run here without a task of its own; while
    it waits for the client to drain, check every CLOSING_CHECK_S that the client is still there:
    aiohttp's drain waits for ever on a client that closed its side and stopped reading, which would
    hold the request uncounted and in flight. Raises ConnectionResetError when the client is gone, and
    what ``coro`` raises."""
    try:
        waiting = coro.send(None)  # usually completes here: nothing to drain
    except StopIteration:
        return
    try:
        while True:
            while not waiting.done():
                await asyncio.wait({waiting}, timeout=CLOSING_CHECK_S)
                if not waiting.done() and transport.is_closing():
                    raise ConnectionResetError("the client went away")
            try:
                waiting = coro.send(None)  # resumes its await on the done future
            except StopIteration:
                return
    finally:
        if not waiting.done():  # given up: cancelled, so asyncio.shield marks aiohttp's inner waiter
            waiting.cancel()    # retrieved (its "Connection lost" would be logged as never retrieved)
        coro.close()


def request_gone(request: web.Request) -> None:
    """Close what is left of a client connection that failed."""
    if request.transport is not None:
        request.transport.close()


def build_app(config: GatewayConfig, metrics: FrontendMetrics | None = None) -> web.Application:
    """The aiohttp application of a new :class:`Gateway` (its :data:`GATEWAY_KEY` holds the gateway).

    Run it as :func:`~servelens.gateway.server.start_gateway` does: an ``AppRunner`` with
    ``handler_cancellation=True`` (a client that leaves cancels its request, which closes the upstream
    request) and ``keepalive_timeout=config.client_timeout_s`` (connections without a whole request
    head are closed); the body timeout is the application's own."""
    return Gateway(config, metrics).app
