"""A tiny OpenAI-shaped ASGI app and a hand-rolled ASGI client, for the middleware's tests and its
benchmark (no server, no socket: the app is called directly).

:class:`TinyApp` answers ``POST /v1/chat/completions`` and ``/v1/completions`` as vLLM does: a stream
of one-token chunks (no ``usage`` key unless asked; cumulative usage on every chunk with
``continuous_usage_stats``; a final ``choices: []`` usage chunk with ``include_usage``; ``[DONE]``),
or one JSON reply with ``usage``. The prompt's token count is the request's ``"prompt_tokens"`` field
(a test knob), else 100; ``max_tokens`` tokens are sent (default 8).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


@dataclass
class Route:
    """A route as Starlette lists it (``app.routes``): only its path matters here."""

    path: str


@dataclass
class TinyApp:
    """The app (see the module docstring). ``bodies``: every request body it read; ``reject``: a
    field name (``stream_options``) whose presence gets a 400 naming it, as a strict server would."""

    model: str = "tiny"
    paths: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions")
    reject: str | None = None
    cached_tokens: int = 0
    bodies: list[bytes] = field(default_factory=list)

    @property
    def routes(self) -> list[Route]:
        return [Route(p) for p in (*self.paths, "/health")]

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                if m["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif m["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        self.bodies.append(body)
        if scope["path"] not in self.paths:
            await _json(send, 404, {"detail": "Not Found"})
            return
        req = json.loads(body)
        if self.reject is not None and self.reject in req:
            await _json(send, 400, {"error": {"message": f"unknown field {self.reject}", "type": "BadRequestError"}})
            return
        if req.get("model", self.model) != self.model:
            await _json(send, 404, {"error": {"message": f"The model `{req['model']}` does not exist."}})
            return
        isl = int(req.get("prompt_tokens", 100))
        osl = int(req.get("max_tokens", 8))
        chat = scope["path"].endswith("chat/completions")
        if not req.get("stream"):
            choice = ({"index": 0, "message": {"role": "assistant", "content": "t" * osl}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": "t" * osl, "finish_reason": "length"})
            await _json(send, 200, {"id": "x", "object": "chat.completion" if chat else "text_completion",
                                    "model": self.model, "choices": [choice], "usage": self._usage(isl, osl)})
            return
        so = req.get("stream_options") or {}
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        for i in range(osl):
            last = i == osl - 1
            choice = ({"index": 0, "delta": {"content": "t"}, "logprobs": None,
                       "finish_reason": "length" if last else None} if chat else
                      {"index": 0, "text": "t", "logprobs": None, "finish_reason": "length" if last else None})
            chunk: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": self.model,
                                     "choices": [choice]}
            if so.get("include_usage") and so.get("continuous_usage_stats"):
                chunk["usage"] = self._usage(isl, i + 1)
            await send({"type": "http.response.body", "body": _sse(chunk), "more_body": True})
        if so.get("include_usage"):
            await send({"type": "http.response.body", "more_body": True, "body": _sse(
                {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": self.model, "choices": [],
                 "usage": self._usage(isl, osl)})})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    def _usage(self, isl: int, osl: int) -> dict[str, Any]:
        u: dict[str, Any] = {"prompt_tokens": isl, "total_tokens": isl + osl, "completion_tokens": osl}
        if self.cached_tokens:
            u["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return u


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _json(send: Callable[[Message], Awaitable[None]], status: int, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


@dataclass(frozen=True)
class Reply:
    """What a client got: status, headers, the body's bytes, and the body messages one by one."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    parts: list[bytes]


async def call(app: ASGIApp, path: str, body: dict[str, Any] | bytes, method: str = "POST",
               disconnect_after: int | None = None, scope_extra: dict[str, Any] | None = None) -> Reply:
    """Call ``app`` once as an HTTP server would (``body`` a JSON object or bytes); the reply.
    ``disconnect_after``: the client leaves after that many body messages (``http.disconnect``)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = False
    gone = asyncio.Event()
    got: list[Message] = []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    bodies = 0

    async def send(m: Message) -> None:
        nonlocal bodies
        if gone.is_set():
            raise OSError("the client went away")
        got.append(m)
        bodies += m["type"] == "http.response.body"
        if disconnect_after is not None and bodies >= disconnect_after:
            gone.set()

    scope: dict[str, Any] = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                             "path": path, "raw_path": path.encode(), "query_string": b"", "headers": [
                                 (b"content-type", b"application/json"),
                                 (b"content-length", str(len(data)).encode())], **(scope_extra or {})}
    with contextlib.suppress(OSError):  # the client left (disconnect_after)
        await app(scope, receive, send)
    start = next(m for m in got if m["type"] == "http.response.start")
    parts = [m.get("body", b"") for m in got if m["type"] == "http.response.body"]
    return Reply(int(start["status"]), list(start.get("headers", [])), b"".join(parts), parts)


async def lifespan(app: ASGIApp, scope_extra: dict[str, Any] | None = None) -> list[Message]:
    """Run ``app``'s lifespan startup and shutdown as a server would; the messages the app sent."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    sent: list[Message] = []
    await inbox.put({"type": "lifespan.startup"})

    async def receive() -> Message:
        return await inbox.get()

    async def send(m: Message) -> None:
        sent.append(m)
        if m["type"] == "lifespan.startup.complete":
            await inbox.put({"type": "lifespan.shutdown"})

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}, **(scope_extra or {})}
    await app(scope, receive, send)
    return sent


TAP_FILE_ENV = "SERVELENS_TAP_FILE"


class RecordingTap:
    """An ASGI middleware that appends, per ``POST`` to a measured path, one JSON line to the file
    named by ``SERVELENS_TAP_FILE``: ``{"path", "request", "response"}`` (bodies as latin-1 text, so
    bytes come back exactly). Put it inside :class:`~servelens.asgi.MetricsMiddleware` (in vLLM: named
    before it, ``--middleware servelens.asgi.testing.RecordingTap --middleware
    servelens.asgi.MetricsMiddleware``) and it holds what the app got and said, usage added included."""

    def __init__(self, app: ASGIApp) -> None:
        import os

        self.app = app
        self.path = os.environ.get(TAP_FILE_ENV)

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if self.path is None or scope["type"] != "http" or scope.get("method") != "POST" or not str(
                scope.get("path", "")).endswith("completions"):
            await self.app(scope, receive, send)
            return
        request: list[bytes] = []
        response: list[bytes] = []

        async def recv() -> Message:
            m = await receive()
            request.append(m.get("body", b""))
            return m

        async def snd(m: Message) -> None:
            if m["type"] == "http.response.body":
                response.append(m.get("body", b""))
            await send(m)

        try:
            await self.app(scope, recv, snd)
        finally:
            line = {"path": scope["path"], "request": b"".join(request).decode("latin-1"),
                    "response": b"".join(response).decode("latin-1")}
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")


def read_tap(path: str) -> list[tuple[bytes, bytes]]:
    """The ``(request body, response body)`` pairs a :class:`RecordingTap` wrote, in order."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            out.append((d["request"].encode("latin-1"), d["response"].encode("latin-1")))
    return out
