"""servelens.asgi.MetricsMiddleware in front of a FastAPI app that reads requests as vLLM does: a pydantic
request model (``messages`` required, ``stream: bool | None``, lax booleans), its 422 or vLLM's 400 for a
request that fails validation (both echo the request, what the middleware added included), and a
``StreamingResponse`` of OpenAI chunks. Counts and bytes, never speed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from servelens.asgi import MetricsMiddleware
from servelens.asgi.testing import call

CHAT = "/v1/chat/completions"
ISL = 700  # the app's prompt token count: bucket 513-1024


class StreamOptions(BaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class ChatRequest(BaseModel):
    model: str | None = None
    messages: list[dict[str, Any]]
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int = 3


def _chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def vllm_like_app(vllm_errors: bool = True) -> tuple[FastAPI, list[bytes]]:
    """The app, and the list of request bodies it was given. ``vllm_errors``: a validation error is
    vLLM's 400 (``{"error": {"message": "<the errors' repr>", ...}}``, the request echoed in it); else
    FastAPI's own 422 (``{"detail": [{"loc", "msg", "input"}]}``, the request echoed as JSON)."""
    app = FastAPI()
    bodies: list[bytes] = []

    if vllm_errors:
        @app.exception_handler(RequestValidationError)
        async def as_vllm(_: Request, exc: RequestValidationError) -> JSONResponse:
            errors = exc.errors()
            message = f"{len(errors)} validation error:\n" + "".join(f"  {e}\n" for e in errors)
            loc = errors[0].get("loc") if errors else None
            return JSONResponse({"error": {"message": message.rstrip(), "type": "Bad Request",
                                           "param": ".".join(map(str, loc)) if loc else None, "code": 400}},
                                status_code=400)

    @app.middleware("http")
    async def keep_body(request: Request, call_next: Any) -> Any:
        bodies.append(await request.body())
        return await call_next(request)

    @app.post(CHAT)
    async def chat(req: ChatRequest) -> Any:
        so = req.stream_options
        usage = so is not None and bool(so.include_usage)
        cont = usage and so is not None and bool(so.continuous_usage_stats)
        n = req.max_tokens

        def u(ct: int) -> dict[str, int]:
            return {"prompt_tokens": ISL, "completion_tokens": ct, "total_tokens": ISL + ct}

        if not req.stream:
            return {"id": "x", "object": "chat.completion", "model": req.model, "usage": u(n), "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "t" * n}, "finish_reason": "length"}]}

        async def events() -> AsyncIterator[bytes]:
            for i in range(n):
                c: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "model": req.model, "choices": [
                    {"index": 0, "delta": {"content": "t"}, "finish_reason": "length" if i == n - 1 else None}]}
                if cont:
                    c["usage"] = u(i + 1)
                yield _chunk(c)
            if usage:
                yield _chunk({"id": "x", "object": "chat.completion.chunk", "model": req.model, "choices": [],
                              "usage": u(n)})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app, bodies


def _v(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value("servelens_" + name, labels) or 0.0


def _requests(reg: CollectorRegistry) -> float:
    return sum(s.value for m in reg.collect() for s in m.samples if s.name == "servelens_requests_total")


def _mw(app: FastAPI, reg: CollectorRegistry) -> MetricsMiddleware:
    return MetricsMiddleware(app, registry=reg, isl_buckets="512,1024", environ={}, model="m")


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **extra}


@pytest.mark.parametrize("stream", [True, "true", 1, "yes", "on", 1.0])
async def test_lax_true_stream_is_measured_as_a_stream(stream: object) -> None:
    """pydantic reads "true", 1, "yes" as a stream: the app streams, the middleware adds usage and
    measures it (was: passed through, no usage, no ISL bucket)."""
    app, bodies = vllm_like_app()
    reg = CollectorRegistry()
    got = await call(_mw(app, reg), CHAT, _chat(stream=stream), scope_extra={"app": app})
    assert got.status == 200 and got.body.endswith(b"data: [DONE]\n\n")
    assert json.loads(bodies[-1])["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert b'"usage"' not in got.body  # added, then cut from what the client gets
    labels = {"model": "m", "isl_bucket": "513-1024"}
    assert _v(reg, "time_to_first_token_by_isl_seconds_count", **labels) == 1
    assert _v(reg, "inter_token_latency_by_isl_seconds_count", **labels) == 2
    assert _v(reg, "requests_total", model="m", endpoint="chat_completions", request_type="stream",
              status="success", error_type="") == 1
    assert _requests(reg) == 1


@pytest.mark.parametrize("stream", [False, "false", 0, "no", None])
async def test_lax_false_stream_is_unary(stream: object) -> None:
    app, bodies = vllm_like_app()
    reg = CollectorRegistry()
    got = await call(_mw(app, reg), CHAT, _chat(stream=stream), scope_extra={"app": app})
    assert got.status == 200 and json.loads(got.body)["object"] == "chat.completion"
    assert "stream_options" not in json.loads(bodies[-1])
    assert _v(reg, "requests_total", model="m", endpoint="chat_completions", request_type="unary",
              status="success", error_type="") == 1
    assert _v(reg, "request_duration_by_isl_seconds_count", model="m", isl_bucket="513-1024") == 1
    assert _requests(reg) == 1
