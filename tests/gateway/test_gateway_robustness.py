"""The gateway against hostile input: request bodies and upstream answers it must survive."""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import gc
import gzip
import json
import logging
import select
import socket
import termios
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from servelens.gateway import measured
from servelens.gateway.config import GatewayConfig
from servelens.gateway.prompt import PromptCounter
from servelens.gateway.requestlog import read_request_log
from servelens.gateway.server import start_gateway
from servelens.gateway.testing import (
    FAKE_MODEL,
    ScriptedUpstream,
    http_chunk,
    inflight,
    raw_tcp_server,
    read_http_request,
    requests_total,
    run_gateway,
    serve_app,
)

DEEP = b"[" * 200_000 + b"]" * 200_000
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOK = b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
LAST = b'data: {"choices":[{"index":0,"delta":{"content":"y"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}


async def post(http: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, bytes]:
    async with http.post(url + "/v1/chat/completions", data=data,
                         headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.read()


def assert_openai_error(body: bytes, code: str, param: str | None = None) -> None:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code and err["param"] == param and err["message"]


@asynccontextmanager
async def raw_upstream(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """An upstream serving ``FAKE_MODEL`` whose completions are answered by ``handler``."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": FAKE_MODEL, "object": "model"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", handler)
    async with serve_app(app) as url:
        yield url


@pytest.mark.parametrize("body", [DEEP, b'{"model":"fake-model","messages":' + DEEP + b"}"], ids=["array", "member"])
async def test_request_nested_too_deep_is_400_and_counted(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                          body: bytes) -> None:
    async with run_gateway(fake.url) as gw:
        status, got = await post(http, gw.url, body)
        assert status == 400
        assert_openai_error(got, "invalid_json")
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model="unknown_model", error_type="validation") == 1
        assert requests_total(gw.metrics) == 1 and inflight(gw.metrics) == 0
        assert not fake.completions()


@pytest.mark.parametrize("stream", [False, True])
async def test_unknown_model_with_a_lone_surrogate_is_an_openai_404(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                                    stream: bool) -> None:
    # JSON lets a client escape a lone surrogate; the 404 echoes the name (it was a 500 with aiohttp's
    # text and a traceback: the error body could not be encoded)
    body = b'{"model":"\\ud800x","messages":[],"stream":%s}' % (b"true" if stream else b"false")
    async with run_gateway(fake.url) as gw:
        status, got = await post(http, gw.url, body)
        assert status == 404
        assert_openai_error(got, "model_not_found")
        assert "\ud800x" in json.loads(got)["error"]["message"]
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model="unknown_model", error_type="not_found") == 1
        assert requests_total(gw.metrics) == 1 and inflight(gw.metrics) == 0


async def test_passthrough_body_nested_too_deep_is_relayed(http: aiohttp.ClientSession) -> None:
    # with several upstreams the passthrough reads the body for a model name to route by
    a, b = ScriptedUpstream(models=["m-a"]), ScriptedUpstream(models=["m-b"])
    await a.start()
    await b.start()
    try:
        async with run_gateway(models={"m-a": a.url, "m-b": b.url}) as gw, \
                http.post(gw.url + "/v1/tokenize", data=DEEP) as r:
            assert r.status == 200 and (await r.json())["len"] == len(DEEP)
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.parametrize("stream", ["maybe", 2, " true", 0.5, [], {}])
async def test_stream_not_a_bool_is_400_before_the_upstream(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                            stream: Any) -> None:
    # values that vLLM's and SGLang's pydantic refuse too ("true" and 1 it reads as a stream, and so
    # does the gateway: tests/gateway/test_gateway_edges.py)
    async with run_gateway(fake.url) as gw:
        status, got = await post(http, gw.url, json.dumps(chat(stream=stream)).encode())
        assert status == 400
        assert_openai_error(got, "invalid_type", "stream")
        assert requests_total(gw.metrics, error_type="validation") == 1
        assert requests_total(gw.metrics) == 1 and inflight(gw.metrics) == 0
        assert not fake.completions()
        # null is the default (unary), as in the OpenAI API
        status, _ = await post(http, gw.url, json.dumps(chat(stream=None)).encode())
        assert status == 200
        assert requests_total(gw.metrics, status="success", request_type="unary") == 1


async def test_upstream_chunk_nested_too_deep_is_relayed_to_the_end(http: aiohttp.ClientSession) -> None:
    events = [ROLE, TOK, b"data: " + DEEP + b"\n\n", TOK, LAST]

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(ev)
        await resp.write_eof()
        return resp

    async with raw_upstream(handler) as url, run_gateway(url, inject_usage=False) as gw:
        status, got = await post(http, gw.url, json.dumps(chat(stream=True)).encode())
        assert status == 200 and got == b"".join(events)  # not cut as an internal error
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model=FAKE_MODEL, error_type="backend_error") == 1
        assert requests_total(gw.metrics) == 1 and inflight(gw.metrics) == 0


async def test_unary_answer_nested_too_deep_is_relayed(http: aiohttp.ClientSession) -> None:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=DEEP, content_type="application/json")

    async with raw_upstream(handler) as url, run_gateway(url) as gw:
        status, got = await post(http, gw.url, json.dumps(chat()).encode())
        assert status == 200 and got == DEEP  # the upstream's answer, not a 500 of ours
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model=FAKE_MODEL, error_type="backend_error") == 1
        assert requests_total(gw.metrics) == 1 and inflight(gw.metrics) == 0


async def test_model_list_nested_too_deep_does_not_stop_the_gateway(http: aiohttp.ClientSession) -> None:
    async def models(request: web.Request) -> web.Response:
        return web.Response(body=b'{"data":' + DEEP + b"}", content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    async with serve_app(app) as url, run_gateway(url) as gw:
        assert gw.gateway.router.last_poll is not None and not gw.gateway.router.last_poll.ok
        status, got = await post(http, gw.url, json.dumps(chat()).encode())
        assert status == 502
        assert_openai_error(got, "upstream_unavailable")


async def test_model_lists_that_never_end_are_not_held(monkeypatch: pytest.MonkeyPatch,
                                                        http: aiohttp.ClientSession) -> None:
    # an upstream whose /v1/models answer never ends: every poll held it whole for its 5 s
    # (2.5 GB here); now a list over MAX_MODEL_LIST_BYTES is a failed poll, and the merged list
    # of several upstreams and /ready do not hold it either
    from servelens.gateway import admin, models

    monkeypatch.setattr(models, "MAX_MODEL_LIST_BYTES", 64 * 1024)
    monkeypatch.setattr(admin, "MAX_MODEL_LIST_BYTES", 64 * 1024)
    sent: list[int] = []

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"data":[{"id":"')
        sent.append(0)
        with contextlib.suppress(ConnectionError):
            while sent[-1] < 64 * 1024 * 1024:  # bounded, in case the gateway reads it all
                await resp.write(b"x" * 65536)
                sent[-1] += 65536
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", endless)
    async with serve_app(app) as url, asyncio.timeout(20):
        async with run_gateway(url) as gw:
            poll = gw.gateway.router.last_poll
            assert poll is not None and not poll.ok and poll.error == "answer over 65536 bytes"
            status, got = await post(http, gw.url, json.dumps(chat()).encode())
            assert status == 502
            assert_openai_error(got, "upstream_unavailable")
            async with http.get(gw.url + "/ready") as r:
                assert r.status == 200
        async with serve_app(app) as url2, run_gateway(models={FAKE_MODEL: url, "other": url2}) as gw, \
                http.get(gw.url + "/v1/models") as r:
            assert r.status == 200
            assert sorted(m["id"] for m in (await r.json())["data"]) == [FAKE_MODEL, "other"]
    assert max(sent) < 16 * 1024 * 1024


async def test_prompt_counting_in_its_thread_does_not_block_the_event_loop(tmp_path: Path) -> None:
    # the gateway counts prompt tokens in a worker thread; Tokenizer.encode holds the GIL for the
    # whole encoding (seconds for a long prompt), which stalled every stream on the event loop
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hi": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    counter = PromptCounter(str(path))
    n = 400_000
    obj = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": " ".join(["hi"] * n)}]}
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    ticks: list[float] = []

    async def heartbeat() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.001)
            ticks.append(time.perf_counter())

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)  # the heartbeat is running before the thread starts
    t0 = time.perf_counter()
    got = await loop.run_in_executor(None, counter.count, obj)
    t1 = time.perf_counter()
    stop.set()
    await beat
    assert got == n
    # the loop kept turning while the thread counted: a held GIL lets it turn at most once or twice
    # in that time, however long the count takes (counted in turns, not seconds: a busy machine
    # makes both the count and each turn slower alike)
    turns = sum(t0 < t < t1 for t in ticks)
    assert turns >= 10, (turns, t1 - t0)


@pytest.mark.parametrize("stream", [False, True])
async def test_reply_faster_than_the_tokenizer_is_not_held_back(fake: ScriptedUpstream, tmp_path: Path,
                                                                stream: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # the gateway waited (up to 1 s) for a prompt count still running when the upstream answered:
    # a unary reply reached the client that much later, every duration was that much longer, and
    # a client closing its connection after the reply turned the success into "cancelled"
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hi": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    release = threading.Event()
    log_path = tmp_path / "log.jsonl"
    # the gateway waits for the count as long as it takes: a reply held back for it would never come
    # (the count is released only once the client has its reply), so the claim is checked without a clock
    monkeypatch.setattr(measured, "COUNT_GRACE_S", 3600.0)
    async with run_gateway(fake.url, tokenizer=str(path), inject_usage=False, request_log=str(log_path)) as gw:
        counter = gw.gateway.prompt_counter
        assert counter is not None
        real_count = counter.count

        def slow_count(obj: dict[str, Any]) -> int | None:
            release.wait(30.0)  # a long prompt: the count ends after the reply
            return real_count(obj)

        counter.count = slow_count  # type: ignore[method-assign]
        try:
            # a client that closes its connection once it has the reply (as HTTP/1.0 clients do)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as once, \
                    asyncio.timeout(20):
                status, _ = await post(once, gw.url, json.dumps(chat(stream=stream)).encode())
            assert status == 200
            assert not release.is_set() and gw.gateway.finished_total == 0  # the count is still running
            released_ns = time.perf_counter_ns()
        finally:
            release.set()
        await gw.gateway.wait_finished(1)
        (entry,) = read_request_log(log_path)
        assert entry["status"] == "success"
        # the request's time ended with the reply, not with the count (same clock: the gateway is in-process)
        arrival_ns, duration_s = entry["arrival_ns"], entry["duration_s"]
        assert isinstance(arrival_ns, int) and isinstance(duration_s, float)
        assert arrival_ns + duration_s * 1e9 < released_ns


@pytest.mark.parametrize("target", ["/v1/files?purpose=a%26b&name=x%2Fy%3D", "/v1/%2e%2e/admin", "/v1/x/../../admin",
                                    "/v1/a%20b/c%3Fd", "/v1//x"])
async def test_passthrough_request_target_is_relayed_unchanged(target: str) -> None:
    # the upstream URL was rebuilt from the decoded URL: escapes in the query were decoded
    # (a%26b became two parameters) and dot segments resolved (a /v1/ path reached /admin)
    seen: list[str] = []

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": FAKE_MODEL, "object": "model"}]})

    async def anything(request: web.Request) -> web.Response:
        seen.append(request.raw_path)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_route("*", "/{tail:.*}", anything)
    async with serve_app(app) as url, run_gateway(url) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
        await writer.wait_closed()
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert seen == [target]


async def test_measured_request_keeps_its_query_string(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    # e.g. Azure-style clients send ?api-version=...; the measured routes dropped the query
    async with run_gateway(fake.url) as gw:
        for stream in (False, True):
            target = URL(gw.url + "/v1/chat/completions?api-version=2024-06-01&x=a%2Fb", encoded=True)
            async with http.post(target, json=chat(stream=stream)) as r:
                assert r.status == 200
                await r.read()
        await gw.gateway.wait_finished(2)
        assert requests_total(gw.metrics, model=FAKE_MODEL, status="success") == 2
    assert [r.path for r in fake.completions()] == ["/v1/chat/completions"] * 2
    assert [r.query for r in fake.completions()] == ["api-version=2024-06-01&x=a%2Fb"] * 2


async def test_passthrough_client_gone_during_a_write_is_not_a_handler_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # a write to a client connection already closing raises ConnectionResetError before aiohttp
    # cancels the handler (seen under load): the passthrough let it escape (a logged traceback
    # and an attempted 500 on the dead connection)
    body = b'{"object":"list","data":[{"id":"fake-model","object":"model"}]}'

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # plain asyncio (not aiohttp), so the patched aiohttp write below only hits the gateway
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def gone(self: web.StreamResponse, data: bytes) -> None:
        raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")

    try:
        async with run_gateway(f"http://127.0.0.1:{port}") as gw:
            monkeypatch.setattr(web.StreamResponse, "write", gone)
            caplog.set_level(logging.ERROR, logger="aiohttp.server")
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5.0)  # the gateway closes the connection
            writer.close()
            await writer.wait_closed()
            monkeypatch.undo()
            assert b" 500 " not in answer.split(b"\r\n", 1)[0]
            assert not [r for r in caplog.records if r.name == "aiohttp.server"], "handler error logged"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
async def test_gzip_request_body_is_forwarded_decoded(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                      path: str) -> None:
    # aiohttp decodes a gzip request body for the gateway; the header went upstream with the
    # decoded bytes, so the upstream failed to decode them again
    plain = json.dumps(chat()).encode()
    async with run_gateway(fake.url) as gw, http.post(
        gw.url + path, data=gzip.compress(plain),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    ) as r:
        assert r.status == 200
        await r.read()
    (got,) = [q for q in fake.requests if q.path == path]
    assert got.body == plain
    assert "content-encoding" not in {k.lower() for k in got.headers}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
async def test_request_body_that_cannot_be_decoded_is_400(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                          path: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="aiohttp.server")
    async with run_gateway(fake.url) as gw:
        async with http.post(gw.url + path, data=json.dumps(chat()).encode(),
                             headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}) as r:
            assert r.status == 400
            assert_openai_error(await r.read(), "invalid_body")
        if path == "/v1/chat/completions":
            assert requests_total(gw.metrics, model="unknown_model", error_type="validation") == 1
            assert requests_total(gw.metrics) == 1 and inflight(gw.metrics) == 0
    assert not [q for q in fake.requests if q.path == path]
    assert not [r for r in caplog.records if r.name == "aiohttp.server"], "error logged"


async def test_client_error_naming_stream_options_does_not_stop_usage_injection(http: aiohttp.ClientSession) -> None:
    # a validation error can echo the whole request (pydantic's input_value), injected
    # stream_options included: one bad client request must not turn injection off for everyone
    seen: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        obj = json.loads(await request.read())
        seen.append(obj)
        if "tool_choice" in obj and "tools" not in obj:
            return web.json_response({"error": {"message": f"Value error, tool_choice needs tools "
                                                f"[input_value={json.dumps(obj)}]", "type": "BadRequestError",
                                                "param": None, "code": 400}}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(LAST)
        await resp.write_eof()
        return resp

    async with raw_upstream(handler) as url, run_gateway(url) as gw:
        status, got = await post(http, gw.url, json.dumps(chat(stream=True, tool_choice="auto")).encode())
        assert status == 400 and b"tool_choice needs tools" in got  # the client's error, relayed
        status, _ = await post(http, gw.url, json.dumps(chat(stream=True)).encode())
        assert status == 200
        await gw.gateway.wait_finished(2)
    # the good request still got usage (continuous) injected
    assert seen[-1]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


async def test_upstream_bodies_that_never_end_do_not_grow_the_gateway(monkeypatch: pytest.MonkeyPatch,
                                                                      http: aiohttp.ClientSession) -> None:
    # a broken upstream sending one endless line: held whole, the gateway grew at the upstream's rate
    # (a unary body: GBs within the response timeout; a stream whose usage the gateway strips: nothing
    # reached the client either). Now a held body fails past MAX_BODY_BYTES (502 backend_error) and
    # an SSE event past MAX_EVENT_BYTES is relayed on unparsed (backend_error once the stream ends).
    from servelens.gateway import meter, upstream_response

    limit = 256 * 1024
    monkeypatch.setattr(upstream_response, "MAX_BODY_BYTES", limit)
    monkeypatch.setattr(meter, "MAX_EVENT_BYTES", limit)
    enough = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        stream = json.loads(await request.read()).get("stream", False)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream" if stream else "application/json"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"' if stream else b'{"choices":"')
        while not enough.is_set():  # unary: until the gateway hangs up
            await resp.write(b"x" * 65536)
        await resp.write(b'"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
        await resp.write_eof()
        return resp

    async with raw_upstream(handler) as url, run_gateway(url) as gw:
        async with asyncio.timeout(20):
            status, got = await post(http, gw.url, json.dumps(chat()).encode())
            assert status == 502
            assert_openai_error(got, "upstream_error")
            await gw.gateway.wait_finished(1)
            assert requests_total(gw.metrics, model=FAKE_MODEL, error_type="backend_error", request_type="unary") == 1
            async with http.post(gw.url + "/v1/chat/completions", json=chat(stream=True)) as r:
                assert r.status == 200
                received = 0
                while received <= 2 * limit:  # while the upstream is still sending its line
                    received += len(await r.content.readany())
                enough.set()
                rest = await r.read()
            assert rest.endswith(b"data: [DONE]\n\n")
            await gw.gateway.wait_finished(2)
        assert requests_total(gw.metrics, model=FAKE_MODEL, error_type="backend_error", request_type="stream") == 1
        assert requests_total(gw.metrics) == 2 and inflight(gw.metrics) == 0


async def test_html_page_for_a_stream_request_is_relayed_and_a_backend_error(http: aiohttp.ClientSession) -> None:
    # a login page or a proxy's error page in front of the engine, with status 200: relayed as it is and
    # counted backend_error, as the same page for a unary request is (it was truncated_stream)
    page = b"<html><body>Please sign in</body></html>"

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=page, content_type="text/html")

    async with raw_upstream(handler) as url, run_gateway(url) as gw:
        for stream in (True, False):
            async with http.post(gw.url + "/v1/chat/completions", json=chat(stream=stream)) as r:
                assert r.status == 200 and await r.read() == page
                assert r.headers["Content-Type"].startswith("text/html")
        await gw.gateway.wait_finished(2)
        for request_type in ("stream", "unary"):
            assert requests_total(gw.metrics, model=FAKE_MODEL, error_type="backend_error",
                                  request_type=request_type) == 1
        assert requests_total(gw.metrics) == 2 and inflight(gw.metrics) == 0


def _block_until_queued(sock: Any, n: int) -> None:
    """Block the event loop until ``n`` bytes wait unread on ``sock``, so the loop reads them in one read."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, n)  # (Linux grows the buffer to hold them)
    try:
        select.select([sock.fileno()], [], [], 5)
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
    queued = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, queued)
    assert queued[0] >= n, f"{queued[0]} of {n} bytes received"



async def test_client_half_closing_while_the_final_write_waits_is_counted_cancelled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a client that stopped reading, then closed its side, while the relay's final write_eof (the
    # stream's last read, larger than the socket buffers and the write buffer hold, and the final
    # chunk) waited to drain: aiohttp's drain waits until the client reads or resets, so the request
    # stayed uncounted and in flight
    served: list[asyncio.Transport] = []  # the gateway's side of each client connection
    made = aiohttp.web_protocol.RequestHandler.connection_made

    def connection_made(self: Any, transport: asyncio.BaseTransport) -> None:
        served.append(transport)  # type: ignore[arg-type]
        made(self, transport)

    monkeypatch.setattr(aiohttp.web_protocol.RequestHandler, "connection_made", connection_made)
    waiting: list[int] = [0]  # write_eof calls not returned
    entered = asyncio.Event()
    write_eof = web.StreamResponse.write_eof

    async def spied_write_eof(self: web.StreamResponse, data: bytes = b"") -> None:
        waiting[0] += 1
        entered.set()
        try:
            await write_eof(self, data)
        finally:
            waiting[0] -= 1

    monkeypatch.setattr(web.StreamResponse, "write_eof", spied_write_eof)
    loop_errors: list[str] = []  # e.g. aiohttp's drain waiter failed with nobody left to read it
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(str(ctx.get("message"))))
    first = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
    last = (http_chunk(b'data: {"choices":[{"index":0,"delta":{"content":"%b"},"finish_reason":"stop"}]}\n\n'
                     % (b"z" * 40_000)) + http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    held: list[asyncio.StreamWriter] = []
    got_request = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_http_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + http_chunk(first))
        held.append(w)
        got_request.set()
        while await r.read(65536):  # the test writes the rest
            pass

    async with raw_tcp_server(handler) as (port, _), \
            run_gateway(f"http://127.0.0.1:{port}", models=["m"], inject_usage=False) as gw:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the client's socket holds little
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gw.port))
        r, w = await asyncio.open_connection(sock=sock)
        try:
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
            w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%b" % (len(body), body.encode()))
            async with asyncio.timeout(5):
                await got_request.wait()
                got = b""
                while first not in got:  # the head and the first event reached the client
                    got += await r.read(65536)
            (gateway_side,) = served
            gateway_side.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            gateway_side.set_write_buffer_limits(high=4096)  # 40 KB fill both buffers
            assert isinstance(w.transport, asyncio.Transport)
            w.transport.pause_reading()  # the client reads no more
            held[0].write(last)
            assert held[0].transport.get_write_buffer_size() == 0  # sent
            (upstream,) = gw.gateway.upstream._all
            assert upstream.transport is not None
            _block_until_queued(upstream.transport.get_extra_info("socket"), len(last))  # one read: the end
            async with asyncio.timeout(5):
                await entered.wait()  # the final write began
            assert waiting[0] == 1 and inflight(gw.metrics) == 1  # it waits for the client to read
            w.write_eof()  # the client closes its side; it never reads again
            await gw.gateway.wait_finished(1, timeout=30)
            assert requests_total(gw.metrics, model="m", error_type="cancelled") == 1
            assert inflight(gw.metrics) == 0
        finally:
            w.transport.abort()
    gc.collect()  # a future never retrieved is reported when it is collected
    assert not loop_errors, loop_errors


def _dechunk(body: bytes) -> bytes:
    """The payload of a chunked body that ends with its last chunk (AssertionError otherwise)."""
    out, pos = b"", 0
    while True:
        end = body.index(b"\r\n", pos)
        size = int(body[pos:end], 16)
        out += body[end + 2:end + 2 + size]
        assert body[end + 2 + size:end + 4 + size] == b"\r\n", "chunk framing"
        pos = end + 4 + size
        if size == 0:
            assert pos == len(body), "bytes after the last chunk"
            return out


async def test_request_line_saying_http_2_gets_a_well_framed_stream() -> None:
    # aiohttp's server reads "HTTP/2.0" in a plain-text request line as a version above 1.1 and frames
    # the response chunked itself: the relay's own writes (reads after the first) must be framed the
    # same (asking for chunked encoding made prepare() fail: an internal error, nothing relayed)
    events = [b'data: {"choices":[{"index":0,"delta":{"content":"%b"},"finish_reason":%b}]}\n\n'
              % (word, b'"stop"' if word == b"c" else b"null") for word in (b"a", b"b", b"c")]
    events.append(b"data: [DONE]\n\n")
    step = [asyncio.Event() for _ in events]

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_http_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i, event in enumerate(events):  # one read each: the client has seen one before the next
            w.write(http_chunk(event) + (b"0\r\n\r\n" if i == len(events) - 1 else b""))
            await w.drain()
            if i < len(events) - 1:
                await step[i].wait()

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    async with raw_tcp_server(handler) as (port, _), \
            run_gateway(f"http://127.0.0.1:{port}", models=["m"], inject_usage=False) as gw:
        r, w = await asyncio.open_connection("127.0.0.1", gw.port)
        w.write(b"POST /v1/chat/completions HTTP/2.0\r\nHost: gw\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        got = b""
        async with asyncio.timeout(5):
            for i, event in enumerate(events[:-1]):
                while event not in got:
                    more = await r.read(65536)
                    assert more, got
                    got += more
                step[i].set()
            while more := await r.read(65536):  # to the end (the connection closes)
                got += more
        w.close()
        head, _, rest = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/2.0 200") and b"transfer-encoding: chunked" in head.lower(), head
        assert _dechunk(rest) == b"".join(events)
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, status="success") == 1


async def _open_stream(http: aiohttp.ClientSession, url: str) -> tuple[aiohttp.ClientResponse, bytes]:
    """A stream through the gateway, read up to its first content chunk (the upstream then holds it)."""
    resp = await http.post(url + "/v1/chat/completions", json=chat(stream=True, max_tokens=4))
    got = b""
    async with asyncio.timeout(5):
        while b"Hello" not in got:
            more = await resp.content.readany()
            assert more, got
            got += more
    return resp, got


async def test_shutdown_cuts_what_is_still_running_after_the_drain(fake: ScriptedUpstream,
                                                                    http: aiohttp.ClientSession) -> None:
    # aiohttp's own shutdown waited 60 s for a handler, then 60 s more after asking it to stop, which a
    # handler relaying a stream does not notice: a SIGTERM'd gateway hung 2 minutes, past any grace period
    fake.hold = asyncio.Event()  # never set: the stream stays open
    running = await start_gateway(GatewayConfig(upstream=fake.url, shutdown_timeout_s=0.3))
    resp, _ = await _open_stream(http, running.url)
    # a bound for a hung test, not a figure: aiohttp's own waits (60 s, then 60 s more) never end within it
    async with asyncio.timeout(30):
        await running.close()
        await fake.closed.wait()  # the upstream request was closed
    assert running.gateway.finished_total == 1
    assert requests_total(running.metrics, error_type="cancelled") == 1 and inflight(running.metrics) == 0
    resp.close()


async def test_shutdown_lets_a_request_in_flight_finish(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fake.hold = asyncio.Event()
    running = await start_gateway(GatewayConfig(upstream=fake.url, shutdown_timeout_s=10))
    resp, got = await _open_stream(http, running.url)
    draining = asyncio.Event()
    drain = running.gateway.drain

    async def spied_drain(timeout: float) -> bool:
        draining.set()
        return await drain(timeout)

    monkeypatch.setattr(running.gateway, "drain", spied_drain)
    closing = asyncio.create_task(running.close())
    async with asyncio.timeout(5):
        await draining.wait()  # the gateway stopped listening and waits for the stream
        with pytest.raises(aiohttp.ClientConnectionError):  # no new connections
            async with http.get(running.url + "/health", headers={"Connection": "close"}):
                pass
        fake.hold.set()
        got += await resp.read()  # the stream runs to its end
        await closing
    assert got.endswith(b"data: [DONE]\n\n")
    assert requests_total(running.metrics, status="success") == 1 and inflight(running.metrics) == 0


# ----------------------------------------------------------------------------- slow clients


async def _read_to_eof(r: asyncio.StreamReader, within_s: float) -> bytes:
    """Everything the gateway sends until it closes the connection (fails past ``within_s``)."""
    got = b""
    async with asyncio.timeout(within_s):
        while more := await r.read(65536):
            got += more
    return got


async def _exchange(port: int, data: bytes, within_s: float = 10) -> tuple[bytes, bytes]:
    """Send ``data`` on a new connection, then ``(head, body)`` of all that comes back until the
    gateway closes it (fails past ``within_s``)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    got = await _read_to_eof(r, within_s)
    w.close()
    head, _, body = got.partition(b"\r\n\r\n")
    return head, body


async def test_connection_without_a_whole_request_head_is_closed(fake: ScriptedUpstream) -> None:
    # a slowloris client: half a request head, then silence; aiohttp's own default held it for an hour
    async with run_gateway(fake.url, client_timeout_s=0.3) as gw:
        r, w = await asyncio.open_connection("127.0.0.1", gw.port)
        w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")
        assert await _read_to_eof(r, 10) == b""  # closed, nothing answered (there is no request)
        w.close()
        assert requests_total(gw.metrics) == 0


async def test_idle_keep_alive_connection_is_closed(fake: ScriptedUpstream) -> None:
    async with run_gateway(fake.url, client_timeout_s=0.3) as gw:
        head, _ = await _exchange(gw.port, b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")  # then idle
        assert head.startswith(b"HTTP/1.1 200"), head


async def test_unread_body_of_an_answered_request_is_not_waited_for_long(fake: ScriptedUpstream) -> None:
    # /health answers without reading a body; aiohttp then reads the rest of it before closing, for
    # up to 10 s of its own: no longer than client_timeout_s
    async with run_gateway(fake.url, client_timeout_s=0.3) as gw:
        head, _ = await _exchange(gw.port, b"GET /health HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n{", 5)
        assert head.startswith(b"HTTP/1.1 200"), head


async def test_request_body_that_stops_arriving_is_408_and_counted(fake: ScriptedUpstream) -> None:
    body = json.dumps(chat(stream=True)).encode()
    async with run_gateway(fake.url, client_timeout_s=0.3) as gw:
        head, rest = await _exchange(gw.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                                     % (len(body), body[:10]))  # the rest never comes
        assert head.startswith(b"HTTP/1.1 408"), head
        assert_openai_error(rest, "request_timeout")
        assert b"stopped arriving for 0.3 s" in rest
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics) == 1
        assert requests_total(gw.metrics, status="error", error_type="validation") == 1
        assert inflight(gw.metrics) == 0
        assert not [q for q in fake.requests if q.path == "/v1/chat/completions"]  # nothing went upstream


async def test_passthrough_body_that_stops_arriving_is_408(fake: ScriptedUpstream) -> None:
    async with run_gateway(fake.url, client_timeout_s=0.3) as gw:
        head, rest = await _exchange(gw.port, b"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\n"
                                     b"Content-Length: 100\r\n\r\n{")
        assert head.startswith(b"HTTP/1.1 408"), head
        assert_openai_error(rest, "request_timeout")
        assert not [q for q in fake.requests if q.path == "/v1/embeddings"]
        assert requests_total(gw.metrics) == 0  # not a measured endpoint


async def test_request_body_arriving_slowly_but_steadily_is_served(fake: ScriptedUpstream) -> None:
    # the bound is on silence between reads, not on the whole body: 6 pieces 0.25 s apart (1.25 s in
    # all, over the 1 s bound) are one request served
    body = json.dumps(chat()).encode()
    size = len(body) // 6 + 1
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    assert len(pieces) == 6
    async with run_gateway(fake.url, client_timeout_s=1.0) as gw:
        r, w = await asyncio.open_connection("127.0.0.1", gw.port)
        w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        for piece in pieces:
            w.write(piece)
            await w.drain()
            await asyncio.sleep(0.25)  # pacing the client (0.75 s under the bound), not waiting for an outcome
        got = await _read_to_eof(r, 10)
        w.close()
        assert got.startswith(b"HTTP/1.1 200"), got
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, status="success") == 1


async def test_gzip_request_body_arriving_slowly_is_served(fake: ScriptedUpstream) -> None:
    # silence is counted on the bytes the client sends, not on the decoded body: the gzip header and
    # the deflate block's code tables (the first 48 bytes here) decode to nothing
    words = " ".join(f"word{i} token{i * 7 % 13} piece{i % 5}" for i in range(60))
    body = gzip.compress(json.dumps(chat(messages=[{"role": "user", "content": words}])).encode())
    assert len(zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body[:48])) == 0
    pieces = [body[:10], body[10:30], body[30:48], body[48:]]  # 0.6 s apart: 1.8 s without decoded bytes
    async with run_gateway(fake.url, client_timeout_s=1.0) as gw:
        r, w = await asyncio.open_connection("127.0.0.1", gw.port)
        w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                b"Content-Encoding: gzip\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        for i, piece in enumerate(pieces):
            if i:
                await asyncio.sleep(0.6)  # pacing the client (0.4 s under the bound), not waiting for an outcome
            w.write(piece)
            await w.drain()
        got = await _read_to_eof(r, 10)
        w.close()
        assert got.startswith(b"HTTP/1.1 200"), got
        assert requests_total(gw.metrics, status="success") == 1


async def test_compressed_body_over_the_limit_as_sent_is_413(fake: ScriptedUpstream) -> None:
    # deflate data that decodes to nothing (empty stored blocks): over max_body_bytes as sent, it is
    # refused, not waited on for ever
    blocks = b"\x78\x9c" + b"\x00\x00\x00\xff\xff" * 400  # 2,002 bytes, 0 decoded
    async with run_gateway(fake.url, client_timeout_s=0.3, max_body_bytes=1024) as gw:
        head, rest = await _exchange(gw.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                                     b"Content-Type: application/json\r\nContent-Encoding: deflate\r\n"
                                     b"Transfer-Encoding: chunked\r\n\r\n" + http_chunk(blocks))
        assert head.startswith(b"HTTP/1.1 413"), head
        assert_openai_error(rest, "request_too_large")
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, status="error", error_type="validation") == 1


def test_client_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="client_timeout_s must be > 0 seconds"):
        GatewayConfig(upstream="http://127.0.0.1:1", client_timeout_s=0)
