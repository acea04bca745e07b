"""servelens.asgi.MetricsMiddleware in front of a FastAPI app that reads requests as vLLM does: a pydantic
request model (``messages`` required, ``stream: bool | None``, lax booleans), its 422 or vLLM's 400 for a
request that fails validation (both echo the request, what the middleware added included), and a
``StreamingResponse`` of OpenAI chunks. Counts and bytes, never speed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from servelens.asgi import MetricsMiddleware
from servelens.asgi.testing import Scope, call, vllm_like_app

CHAT = "/v1/chat/completions"


def tok(text: str, reason: str | None = None) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text},
                                                 "finish_reason": reason}]}).encode() + b"\n\n"


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


@pytest.mark.parametrize("vllm_errors", [True, False], ids=["vllm-400", "fastapi-422"])
async def test_ordinary_bad_requests_never_turn_usage_off(vllm_errors: bool) -> None:
    """Two chat streams without ``messages``: the app's error echoes the request, what was added included,
    without blaming it. The middleware calls the app again with the client's own body (so the client gets
    the answer to the request it sent, which names nothing it did not send), learns nothing, and the next
    stream still gets usage added and an ISL bucket (was: usage off for the life of the process)."""
    app, bodies = vllm_like_app(vllm_errors)
    reg = CollectorRegistry()
    mw = _mw(app, reg)
    bad = {"model": "m", "stream": True, "max_tokens": 3}
    direct = await call(vllm_like_app(vllm_errors)[0], CHAT, bad)
    assert direct.status == (400 if vllm_errors else 422) and b"messages" in direct.body
    for i in range(2):
        got = await call(mw, CHAT, bad, scope_extra={"app": app})
        assert (got.status, got.body) == (direct.status, direct.body)  # the answer to its own body
        assert b"include_usage" not in got.body and b"stream_options" not in got.body
        assert [b"continuous_usage_stats" in b for b in bodies[2 * i:]] == [True, False]
    got = await call(mw, CHAT, _chat(stream=True), scope_extra={"app": app})
    assert got.status == 200
    assert json.loads(bodies[-1])["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert _v(reg, "time_to_first_token_by_isl_seconds_count", model="m", isl_bucket="513-1024") == 1
    assert _v(reg, "requests_total", model="m", endpoint="chat_completions", request_type="stream",
              status="error", error_type="validation") == 2
    assert _requests(reg) == 3


async def test_an_error_blaming_another_field_and_not_echoing_is_relayed_once() -> None:
    """``max_tokens: "abc"``: the error names max_tokens and quotes only its value: the app is called once."""
    app, bodies = vllm_like_app()
    reg = CollectorRegistry()
    body = _chat(stream=True, max_tokens="abc")
    direct = await call(vllm_like_app()[0], CHAT, body)
    got = await call(_mw(app, reg), CHAT, body, scope_extra={"app": app})
    assert got.status == 400 and got.body == direct.body and b"'loc': ('body', 'max_tokens')" in got.body
    assert len(bodies) == 1 and b"stream_options" in bodies[0]
    assert _requests(reg) == 1


@pytest.mark.parametrize("vllm_errors", [True, False], ids=["vllm-400", "fastapi-422"])
async def test_app_forbidding_continuous_usage_is_learned_once_it_accepts_the_request_without(
        vllm_errors: bool) -> None:
    """A strict app: stream_options forbids unknown fields. The error blames continuous_usage_stats: the
    app is called again with include_usage alone (usage still measured), and later streams get that at once."""
    app, bodies = vllm_like_app(vllm_errors, strict_options=True)
    reg = CollectorRegistry()
    mw = _mw(app, reg)
    for _ in range(2):
        got = await call(mw, CHAT, _chat(stream=True), scope_extra={"app": app})
        assert got.status == 200 and b'"usage"' not in got.body
    assert [json.loads(b)["stream_options"] for b in bodies] == [
        {"include_usage": True, "continuous_usage_stats": True}, {"include_usage": True}, {"include_usage": True}]
    assert _v(reg, "time_to_first_token_by_isl_seconds_count", model="m", isl_bucket="513-1024") == 2
    assert _v(reg, "requests_total", model="m", endpoint="chat_completions", request_type="stream",
              status="success", error_type="") == 2
    assert _requests(reg) == 2


async def test_a_stream_the_client_leaves_is_cancelled_though_the_app_never_reads_receive(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A raw ASGI app under uvicorn streams without ever reading ``receive``; the client leaves after the
    first chunk. uvicorn drops what the app sends after that without an error, so the app ends its stream
    as if it were read: the middleware hears the disconnect itself and counts the request cancelled (was:
    success)."""
    from servelens.asgi import exchange
    from servelens.asgi.testing import serve_asgi

    heard = asyncio.Event()
    original = getattr(exchange.Exchange, "client_left", None)

    def spy(self: exchange.Exchange) -> None:
        assert original is not None
        original(self)
        if self.left_before_end:
            heard.set()

    monkeypatch.setattr(exchange.Exchange, "client_left", spy, raising=False)
    done = asyncio.Event()

    async def raw(scope: Scope, receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        await receive()  # the body, then never again
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": tok("a"), "more_body": True})
        for _ in range(300):  # paced, as an engine: until the middleware heard the client leave (3 s at most)
            if heard.is_set():
                break
            await send({"type": "http.response.body", "body": tok("b"), "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": tok("c", "stop") + b"data: [DONE]\n\n",
                    "more_body": False})
        done.set()  # (the middleware counts the request before anything else runs)

    reg = CollectorRegistry()
    mw = MetricsMiddleware(raw, registry=reg, isl_buckets="512,1024", environ={}, model="m")
    async with serve_asgi(mw) as url, aiohttp.ClientSession() as http:
        resp = await http.post(url + CHAT, json=_chat(stream=True))
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")  # the first chunk arrived
        resp.close()  # the client leaves
        async with asyncio.timeout(30):  # a bound for a hung test, not a figure
            await done.wait()
    assert heard.is_set()
    assert _v(reg, "requests_total", model="m", endpoint="chat_completions", request_type="stream",
              status="error", error_type="cancelled") == 1
    assert _requests(reg) == 1


async def test_an_app_that_reads_receive_still_hears_the_disconnect_and_ends_cancelled() -> None:
    """Starlette's StreamingResponse reads ``receive`` to learn that the client left: it still does
    through the middleware (the message the middleware heard is handed to it), and stops its stream."""
    from fastapi.responses import StreamingResponse

    from servelens.asgi.testing import serve_asgi

    stopped = asyncio.Event()

    async def events() -> Any:
        try:
            yield tok("a")
            for _ in range(3000):  # paced, as an engine; ended by Starlette once the client left
                await asyncio.sleep(0.01)
                yield tok("b")
        finally:
            stopped.set()

    app = FastAPI()

    @app.post(CHAT)
    async def chat() -> StreamingResponse:
        return StreamingResponse(events(), media_type="text/event-stream")

    reg = CollectorRegistry()
    mw = _mw(app, reg)
    answered = asyncio.Event()

    async def outer(scope: Scope, receive: Any, send: Any) -> None:
        try:
            await mw(scope, receive, send)
        finally:
            answered.set()  # the middleware has counted the request

    async with serve_asgi(outer) as url, aiohttp.ClientSession() as http:
        resp = await http.post(url + CHAT, json=_chat(stream=True))
        await resp.content.readuntil(b"\n\n")
        resp.close()
        async with asyncio.timeout(30):  # a bound for a hung test; the stream would run 30 s on its own
            await answered.wait()
    assert stopped.is_set()
    assert _v(reg, "requests_total", model="m", endpoint="chat_completions", request_type="stream",
              status="error", error_type="cancelled") == 1
    assert _requests(reg) == 1
