"""The gateway against a scripted upstream whose bytes we control exactly."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from servelens.gateway.requestlog import read_request_log
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


def chat(stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stream": stream, **extra}


async def post(http: aiohttp.ClientSession, url: str, body: Any, path: str = "/v1/chat/completions",
               **kw: Any) -> tuple[int, bytes, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(url + path, data=data, headers={"Content-Type": "application/json", **kw}) as r:
        return r.status, await r.read(), r.headers.copy()


@pytest.mark.parametrize("usage_style", ["vllm", "openai"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("client_options", [None, {"include_usage": True},
                                            {"include_usage": True, "continuous_usage_stats": True}])
async def test_client_bytes_equal_upstream_bytes(
    fake: ScriptedUpstream, http: aiohttp.ClientSession, usage_style: str, path: str, client_options: Any
) -> None:
    fake.usage_style = usage_style
    body = chat(max_tokens=5)
    if path == "/v1/completions":
        body = {"model": FAKE_MODEL, "prompt": "hi", "max_tokens": 5, "stream": True}
    if client_options is not None:
        body["stream_options"] = client_options
    _, direct, _ = await post(http, fake.url, body, path)
    async with run_gateway(fake.url) as gw:
        # twice: the first include_usage-only request teaches the gateway the upstream's style
        for _ in range(2):
            status, via, headers = await post(http, gw.url, body, path)
            assert status == 200
            assert via == direct
        await gw.gateway.wait_finished(2)
        sent = fake.completions()[-1].json
        so = sent["stream_options"]
        assert so["include_usage"] is True and so["continuous_usage_stats"] is True  # injected (or the client's)
        assert headers["x-request-id"] == "req-stream" and headers["X-Custom"] == "kept"
        s = samples(gw.metrics)
        n = gw.metrics.names
        ep = "chat_completions" if "chat" in path else "completions"
        assert value(s, n.requests, endpoint=ep, error_type="", model=FAKE_MODEL, request_type="stream",
                     status="success") == 2
        # ISL 700 -> bucket 513-1024; exact tokens per chunk from continuous usage (last request)
        assert value(s, n.ttft_by_isl + "_count", model=FAKE_MODEL, isl_bucket="513-1024") == 2
        assert value(s, n.osl + "_sum", model=FAKE_MODEL) == 10
        assert value(s, n.cached + "_sum", model=FAKE_MODEL) == 256
        assert inflight(gw.metrics) == 0


async def test_learned_usage_null_style(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    fake.usage_style = "openai"
    body = chat(stream_options={"include_usage": True})
    async with run_gateway(fake.url) as gw:
        await post(http, gw.url, body)
        first = fake.completions()[-1].json["stream_options"]
        assert first == {"include_usage": True}  # learning request: sent as the client asked
        assert gw.gateway.measured.usage_null == {fake.url: True}
        await post(http, gw.url, body)
        assert fake.completions()[-1].json["stream_options"]["continuous_usage_stats"] is True


async def test_unary_relayed_and_measured(fake: ScriptedUpstream, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    log = tmp_path / "req.jsonl"
    _, direct, _ = await post(http, fake.url, chat(stream=False))
    async with run_gateway(fake.url, request_log=str(log)) as gw:
        status, via, headers = await post(http, gw.url, chat(stream=False), Authorization="Bearer sk-secret-123")
        assert status == 200 and via == direct
        assert int(headers["Content-Length"]) == len(direct)
        assert fake.completions()[-1].body == json.dumps(chat(stream=False)).encode()  # untouched body
        assert fake.completions()[-1].headers["Authorization"] == "Bearer sk-secret-123"
        await gw.gateway.wait_finished(1)
        s = samples(gw.metrics)
        n = gw.metrics.names
        assert value(s, n.requests, endpoint="chat_completions", error_type="", model=FAKE_MODEL,
                     request_type="unary", status="success") == 1
        assert value(s, n.ttft + "_count", model=FAKE_MODEL) == 0  # no TTFT for unary
        assert value(s, n.duration_by_isl + "_count", model=FAKE_MODEL, isl_bucket="513-1024") == 1
        assert value(s, n.osl + "_sum", model=FAKE_MODEL) == 4
    entries = read_request_log(log)
    assert entries == [{
        "upstream_request_id": "req-unary", "model": FAKE_MODEL, "endpoint": "chat_completions",
        "request_type": "unary", "isl": 700, "isl_source": "final_usage", "bucket": "513-1024", "ttft_s": None,
        "duration_s": entries[0]["duration_s"], "osl": 4, "osl_source": "usage", "cached_tokens": 128,
        "output_chunks": 0, "status": "success", "error_type": "", "http_status": 200,
        "arrival_ns": entries[0]["arrival_ns"], "first_output_ns": None,
        "chunk_offsets_ns": None, "chunk_tokens": None,  # only with --request-log-chunks
    }]
    assert "sk-secret" not in log.read_text()


async def test_headers_forwarded_except_hop_by_hop(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    async with run_gateway(fake.url) as gw:
        await post(http, gw.url, chat(), Authorization="Bearer tok", **{"X-Trace": "t1", "Keep-Alive": "timeout=5",
                                                                        "Connection": "keep-alive, X-Drop",
                                                                        "X-Drop": "x"})
    got = {k.lower(): v for k, v in fake.completions()[-1].headers.items()}
    assert got["authorization"] == "Bearer tok" and got["x-trace"] == "t1"
    assert "keep-alive" not in got and "x-drop" not in got
    assert got["host"] == fake.url.removeprefix("http://")
    assert got["accept-encoding"] == "identity"


@pytest.mark.parametrize(
    ("payload", "status", "code", "error_type", "model"),
    [
        (b"{not json", 400, "invalid_json", "validation", "unknown_model"),
        (b"[1, 2]", 400, "invalid_json", "validation", "unknown_model"),
        (json.dumps({"messages": []}).encode(), 400, "missing_model", "validation", "unknown_model"),
        (json.dumps(chat(model="nope")).encode(), 404, "model_not_found", "not_found", "unknown_model"),
    ],
)
async def test_bad_requests_openai_errors(fake: ScriptedUpstream, http: aiohttp.ClientSession, payload: bytes,
                                          status: int, code: str, error_type: str, model: str) -> None:
    async with run_gateway(fake.url) as gw:
        got, body, _ = await post(http, gw.url, payload)
        assert got == status
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == code
        assert requests_total(gw.metrics, model=model, error_type=error_type, status="error") == 1
        assert requests_total(gw.metrics) == 1
        assert inflight(gw.metrics) == 0
        assert not fake.completions()
        # no request can create a model series
        assert set(gw.metrics.state.models) == {FAKE_MODEL}


async def test_body_over_limit_is_413(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    async with run_gateway(fake.url, max_body_bytes=4096) as gw:
        big = chat(messages=[{"role": "user", "content": "x" * 10_000}])
        status, body, _ = await post(http, gw.url, big)
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
        assert requests_total(gw.metrics, model="unknown_model", error_type="validation") == 1


@pytest.mark.parametrize(("upstream_status", "error_type"),
                         [(400, "validation"), (404, "not_found"), (429, "overload"), (503, "overload"),
                          (500, "backend_error"), (502, "backend_error")])
@pytest.mark.parametrize("stream", [True, False])
async def test_upstream_error_status_relayed(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                             upstream_status: int, error_type: str, stream: bool) -> None:
    fake.status = upstream_status
    _, direct, _ = await post(http, fake.url, chat(stream=stream))
    async with run_gateway(fake.url) as gw:
        status, body, headers = await post(http, gw.url, chat(stream=stream))
        assert status == upstream_status and body == direct and headers["x-request-id"] == "req-err"
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model=FAKE_MODEL, error_type=error_type, status="error",
                              request_type="stream" if stream else "unary") == 1
        assert inflight(gw.metrics) == 0
        s = samples(gw.metrics)
        assert total(s, gw.metrics.names.ttft_by_isl + "_count") == 0  # failed before the first token


async def test_upstream_unreachable_is_502(http: aiohttp.ClientSession, fake: ScriptedUpstream) -> None:
    async with run_gateway(fake.url) as gw:
        await fake.stop()  # the model is known, the upstream is gone
        status, body, _ = await post(http, gw.url, chat())
        assert status == 502 and json.loads(body)["error"]["code"] == "upstream_unavailable"
        assert requests_total(gw.metrics, model=FAKE_MODEL, error_type="unavailable") == 1
        assert inflight(gw.metrics) == 0


async def test_discovery_down_unknown_model_is_502(http: aiohttp.ClientSession) -> None:
    down = await ScriptedUpstream().start()
    await down.stop()
    async with run_gateway(down.url) as gw:
        status, _, _ = await post(http, gw.url, chat())
        assert status == 502
        assert requests_total(gw.metrics, model="unknown_model", error_type="unavailable") == 1


async def test_upstream_timeout_is_504(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    fake.stall = asyncio.Event()
    async with run_gateway(fake.url, response_timeout_s=0.2) as gw:
        status, body, _ = await post(http, gw.url, chat())
        fake.stall.set()
        assert status == 504 and json.loads(body)["error"]["code"] == "upstream_timeout"
        assert requests_total(gw.metrics, model=FAKE_MODEL, error_type="response_timeout") == 1
        assert inflight(gw.metrics) == 0


@pytest.mark.parametrize("unfinished", [False, True])
async def test_mid_stream_silence_is_response_timeout_and_cut(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                              unfinished: bool) -> None:
    # unfinished: the cut falls inside an event. An SSE client drops it; so does the measurement (it
    # used to count it as a token read at the moment of the cut: one ITL sample as long as the silence)
    if unfinished:
        role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
        tok = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
        fake.raw_stream = [role, tok + b'data: {"choices":[{"index":0,"delta":{"content":"y"}}]}']
    fake.hold = asyncio.Event()  # silence after the first content chunk
    async with run_gateway(fake.url, read_timeout_s=0.3) as gw:
        with pytest.raises(aiohttp.ClientPayloadError):
            await post(http, gw.url, chat())
        fake.hold.set()
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model=FAKE_MODEL, error_type="response_timeout") == 1
        assert inflight(gw.metrics) == 0
        n = gw.metrics.names
        s = samples(gw.metrics)
        assert value(s, n.ttft + "_count", model=FAKE_MODEL) == 1
        assert value(s, n.itl + "_count", model=FAKE_MODEL) == 0  # one token: no gap


async def test_client_disconnect_closes_upstream_at_once(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    # the upstream keeps the stream open after the first content chunk, for ever: within the wait
    # below its request can only end because the gateway closes it (the read timeout is 600 s)
    fake.hold = asyncio.Event()
    async with run_gateway(fake.url) as gw:
        resp = await http.post(gw.url + "/v1/chat/completions", json=chat())
        first = await resp.content.readuntil(b"\n\n")
        assert b"assistant" in first
        await resp.content.readuntil(b"\n\n")  # the first content chunk: TTFT observed
        assert not fake.closed.is_set()
        resp.close()  # the client goes away
        await asyncio.wait_for(fake.closed.wait(), 30.0)  # a bound for a hung test, not a figure
        assert not fake.hold.is_set()
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model=FAKE_MODEL, error_type="cancelled", status="error") == 1
        assert inflight(gw.metrics) == 0
        assert gw.metrics.state.disconnected_clients == 1


@pytest.mark.parametrize("status", [400, 422])
async def test_continuous_usage_auto_fallback(fake: ScriptedUpstream, http: aiohttp.ClientSession, status: int) -> None:
    fake.reject_continuous = True
    fake.reject_status = status
    _, direct, _ = await post(http, fake.url, chat())
    async with run_gateway(fake.url) as gw:
        for _ in range(2):
            status, via, _ = await post(http, gw.url, chat())
            assert status == 200 and via == direct
        sent = [r.json.get("stream_options") for r in fake.completions()[1:]]
        # first: rejected with continuous, retried once without; second: without at once
        assert sent == [{"include_usage": True, "continuous_usage_stats": True}, {"include_usage": True},
                        {"include_usage": True}]
        assert requests_total(gw.metrics, status="success") == 2


@pytest.mark.parametrize("status", [400, 422])
async def test_stream_options_rejected_falls_back_to_client_body(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                                 status: int) -> None:
    fake.reject_stream_options = True
    fake.reject_status = status
    async with run_gateway(fake.url, continuous_usage="off") as gw:
        status, _, _ = await post(http, gw.url, chat())
        assert status == 200
        assert "stream_options" not in fake.completions()[-1].json
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, status="success") == 1
        # no usage at all: OSL from counted chunks, bucket unknown
        assert gw.metrics.state.models[FAKE_MODEL].isl_sources == {
            "first_chunk_usage": 0, "final_usage": 0, "tokenizer": 0, "unknown": 1}


@pytest.mark.parametrize("body", [
    json.dumps(chat()).encode("utf-16"),  # Python's json (vLLM's request parsing) reads UTF-16 and UTF-32
    b"\xef\xbb\xbf" + json.dumps(chat()).encode(),  # and a byte order mark
], ids=["utf-16", "bom"])
async def test_body_in_another_encoding_goes_upstream_unchanged(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                               body: bytes) -> None:
    # the injection inserted UTF-8 bytes into it: invalid JSON upstream
    async with run_gateway(fake.url) as gw:
        status, _, _ = await post(http, gw.url, body)
        assert status == 200 and fake.completions()[-1].body == body
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, status="success") == 1


@pytest.mark.parametrize("stream_options", [None, {}])
async def test_nan_in_the_body_stays_nan_when_usage_is_injected(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                                stream_options: Any) -> None:
    # with stream_options present the body is re-encoded, and msgspec wrote NaN as null
    extra = {} if stream_options is None else {"stream_options": stream_options}
    async with run_gateway(fake.url) as gw:
        status, _, _ = await post(http, gw.url, json.dumps(chat(temperature=float("nan"), **extra)).encode())
        assert status == 200
    sent = fake.completions()[-1]
    assert b"NaN" in sent.body and sent.json["stream_options"]["include_usage"] is True


async def test_nan_stays_nan_in_the_request_resent_without_continuous_usage(fake: ScriptedUpstream,
                                                                             http: aiohttp.ClientSession) -> None:
    fake.reject_continuous = True  # the resend re-encoded the body with msgspec: NaN became null
    async with run_gateway(fake.url) as gw:
        status, _, _ = await post(http, gw.url, json.dumps(chat(temperature=float("nan"), stream_options={})).encode())
        assert status == 200
    first, resent = fake.completions()[-2:]
    assert "continuous_usage_stats" in first.json["stream_options"] and b"NaN" in first.body
    assert resent.json["stream_options"] == {"include_usage": True} and b"NaN" in resent.body


async def test_continuous_usage_off_and_no_injection(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    async with run_gateway(fake.url, continuous_usage="off") as gw:
        await post(http, gw.url, chat())
        assert fake.completions()[-1].json["stream_options"] == {"include_usage": True}
    async with run_gateway(fake.url, inject_usage=False) as gw:
        await post(http, gw.url, chat())
        assert "stream_options" not in fake.completions()[-1].json


async def test_truncated_and_error_streams(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    tok = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
    cases = [
        ([role, tok], "truncated_stream"),
        ([role, tok, b'data: {"error":{"message":"engine died","type":"internal"}}\n\n'], "backend_error"),
        ([role], "truncated_stream"),
    ]
    want = {"truncated_stream": 0, "backend_error": 0}
    async with run_gateway(fake.url) as gw:
        for i, (events, etype) in enumerate(cases):
            fake.raw_stream = events
            status, body, _ = await post(http, gw.url, chat())
            assert status == 200 and body == b"".join(events)  # relayed as is (nothing to strip)
            await gw.gateway.wait_finished(i + 1)
            want[etype] += 1  # each case adds one to its own error type and to no other
            got = {t: requests_total(gw.metrics, error_type=t) for t in ("truncated_stream", "backend_error")}
            assert got == want, (i, got)
        assert requests_total(gw.metrics, status="success") == 0
        n = gw.metrics.names
        s = samples(gw.metrics)
        assert value(s, n.ttft + "_count", model=FAKE_MODEL) == 2  # the role-only stream has no TTFT
        assert total(s, n.ttft_by_isl + "_count") == 0  # no usage: no bucket
        assert inflight(gw.metrics) == 0


async def test_several_choices_stream_measures_the_first_choice(fake: ScriptedUpstream,
                                                                 http: aiohttp.ClientSession) -> None:
    # n=2: the choices' chunks interleave; ITL is the first choice's (2 values for its 3 tokens, not 5
    # for 6 chunks); OSL is the usage's count of both; the client's bytes are the upstream's
    def ch(i: int, word: str, reason: str | None = None) -> bytes:
        return b'data: {"choices":[{"index":%d,"delta":{"content":"%b"},"finish_reason":%b}]}\n\n' % (
            i, word.encode(), b'"%b"' % reason.encode() if reason else b"null")

    events = [ch(i, w, "stop" if w == "c" else None) for w in "abc" for i in (0, 1)]
    events.append(b'data: {"choices":[],"usage":{"prompt_tokens":700,"completion_tokens":6,"total_tokens":706}}\n\n')
    events.append(b"data: [DONE]\n\n")
    fake.raw_stream = events
    async with run_gateway(fake.url) as gw:
        status, body, _ = await post(http, gw.url, chat(n=2, stream_options={"include_usage": True}))
        assert status == 200 and body == b"".join(events)
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, status="success") == 1
        n = gw.metrics.names
        s = samples(gw.metrics)
        assert value(s, n.itl + "_count", model=FAKE_MODEL) == 2
        assert value(s, n.osl + "_sum", model=FAKE_MODEL) == 6
        assert inflight(gw.metrics) == 0


async def test_model_discovery_repoll_on_unknown_and_bounded(
    fake: ScriptedUpstream, http: aiohttp.ClientSession
) -> None:
    async with run_gateway(fake.url, repoll_min_interval_s=0, max_models=3) as gw:
        assert set(gw.metrics.state.models) == {FAKE_MODEL}
        fake.models = [FAKE_MODEL, "new-model", "m3", "m4", "m5"]
        status, _, _ = await post(http, gw.url, chat(model="new-model"))
        assert status == 200
        assert set(gw.metrics.state.models) == {FAKE_MODEL, "new-model", "m3"}  # max_models bounds it
        status, _, _ = await post(http, gw.url, chat(model="m5"))
        assert status == 404
        assert requests_total(gw.metrics, model="unknown_model", error_type="not_found") == 1


async def test_configured_models_only(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    async with run_gateway(None, models={"alias": fake.url}) as gw:
        assert set(gw.metrics.state.models) == {"alias"}
        status, _, _ = await post(http, gw.url, chat(model=FAKE_MODEL))
        assert status == 404  # the upstream's own names are not registered when models are configured
        status, _, _ = await post(http, gw.url, chat(model="alias"))
        assert status == 200
        assert not any(r.path == "/v1/models" for r in fake.requests)


async def test_several_upstreams_routed_by_model(http: aiohttp.ClientSession) -> None:
    a, b = await ScriptedUpstream(models=["a"]).start(), await ScriptedUpstream(models=["b"]).start()
    try:
        async with run_gateway(None, models={"a": a.url, "b": b.url}) as gw:
            for name, up in (("a", a), ("b", b)):
                status, _, _ = await post(http, gw.url, chat(model=name))
                assert status == 200 and up.completions()[-1].json["model"] == name
            async with http.get(gw.url + "/v1/models") as r:
                ids = sorted(d["id"] for d in (await r.json())["data"])
            assert ids == ["a", "b"]
            async with http.get(gw.url + "/ready") as r:
                assert r.status == 200
            await b.stop()
            async with http.get(gw.url + "/ready") as r:
                assert r.status == 503
                assert (await r.json())["upstreams"][a.url] == "ok"
    finally:
        await a.stop()
        await b.stop()


async def test_plain_endpoints_and_passthrough(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    async with run_gateway(fake.url) as gw:
        async with http.get(gw.url + "/health") as r:
            assert r.status == 200 and (await r.json())["status"] == "ok"
        async with http.get(gw.url + "/ready") as r:
            assert r.status == 200
        async with http.get(gw.url + "/v1/models") as r:
            assert r.status == 200 and (await r.json())["data"][0]["id"] == FAKE_MODEL
        async with http.post(gw.url + "/v1/embeddings?x=1", data=b"abc", headers={"Authorization": "Bearer k"}) as r:
            assert r.status == 200 and r.headers["X-Echo"] == "1"
            assert await r.json() == {"path": "/v1/embeddings", "query": "x=1", "len": 3}
        assert fake.requests[-1].headers["Authorization"] == "Bearer k"
        async with http.post(gw.url + "/tokenize", data=b"ab") as r:  # the engine's non-/v1 paths too
            assert r.status == 200 and await r.json() == {"path": "/tokenize", "query": "", "len": 2}
        async with http.get(gw.url + "/metrics") as r:
            text = await r.text()
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        assert "servelens_time_to_first_token_seconds_bucket" in text
        assert "servelens_time_to_first_token_by_isl_seconds_bucket" in text
        assert requests_total(gw.metrics) == 0  # passthrough is not measured
        await fake.stop()
        async with http.get(gw.url + "/ready") as r:
            assert r.status == 503


async def test_by_isl_only_and_prefix(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    async with run_gateway(fake.url, by_isl_only=True, metrics_prefix="dynamo_frontend") as gw:
        await post(http, gw.url, chat())
        await gw.gateway.wait_finished(1)
        async with http.get(gw.url + "/metrics") as r:
            text = await r.text()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert "dynamo_frontend_time_to_first_token_by_isl_seconds_count" in names
    assert "dynamo_frontend_isl_bucket_assignments_total" in names
    assert not any(n.startswith("dynamo_frontend_time_to_first_token_seconds") for n in names)
    assert "dynamo_frontend_requests_total" not in names
    with pytest.raises(ValueError, match="needs ISL bucket"):
        async with run_gateway(fake.url, by_isl_only=True, isl_buckets="off"):
            pass


async def test_isl_buckets_off(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    async with run_gateway(fake.url, isl_buckets="off") as gw:
        await post(http, gw.url, chat())
        await gw.gateway.wait_finished(1)
        assert "by_isl" not in gw.metrics.exposition().decode()
        assert requests_total(gw.metrics, status="success") == 1


async def test_tokenizer_assigns_bucket_at_arrival(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                   tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hi": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    fake.usage_style = "vllm"
    async with run_gateway(fake.url, tokenizer=str(path), inject_usage=False) as gw:
        body = chat(messages=[{"role": "user", "content": " ".join(["hi"] * 600)}])
        await post(http, gw.url, body)
        await gw.gateway.wait_finished(1)
        st = gw.metrics.state.models[FAKE_MODEL]
        assert st.isl_sources is not None and st.isl_sources["tokenizer"] == 1
        assert st.by_isl is not None and st.by_isl["513-1024"].ttft.count == 1


async def test_client_gone_while_sending_body_counted_once(fake: ScriptedUpstream) -> None:
    async with run_gateway(fake.url) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model\":")
        await writer.drain()
        writer.close()  # gone before the body is complete
        await writer.wait_closed()
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model="unknown_model", error_type="cancelled") == 1
        assert requests_total(gw.metrics) == 1
        assert gw.metrics.state.disconnected_clients == 1
        assert not fake.completions()


@pytest.mark.parametrize("stream_options", [None, {"include_usage": False}])
async def test_lone_surrogate_escapes_pass_as_the_engine_would_take_them(
    fake: ScriptedUpstream, http: aiohttp.ClientSession, stream_options: Any
) -> None:
    # Python's json (vLLM's request parsing) accepts an escaped lone surrogate; msgspec alone does not
    payload = b'{"model": "fake-model", "messages": [{"role": "user", "content": "a \\ud800 b"}], "max_tokens": 3'
    if stream_options is not None:  # the gateway must re-encode the whole object to add to stream_options
        payload += b', "stream_options": ' + json.dumps(stream_options).encode()
    async with run_gateway(fake.url) as gw:
        status, _, _ = await post(http, gw.url, payload + b"}")
        assert status == 200
        status, body, _ = await post(http, gw.url, payload + b', "stream": true}')
        assert status == 200 and body.endswith(b"data: [DONE]\n\n")
        await gw.gateway.wait_finished(2)
        assert requests_total(gw.metrics, status="success") == 2
    unary, stream = fake.completions()
    assert unary.body == payload + b"}"  # passed on as sent
    assert stream.json["messages"][0]["content"] == "a \ud800 b" and stream.json["stream_options"]["include_usage"]


async def test_invalid_json_says_why(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    async with run_gateway(fake.url) as gw:
        status, body, _ = await post(http, gw.url, b'{"model": "fake-model", "max_tokens": }')
    err = json.loads(body)["error"]
    assert status == 400 and err["code"] == "invalid_json" and err["message"].startswith("invalid JSON in the request")


async def test_json_reply_to_a_stream_request_is_measured_as_a_whole_reply(
    fake: ScriptedUpstream, http: aiohttp.ClientSession
) -> None:
    fake.ignore_stream = True
    _, direct, _ = await post(http, fake.url, chat(stream=True))
    async with run_gateway(fake.url) as gw:
        status, via, headers = await post(http, gw.url, chat(stream=True))
        assert status == 200 and via == direct and headers["Content-Type"].startswith("application/json")
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, status="success", request_type="stream") == 1
        assert total(samples(gw.metrics), "servelens_output_sequence_tokens_sum") == 4
        assert inflight(gw.metrics) == 0


async def test_other_methods_on_measured_paths_get_an_openai_405(
    fake: ScriptedUpstream, http: aiohttp.ClientSession
) -> None:
    async with run_gateway(fake.url) as gw:
        for path in ("/v1/chat/completions", "/v1/completions"):
            async with http.get(gw.url + path) as r:
                err = json.loads(await r.read())["error"]
                assert r.status == 405 and r.headers["Allow"] == "POST" and err["code"] == "method_not_allowed"
        assert requests_total(gw.metrics) == 0 and not fake.completions()


async def test_prompt_tokens_details_null_is_unknown_not_zero(fake: ScriptedUpstream, http: aiohttp.ClientSession
                                                              ) -> None:
    """Wire case 6 with ``"prompt_tokens_details": null`` from a scripted upstream (against the sim:
    its ``null_details`` mode, ``test_gateway_sim.py::test_prompt_tokens_details_null_from_the_sim...``)."""
    head = '{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":'

    def ev(choices: str, ct: int) -> bytes:
        usage = (f'{{"prompt_tokens":700,"completion_tokens":{ct},"total_tokens":{700 + ct},'
                 f'"prompt_tokens_details":null}}')
        return f"data: {head}{choices},\"usage\":{usage}}}\n\n".encode()

    fake.raw_stream = [
        ev('[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]', 0),
        ev('[{"index":0,"delta":{"content":"a"},"finish_reason":null}]', 1),
        ev('[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]', 2),
        ev("[]", 2),
        b"data: [DONE]\n\n",
    ]
    body = chat(stream_options={"include_usage": True, "continuous_usage_stats": True})  # nothing to strip
    async with run_gateway(fake.url) as gw:
        status, via, _ = await post(http, gw.url, body)
        assert status == 200 and via == b"".join(fake.raw_stream)
        await gw.gateway.wait_finished(1)
        s = samples(gw.metrics)
        n = gw.metrics.names
        assert requests_total(gw.metrics, model=FAKE_MODEL, status="success", request_type="stream") == 1
        assert inflight(gw.metrics) == 0
        assert value(s, n.ttft_by_isl + "_count", model=FAKE_MODEL, isl_bucket="513-1024") == 1
        assert value(s, n.isl + "_count", model=FAKE_MODEL) == 1
        assert value(s, n.cached + "_count", model=FAKE_MODEL) == 0  # unknown, not observed as 0
        assert total(s, n.cached_by_isl + "_count") == 0


@pytest.mark.parametrize("path", ["/v1/chat%2Fcompletions", "/v1/chat%2fcompletions"])
async def test_encoded_slash_in_a_measured_path_is_measured(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                            path: str) -> None:
    # the engine's server (uvicorn) decodes %2F and serves chat completions: the gateway relayed it
    # unmeasured, so a request could pass uncounted
    async with run_gateway(fake.url) as gw:
        async with http.post(URL(gw.url + path, encoded=True), json=chat()) as r:
            assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model=FAKE_MODEL, endpoint="chat_completions", status="success") == 1
    assert fake.completions()[-1].path == "/v1/chat/completions"


async def test_upstream_redirect_is_relayed_with_its_location_through_the_gateway() -> None:
    # FastAPI answers a trailing slash with a 307 to its own address: the gateway followed it (the
    # request then went unmeasured), and a relayed Location would send the client past the gateway
    got: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head, _ = await read_http_request(r)
            got.append(head.split(b" ")[1])
            w.write(b"HTTP/1.1 307 Temporary Redirect\r\nContent-Length: 0\r\nLocation: %b\r\n\r\n"
                    % (base.encode() + b"/v1/chat/completions?x=1"))
            await w.drain()

    async with raw_tcp_server(handler) as (port, _):
        base = f"http://127.0.0.1:{port}"
        async with run_gateway(base, models=["m"]) as gw, aiohttp.ClientSession() as http:
            body = {"model": "m", "messages": [], "stream": True}
            for path in ("/v1/chat/completions/", "/v1/chat/completions"):  # passthrough, then measured
                async with http.post(gw.url + path, json=body, allow_redirects=False) as r:
                    assert r.status == 307 and r.headers["Location"] == "/v1/chat/completions?x=1", path
    assert got == [b"/v1/chat/completions/", b"/v1/chat/completions"]  # each sent once, not followed


async def test_event_streams_say_no_proxy_buffering_and_keep_the_engines_own(
    fake: ScriptedUpstream, http: aiohttp.ClientSession
) -> None:
    async with run_gateway(fake.url) as gw:
        _, _, headers = await post(http, gw.url, chat())
        assert headers.getall("X-Accel-Buffering") == ["no"]  # nginx in front must not hold tokens
        _, _, headers = await post(http, gw.url, chat(stream=False))
        assert "X-Accel-Buffering" not in headers  # a whole JSON reply is not an event stream
        fake.stream_headers = {"X-Accel-Buffering": "yes"}  # the engine's own choice wins
        _, _, headers = await post(http, gw.url, chat())
        assert headers.getall("X-Accel-Buffering") == ["yes"]
