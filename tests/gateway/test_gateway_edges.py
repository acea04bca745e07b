"""The gateway on the edges an adversarial tester found (a scripted upstream writing known bytes):
absurd usage numbers, lax ``stream`` values, streams cut mid-event, methods on the gateway's own paths.
Exact counts and bytes, never timing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
import pytest

from servelens.asgi.testing import serve_asgi, vllm_like_app
from servelens.cli.main import main
from servelens.gateway.testing import (
    FAKE_MODEL,
    ScriptedUpstream,
    inflight,
    raw_tcp_server,
    read_http_request,
    requests_total,
    run_gateway,
    samples,
    total,
    value,
)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "stream": True, **extra}


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def tok(text: str, reason: str | None = None) -> bytes:
    return ev({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": reason}]})


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(url + "/v1/chat/completions", data=data,
                         headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.read()


async def test_absurd_usage_is_unknown_osl_from_chunks(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    """completion_tokens 10**18 and prompt_tokens 10**15 are junk (above 2**31 - 1): OSL is the 3 counted
    chunks, output_tokens_total grows by 3, and the request has no ISL bucket."""
    fake.raw_stream = [tok("a"), tok("b"), tok("c", "stop"),
                       ev({"choices": [], "usage": {"prompt_tokens": 10**15, "completion_tokens": 10**18,
                                                    "total_tokens": 10**15 + 10**18}}),
                       b"data: [DONE]\n\n"]
    async with run_gateway(fake.url) as gw:
        status, body = await post(http, gw.url, chat(stream_options={"include_usage": True}))
        assert status == 200 and body == b"".join(fake.raw_stream)
        await gw.gateway.wait_finished(1)
        s, n = samples(gw.metrics), gw.metrics.names
        assert requests_total(gw.metrics, status="success") == 1
        assert value(s, n.osl + "_sum", model=FAKE_MODEL) == 3
        assert value(s, n.osl + "_count", model=FAKE_MODEL) == 1
        assert value(s, n.output_tokens, model=FAKE_MODEL) == 3
        assert value(s, n.isl + "_count", model=FAKE_MODEL) == 0
        assert total(s, n.ttft_by_isl + "_count") == 0
        assert gw.metrics.state.models[FAKE_MODEL].isl_sources == {
            "first_chunk_usage": 0, "final_usage": 0, "tokenizer": 0, "unknown": 1}
        assert inflight(gw.metrics) == 0


@pytest.mark.parametrize("stream", ["true", 1, "yes", 1.0])
async def test_lax_true_stream_is_relayed_and_measured_as_a_stream(fake: ScriptedUpstream,
                                                                   http: aiohttp.ClientSession, stream: Any) -> None:
    """vLLM and SGLang (pydantic) read "true" and 1 as a stream: so does the gateway (was: 400 invalid_type)."""
    _, direct = await post(http, fake.url, chat(stream=stream))
    async with run_gateway(fake.url) as gw:
        status, body = await post(http, gw.url, chat(stream=stream))
        assert status == 200 and body == direct
        sent = fake.completions()[-1].json
        assert sent["stream"] == stream and sent["stream_options"] == {"include_usage": True,
                                                                       "continuous_usage_stats": True}
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, status="success", request_type="stream") == 1
        s, n = samples(gw.metrics), gw.metrics.names
        assert value(s, n.ttft_by_isl + "_count", model=FAKE_MODEL, isl_bucket="513-1024") == 1
        assert requests_total(gw.metrics) == 1


@pytest.mark.parametrize("stream", ["false", 0, "no"])
async def test_lax_false_stream_is_unary(fake: ScriptedUpstream, http: aiohttp.ClientSession, stream: Any) -> None:
    async with run_gateway(fake.url) as gw:
        status, _ = await post(http, gw.url, chat(stream=stream))
        assert status == 200  # (the scripted upstream reads only a falsy "stream" as unary: 0, and "false"
        sent = fake.completions()[-1].json  # as raw truthy, so the reply's shape is not checked here)
        assert "stream_options" not in sent
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, request_type="unary") == 1 and requests_total(gw.metrics) == 1


@pytest.mark.parametrize(("url", "why"), [("http://[::1", "Invalid IPv6 URL"), ("http://[::1]x", "Invalid IPv6 URL")])
def test_bad_ipv6_upstream_is_one_line_naming_the_upstream(url: str, why: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Was ``servelens: error: Invalid IPv6 URL`` (and for "http://[::1]x" a gateway that started, then
    failed with an unclosed session)."""
    assert main(["gateway", "--upstream", url]) == 2
    assert capsys.readouterr().err == (f"servelens: error: upstream URL must look like http://host:port, "
                                       f"got {url!r} ({why})\n")


@pytest.mark.parametrize(("method", "path"), [("POST", "/metrics"), ("PUT", "/health"), ("DELETE", "/ready"),
                                              ("PATCH", "/metrics")])
async def test_other_methods_on_the_gateways_own_paths_are_openai_405(fake: ScriptedUpstream,
                                                                       http: aiohttp.ClientSession, method: str,
                                                                       path: str) -> None:
    """Was aiohttp's plain-text 404 (405 on the metrics listener); never relayed to the engine."""
    async with run_gateway(fake.url) as gw:
        async with http.request(method, gw.url + path, data=b"x") as r:
            assert r.status == 405 and r.headers["Allow"] == "GET, HEAD"
            assert json.loads(await r.read()) == {"error": {
                "message": f"{method} is not allowed on {path}; use GET", "type": "invalid_request_error",
                "param": None, "code": "method_not_allowed"}}
        assert [r.path for r in fake.requests if r.path == path] == []
    async with run_gateway(fake.url, metrics_port=0) as gw:
        async with http.request(method, gw.metrics_url, data=b"x") as r:  # the metrics listener
            assert r.status == 405 and json.loads(await r.read())["error"]["code"] == "method_not_allowed"
        async with http.post(gw.url + "/metrics", data=b"x") as r:  # the API port exposes no metrics
            assert r.status == 404 and json.loads(await r.read())["error"]["code"] == "not_found"


@pytest.mark.parametrize("coding", ["br", "zstd"])
async def test_body_in_a_coding_aiohttp_cannot_decode_is_refused_with_the_head(
        fake: ScriptedUpstream, http: aiohttp.ClientSession, coding: str) -> None:
    """As documented (gateway/accounting.py, README): aiohttp refuses the head before any route, so the
    request names no endpoint and is in no requests_total; a gzip body that does not decode is read by
    the handler: 400 invalid_body, counted validation."""
    async with run_gateway(fake.url) as gw:
        for enc, status, code in ((coding, 400, "bad_request"), ("gzip", 400, "invalid_body")):
            async with http.post(gw.url + "/v1/chat/completions", data=b"\x00\x01not that coding",
                                 headers={"Content-Encoding": enc, "Content-Type": "application/json"}) as r:
                assert r.status == status and json.loads(await r.read())["error"]["code"] == code
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics) == 1 == requests_total(gw.metrics, error_type="validation")
        assert not fake.completions()


CUT = b'data: {"choi'  # the body ends inside an event


def _raw_sse_upstream(events: bytes) -> Any:
    """A raw HTTP/1.1 upstream answering a chat stream whose body is ``events``, delimited by the
    connection's close (no Content-Length, not chunked), and the model list."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head, _ = await read_http_request(r)
        if head.startswith(b"GET /v1/models"):
            body = json.dumps({"object": "list", "data": [{"id": FAKE_MODEL, "object": "model"}]}).encode()
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                    % (len(body), body))
        else:
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + events)
        await w.drain()

    return raw_tcp_server(handler)


@pytest.mark.parametrize("framing", ["chunked", "close"])
@pytest.mark.parametrize(("last", "error_type"), [
    (CUT, "truncated_stream"),  # was backend_error (a malformed chunk)
    (b"data: [DONE]", ""),  # a whole last line without its blank line: read (the decoder's leniency)
    (tok("c", "stop").rstrip(b"\n"), ""),
    (b'data: {"error": {"message": "boom"}}', "backend_error"),  # it parses: an in-stream error
])
async def test_body_ending_inside_an_event_is_truncated(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                        framing: str, last: bytes, error_type: str) -> None:
    """One whole chunk, then a last event without its blank line, then the body's end (a chunked end, or
    the connection's close): a last event that does not parse is the stream cut (truncated_stream)."""
    events = [tok("a"), last]
    if framing == "chunked":
        fake.raw_stream = events
        ctx = contextlib.nullcontext(fake.url)
    else:
        ctx = _raw_sse_upstream(b"".join(events))
    async with ctx as where:
        url = where if isinstance(where, str) else f"http://127.0.0.1:{where[0]}"
        # chunked: usage injected, so the meter holds and strips whole events; close: relayed as read
        async with run_gateway(url, inject_usage=framing == "chunked") as gw:
            status, body = await post(http, gw.url, chat())
            assert status == 200 and body == b"".join(events)  # relayed as it came
            await gw.gateway.wait_finished(1)
            want = {"status": "success" if not error_type else "error", "error_type": error_type}
            assert requests_total(gw.metrics, **want) == 1 == requests_total(gw.metrics)
            assert inflight(gw.metrics) == 0


@pytest.mark.parametrize("vllm_errors", [True, False], ids=["vllm-400", "fastapi-422"])
async def test_an_ordinary_bad_request_gets_the_answer_to_its_own_body(http: aiohttp.ClientSession,
                                                                       vllm_errors: bool) -> None:
    """In front of a FastAPI app reading requests as vLLM does: a chat stream without ``messages``. Its
    error echoes the request without blaming what the gateway added: the gateway sends the client's own
    body once more and relays that answer, byte for byte the app's answer to the client's request (was:
    the answer to the injected request, quoting 'stream_options': {'include_usage': True}), and learns
    nothing: the next stream still gets usage added."""
    app, bodies = vllm_like_app(vllm_errors)
    bad = json.dumps({"model": FAKE_MODEL, "stream": True, "max_tokens": 3}).encode()
    async with serve_asgi(app) as url, run_gateway(url, models={FAKE_MODEL: url}) as gw:
        direct = await post(http, url, bad)
        assert direct[0] == (400 if vllm_errors else 422) and b"stream_options" not in direct[1]
        for _ in range(2):
            status, body = await post(http, gw.url, bad)
            assert (status, body) == direct
        assert [b"stream_options" in b for b in bodies] == [False, True, False, True, False]
        status, body = await post(http, gw.url, chat())
        assert status == 200 and body.endswith(b"data: [DONE]\n\n")
        assert json.loads(bodies[-1])["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        await gw.gateway.wait_finished(3)
        s, n = samples(gw.metrics), gw.metrics.names
        assert value(s, n.ttft_by_isl + "_count", model=FAKE_MODEL, isl_bucket="513-1024") == 1
        assert requests_total(gw.metrics, error_type="validation") == 2 and requests_total(gw.metrics) == 3


async def test_an_error_about_another_field_is_relayed_after_one_request(http: aiohttp.ClientSession) -> None:
    """``max_tokens: "abc"``: the error blames max_tokens and shows nothing added: one request upstream."""
    app, bodies = vllm_like_app()
    async with serve_asgi(app) as url, run_gateway(url, models={FAKE_MODEL: url}) as gw:
        status, body = await post(http, gw.url, chat(max_tokens="abc"))
        assert status == 400 and b"'loc': ('body', 'max_tokens')" in body
        assert len(bodies) == 1 and b"stream_options" in bodies[0]


@pytest.mark.parametrize("vllm_errors", [True, False], ids=["vllm-400", "fastapi-422"])
async def test_an_upstream_forbidding_continuous_usage_is_learned(http: aiohttp.ClientSession,
                                                                  vllm_errors: bool) -> None:
    app, bodies = vllm_like_app(vllm_errors, strict_options=True)
    async with serve_asgi(app) as url, run_gateway(url, models={FAKE_MODEL: url}) as gw:
        for _ in range(2):
            status, body = await post(http, gw.url, chat())
            assert status == 200 and b'"usage"' not in body
        assert [json.loads(b)["stream_options"] for b in bodies] == [
            {"include_usage": True, "continuous_usage_stats": True}, {"include_usage": True}, {"include_usage": True}]
        await gw.gateway.wait_finished(2)
        s, n = samples(gw.metrics), gw.metrics.names
        assert value(s, n.ttft_by_isl + "_count", model=FAKE_MODEL, isl_bucket="513-1024") == 2
