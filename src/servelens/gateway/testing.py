"""Test helpers: a gateway in the current event loop on a free loopback port
(:func:`run_gateway`), a scripted OpenAI-compatible upstream whose bytes are exactly known
(:class:`ScriptedUpstream`), any aiohttp app on a free loopback port (:func:`serve_app`), a raw TCP
server for upstreams that misbehave at the HTTP level (:func:`raw_tcp_server`,
:func:`read_http_request`), and readers of the gateway's metrics.

Example::

    async with run_sim() as sim, run_gateway(sim.url, request_log=str(tmp_path / "log.jsonl")) as gw:
        ...  # talk to gw.url; read gw.metrics
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from servelens.gateway.app import Gateway
from servelens.gateway.config import GatewayConfig
from servelens.gateway.server import start_gateway
from servelens.prometheus import FrontendMetrics
from servelens.prometheus.parse import parse_exposition


@dataclass(frozen=True)
class GatewayHandle:
    """A running test gateway.

    Attributes:
        url: ``http://127.0.0.1:<port>`` (append ``/v1`` for an OpenAI SDK ``base_url``).
        metrics: the :class:`~servelens.prometheus.FrontendMetrics` it records into.
        gateway: the :class:`~servelens.gateway.app.Gateway` (config, router, session).
        port: the bound port.
        metrics_url: where ``/metrics`` is served (``url + "/metrics"``, or the metrics listener's).
    """

    url: str
    metrics: FrontendMetrics
    gateway: Gateway
    port: int
    metrics_url: str


@asynccontextmanager
async def run_gateway(
    upstream_url: str | None = None, *, metrics: FrontendMetrics | None = None, **config: Any
) -> AsyncIterator[GatewayHandle]:
    """Run a gateway in front of ``upstream_url`` until the block ends.

    ``config``: any :class:`~servelens.gateway.config.GatewayConfig` field (``isl_buckets``,
    ``models``, ``continuous_usage``, ``request_log``, ``read_timeout_s``, ...). Binds
    127.0.0.1 on a free port unless ``host``/``port`` are given; requests still in flight when the
    block ends are cut at once unless ``shutdown_timeout_s`` is given. Raises ValueError for bad config.
    """
    values = {"host": "127.0.0.1", "port": 0, "shutdown_timeout_s": 0.0, **config}  # closing: no drain
    if upstream_url is not None:
        values["upstream"] = upstream_url
    cfg = GatewayConfig.from_mapping(values)
    running = await start_gateway(cfg, metrics)
    try:
        yield GatewayHandle(running.url, running.metrics, running.gateway, running.port, running.metrics_url)
    finally:
        await running.close()


@asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """Run an aiohttp ``app`` on 127.0.0.1 (a free port) until the block ends; yields its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_tcp_server(handler: RawHandler) -> AsyncIterator[tuple[int, list[int]]]:
    """A TCP server on 127.0.0.1 (free port) running ``handler(reader, writer)`` per connection (the
    connection is closed after it; a peer that goes away ends it quietly). Yields the port and a list
    that gets one entry per accepted connection."""
    conns: list[int] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append(1)
        try:
            await handler(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], conns
    finally:
        server.close()
        await server.wait_closed()


async def read_http_request(r: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """Read one HTTP/1.1 request with a ``Content-Length`` body: ``(head, body)``. Raises
    asyncio.IncompleteReadError when the peer closes first."""
    head = await r.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next((int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:")), 0)
    return head, await r.readexactly(length)


FAKE_MODEL = "fake-model"
WORDS = ["Hello", " wörld", " —", " ok", " 🙂", " end", " more", " text"]


@dataclass
class Received:
    """One request the fake upstream got."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    query: str = ""  # the raw query string (as sent, escapes kept)

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def http_chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk (``Transfer-Encoding: chunked`` framing: hex size, CRLF, data, CRLF)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def _chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


@dataclass
class ScriptedUpstream:
    """A scripted OpenAI-compatible upstream.

    Default stream (chat): role-only chunk, ``max_tokens`` content chunks (the last with
    ``finish_reason``), then a usage chunk when asked, then ``[DONE]``. Usage style:
    ``usage_style="vllm"`` (no key unless requested; cumulative usage on every chunk with
    continuous_usage_stats) or ``"openai"`` (``"usage":null`` on every chunk of an
    include_usage stream). Deterministic ids and ``created``, so byte comparison is exact.
    """

    models: list[str] = field(default_factory=lambda: [FAKE_MODEL])
    usage_style: str = "vllm"
    reject_continuous: bool = False
    reject_stream_options: bool = False
    reject_status: int = 400  # 422: as FastAPI rejects an unknown field (pydantic extra="forbid")
    prompt_tokens: int = 700
    cached_tokens: int | None = 128
    raw_stream: list[bytes] | None = None  # replaces the generated stream (written one item per write)
    status: int = 200
    ignore_stream: bool = False  # answer a stream request with a whole JSON reply (as some engines do)
    hold: asyncio.Event | None = None  # stream: wait for this after the first content chunk
    stall: asyncio.Event | None = None  # completions: wait for this before answering at all
    requests: list[Received] = field(default_factory=list)
    closed_at_ns: list[int] = field(default_factory=list)  # when a stream handler saw its client go
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    models_status: int = 200
    stream_headers: dict[str, str] = field(default_factory=dict)  # added to a stream's response headers
    port: int = 0  # 0: a free one
    url: str = ""
    _runner: web.AppRunner | None = None

    def events(self, body: dict[str, Any], chat: bool) -> list[bytes]:
        """The events of a stream for ``body`` (no usage injection logic of our own)."""
        n = int(body.get("max_tokens") or 3)
        so = body.get("stream_options") or {}
        usage = so.get("include_usage") is True
        cont = usage and so.get("continuous_usage_stats") is True
        base = {"id": "cmpl-fixed", "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 1700000000, "model": body.get("model")}

        def usage_obj(ct: int, final: bool) -> dict[str, Any]:
            u: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens + ct,
                                 "completion_tokens": ct}
            if final and self.cached_tokens is not None:
                u["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
            return u

        def with_usage(obj: dict[str, Any], ct: int) -> dict[str, Any]:
            if cont:
                obj["usage"] = usage_obj(ct, False)
            elif usage and self.usage_style == "openai":
                obj["usage"] = None
            return obj

        out: list[bytes] = []
        if chat:
            out.append(_chunk(with_usage({**base, "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None}]}, 0)))
        for i in range(n):
            fr = "length" if i == n - 1 else None
            word = WORDS[i % len(WORDS)]
            choice: dict[str, Any] = (
                {"index": 0, "delta": {"content": word}, "logprobs": None, "finish_reason": fr}
                if chat else {"index": 0, "text": word, "logprobs": None, "finish_reason": fr}
            )
            out.append(_chunk(with_usage({**base, "choices": [choice]}, i + 1)))
        if usage:
            out.append(_chunk({**base, "choices": [], "usage": usage_obj(n, True)}))
        out.append(b"data: [DONE]\n\n")
        return out

    async def _models(self, request: web.Request) -> web.Response:
        self.requests.append(Received(request.method, request.path, dict(request.headers), b""))
        if self.models_status != 200:
            return web.json_response({"error": {"message": "nope"}}, status=self.models_status)
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.models]})

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.requests.append(Received(request.method, request.path, dict(request.headers), raw,
                                      request.raw_path.partition("?")[2]))
        if self.stall is not None:
            await self.stall.wait()
        body = json.loads(raw)
        chat = request.path.endswith("chat/completions")
        so = body.get("stream_options") or {}
        for rejected, name, loc in ((self.reject_stream_options and "stream_options" in body, "stream_options",
                                     ["body", "stream_options"]),
                                    (self.reject_continuous and "continuous_usage_stats" in so,
                                     "stream_options.continuous_usage_stats",
                                     ["body", "stream_options", "continuous_usage_stats"])):
            if not rejected:
                continue
            if self.reject_status == 422:
                return web.json_response({"detail": [{"type": "extra_forbidden", "loc": loc,
                                                      "msg": "Extra inputs are not permitted"}]}, status=422)
            return web.json_response({"error": {"message": f"Unrecognized request argument supplied: {name}",
                                                "type": "invalid_request_error", "param": None, "code": None}},
                                     status=self.reject_status)
        if self.status != 200:
            return web.json_response({"error": {"message": f"fake {self.status}", "type": "error", "param": None,
                                                "code": self.status}}, status=self.status,
                                     headers={"x-request-id": "req-err"})
        if not body.get("stream") or self.ignore_stream:
            n = int(body.get("max_tokens") or 3)
            text = "".join(WORDS[i % len(WORDS)] for i in range(n))
            choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                       "finish_reason": "length"} if chat else
                                      {"index": 0, "text": text, "finish_reason": "length"})
            usage: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": n,
                                     "total_tokens": self.prompt_tokens + n}
            if self.cached_tokens is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
            return web.json_response({"id": "cmpl-fixed", "object": "chat.completion" if chat else "text_completion",
                                      "created": 1700000000, "model": body.get("model"), "choices": [choice],
                                      "usage": usage}, headers={"x-request-id": "req-unary"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-request-id": "req-stream",
                                           "X-Custom": "kept", **self.stream_headers})
        await resp.prepare(request)
        events = self.raw_stream if self.raw_stream is not None else self.events(body, chat)
        try:
            for i, ev in enumerate(events):
                await resp.write(ev)
                if self.hold is not None and i == (1 if chat else 0):
                    await self.hold.wait()
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self.closed_at_ns.append(time.perf_counter_ns())
            self.closed.set()
            raise
        return resp

    async def _echo(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.requests.append(Received(request.method, request.path, dict(request.headers), raw))
        return web.json_response({"path": request.path, "query": request.query_string, "len": len(raw)},
                                 headers={"X-Echo": "1"})

    async def start(self) -> ScriptedUpstream:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_route("*", "/v1/{tail:.*}", self._echo)
        app.router.add_route("*", "/tokenize", self._echo)  # an engine's own non-/v1 endpoint (vLLM has it)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def completions(self) -> list[Received]:
        return [r for r in self.requests if r.path.endswith("completions")]


@asynccontextmanager
async def run_scripted_upstream(**settings: Any) -> AsyncIterator[ScriptedUpstream]:
    """A :class:`ScriptedUpstream` on a free 127.0.0.1 port until the block ends."""
    up = await ScriptedUpstream(**settings).start()
    try:
        yield up
    finally:
        await up.stop()


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(metrics: FrontendMetrics) -> Samples:
    """Every sample of the gateway's exposition."""
    return parse_exposition(metrics.exposition().decode())


def value(s: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when absent)."""
    return s.get((name, tuple(sorted(labels.items()))), 0.0)


def total(s: Samples, name: str, **labels: str) -> float:
    """Sum over the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in s.items() if n == name and want <= set(lab))


def requests_total(m: FrontendMetrics, **labels: str) -> float:
    """``requests_total`` summed over the samples matching ``labels``."""
    return total(samples(m), m.names.requests, **labels)


def inflight(m: FrontendMetrics) -> float:
    """``inflight_requests`` summed over models."""
    return total(samples(m), m.names.inflight)
