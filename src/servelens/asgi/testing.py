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
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

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


@contextlib.asynccontextmanager
async def serve_asgi(app: ASGIApp | FastAPI, **config: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn (the server vLLM and SGLang run; needs uvicorn: the dev extra) on
    127.0.0.1, a free port, until the block ends; yields its base URL. ``config``: more
    ``uvicorn.Config`` settings. The socket listens before uvicorn starts, so a connection made at once
    waits in its backlog (no readiness to poll)."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False, **config))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


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


ISL_VLLM_LIKE = 700
"""The prompt token count :func:`vllm_like_app` reports (ISL bucket 513-1024 of ``512,1024``)."""


def vllm_like_app(vllm_errors: bool = True, strict_options: bool = False) -> tuple[FastAPI, list[bytes]]:
    """A FastAPI app that reads ``POST /v1/chat/completions`` as vLLM does, and the list of the request
    bodies it was given (needs fastapi: the dev extra). A pydantic request model: ``messages`` required,
    ``stream: bool | None`` and ``stream_options`` read with pydantic's lax booleans; a stream of
    one-token chunks as a ``StreamingResponse`` (cumulative usage with ``continuous_usage_stats``, a
    final usage chunk with ``include_usage``, ``[DONE]``), or one JSON reply; ``max_tokens`` tokens
    (default 3) and a prompt of :data:`ISL_VLLM_LIKE` tokens.

    ``vllm_errors``: a request that fails validation gets vLLM's 400, ``{"error": {"message": "1
    validation error:\n  {'type': 'missing', 'loc': ('body', 'messages'), ..., 'input': {<the
    request>}}", "param": "body.messages", ...}}`` (``entrypoints/serve/utils/server_utils.py``);
    else FastAPI's own 422, ``{"detail": [{"loc": [...], "msg", "input"}]}``. Both echo the request.
    ``strict_options``: ``stream_options`` forbids fields it does not know (pydantic ``extra="forbid"``)
    and knows no ``continuous_usage_stats``, as a strict OpenAI-compatible server."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from pydantic import BaseModel, ConfigDict

    class StreamOptions(BaseModel):
        include_usage: bool | None = True
        continuous_usage_stats: bool | None = False

    class StrictStreamOptions(BaseModel):
        model_config = ConfigDict(extra="forbid")
        include_usage: bool | None = True

    class ChatRequest(BaseModel):
        model: str | None = None
        messages: list[dict[str, Any]]
        stream: bool | None = False
        stream_options: StreamOptions | None = None
        max_tokens: int = 3

    class StrictChatRequest(ChatRequest):
        stream_options: StrictStreamOptions | None = None  # type: ignore[assignment]

    app = FastAPI()
    bodies: list[bytes] = []

    if vllm_errors:
        @app.exception_handler(RequestValidationError)
        async def as_vllm(_: Request, exc: RequestValidationError) -> JSONResponse:
            errors = exc.errors()
            message = f"{len(errors)} validation error{'s' if len(errors) > 1 else ''}:\n" + "".join(
                f"  {e}\n" for e in errors)
            loc = errors[0].get("loc") if errors else None
            return JSONResponse({"error": {"message": message.rstrip(), "type": "Bad Request",
                                           "param": ".".join(map(str, loc)) if loc else None, "code": 400}},
                                status_code=400)

    @app.middleware("http")
    async def keep_body(request: Request, call_next: Any) -> Any:
        bodies.append(await request.body())
        return await call_next(request)

    async def answer(req: ChatRequest) -> Any:
        so = req.stream_options
        usage = so is not None and bool(so.include_usage)
        cont = usage and bool(getattr(so, "continuous_usage_stats", False))
        n = req.max_tokens

        def u(ct: int) -> dict[str, int]:
            return {"prompt_tokens": ISL_VLLM_LIKE, "completion_tokens": ct, "total_tokens": ISL_VLLM_LIKE + ct}

        if not req.stream:
            return {"id": "x", "object": "chat.completion", "model": req.model, "usage": u(n), "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "t" * n}, "finish_reason": "length"}]}

        async def events() -> AsyncIterator[bytes]:
            for i in range(n):
                c: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "model": req.model, "choices": [
                    {"index": 0, "delta": {"content": "t"}, "finish_reason": "length" if i == n - 1 else None}]}
                if cont:
                    c["usage"] = u(i + 1)
                yield _sse(c)
            if usage:
                yield _sse({"id": "x", "object": "chat.completion.chunk", "model": req.model, "choices": [],
                            "usage": u(n)})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def chat(req: ChatRequest) -> Any:
        return await answer(req)

    # the request model as a class, not the string this module's annotations are (FastAPI reads it, and
    # cannot resolve a class local to this function from a string)
    chat.__annotations__ = {"req": StrictChatRequest if strict_options else ChatRequest, "return": Any}
    app.post("/v1/chat/completions")(chat)
    return app, bodies
