"""servelens.asgi.MetricsMiddleware in front of a FastAPI app that reads requests as vLLM does: a pydantic
request model (``messages`` required, ``stream: bool | None``, lax booleans), its 422 or vLLM's 400 for a
request that fails validation (both echo the request, what the middleware added included), and a
``StreamingResponse`` of OpenAI chunks. Counts and bytes, never speed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from servelens.asgi import MetricsMiddleware
from servelens.asgi.testing import call, vllm_like_app

CHAT = "/v1/chat/completions"


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
