"""The gateway in front of the simulated engine: every wire case and error path of issue 4.

Each case sends the same request (same ``x-request-id`` prefix, same prompt) directly to the sim
and through the gateway: the client's bytes must match (only the request id differs, and
``: ping`` comments, whose count depends on timing, are compared separately).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from servelens.core.buckets import IslBuckets
from servelens.gateway import measured, meter
from servelens.gateway.requestlog import read_request_log
from servelens.gateway.testing import GatewayHandle, inflight, requests_total, run_gateway, samples, total, value
from servelens.sim.testing import SimHandle, run_sim

PROMPT = "the quick brown fox jumps over the lazy dog " * 70  # several hundred tokens
BUCKETS = IslBuckets.default()


@pytest.fixture
async def stack(tmp_path: Any) -> AsyncIterator[tuple[SimHandle, GatewayHandle]]:
    async with run_sim(speedup=20) as sim, run_gateway(sim.url, request_log=str(tmp_path / "req.jsonl")) as gw:
        yield sim, gw


def body(endpoint: str, n: int = 8, **extra: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"model": "sim-model", "max_tokens": n, "ignore_eos": True, "stream": True, **extra}
    if endpoint == "chat_completions":
        b["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        b["prompt"] = PROMPT
    return b


def path(endpoint: str) -> str:
    return "/v1/chat/completions" if endpoint == "chat_completions" else "/v1/completions"


async def fetch(url: str, b: dict[str, Any], rid: str, faults: str = "", **headers: str
                ) -> tuple[int, bytes, str | None]:
    """(status, body, error) of one request; a cut body is returned with the error's name."""
    h = {"x-request-id": rid, **headers}
    if faults:
        h["x-servelens-fault"] = faults
    chunks: list[bytes] = []
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s,
        s.post(url, json=b, headers=h) as r,
    ):
        try:
            async for data in r.content.iter_any():
                chunks.append(data)
        except aiohttp.ClientPayloadError as exc:
            return r.status, b"".join(chunks), type(exc).__name__
        return r.status, b"".join(chunks), None


def norm(raw: bytes, rid: str, keepalive: bool = False) -> bytes:
    out = re.sub(rb"(: ping\r?\n\r?\n)+", b"<pings>", raw.replace(rid.encode(), b"RID"))
    # each response's created is its request's time (unix s): two requests may straddle a second
    out = re.sub(rb'"created":\d+', b'"created":T', out)
    if keepalive:
        # the sim attaches keep-alive blocks to every event it writes (numbered), so the usage
        # chunk the gateway asked for and removed shifts them: compare the data events only
        out = re.sub(rb"(: keep-alive|id: \d+\r?\nretry: 3000)\r?\n\r?\n", b"", out)
    return out


def assert_openai_error(raw: bytes, code: str | int) -> None:
    """``raw`` is exactly one OpenAI error object with a message and ``code``."""
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["code"] == code


def assert_no_by_isl(gw: GatewayHandle) -> None:
    """No by-ISL series was observed and no model series was created."""
    s = samples(gw.metrics)
    n = gw.metrics.names
    for name in (n.ttft_by_isl, n.itl_by_isl, n.duration_by_isl):
        assert total(s, name + "_count") == 0, name
    assert set(gw.metrics.state.models) == {"sim-model"}


async def both(sim: SimHandle, gw: GatewayHandle, endpoint: str, b: dict[str, Any], faults: str, tag: str
               ) -> tuple[tuple[int, bytes, str | None], tuple[int, bytes, str | None]]:
    """The same request directly and through the gateway, the prefix cache warmed first (so
    both report the same cached_tokens)."""
    await fetch(sim.url + path(endpoint), b, f"warm-{tag}")
    direct = await fetch(sim.url + path(endpoint), b, f"direct-{tag}", faults)
    via = await fetch(gw.url + path(endpoint), b, f"gw-{tag}", faults)
    return direct, via


TRANSPORT_MODES = ["", "multi_token", "coalesce", "split", "crlf", "keepalive", "slow_start",
                   "keepalive,crlf,split"]
CHAT_ONLY_MODES = ["role_first", "reasoning", "tool_calls"]  # delta shapes of chat chunks
WIRE_CASES = [("chat_completions", m) for m in TRANSPORT_MODES + CHAT_ONLY_MODES] + [
    ("completions", m) for m in TRANSPORT_MODES]


@pytest.mark.parametrize(("endpoint", "faults"), WIRE_CASES)
async def test_wire_cases_bytes_and_metrics(stack: tuple[SimHandle, GatewayHandle], endpoint: str, faults: str
                                            ) -> None:
    sim, gw = stack
    b = body(endpoint, n=9)
    tag = f"{endpoint}-{faults}"
    (ds, dbody, derr), (gs, gbody, gerr) = await both(sim, gw, endpoint, b, faults, tag)
    assert ds == gs == 200 and derr is None and gerr is None
    ka = "keepalive" in faults
    assert norm(gbody, f"gw-{tag}", ka) == norm(dbody, f"direct-{tag}", ka)
    if ka:
        assert gbody.count(b": keep-alive") >= 9 and gbody.count(b"retry: 3000") >= 4
    if "slow_start" in faults:
        assert b": ping" in gbody  # comments during the long prefill are relayed
    await gw.gateway.wait_finished(1)
    truth = await sim.wait_truth(f"gw-{tag}")
    s = samples(gw.metrics)
    n = gw.metrics.names
    assert value(s, n.requests, endpoint=endpoint, error_type="", model="sim-model", request_type="stream",
                 status="success") == 1
    assert inflight(gw.metrics) == 0
    bucket = BUCKETS.label(truth.isl)
    assert value(s, n.ttft_by_isl + "_count", model="sim-model", isl_bucket=bucket) == 1
    assert value(s, n.isl_assignments, model="sim-model", source="first_chunk_usage") == 1
    assert value(s, n.osl + "_sum", model="sim-model") == 9
    # ITL once per token after the first (multi_token: chunks of 1, 4, 4 tokens, split per token)
    assert value(s, n.itl + "_count", model="sim-model") == 8
    (entry,) = read_request_log(gw.gateway.config.request_log or "")
    assert entry["output_chunks"] == (3 if "multi_token" in faults else 9)
    assert entry["upstream_request_id"] == f"gw-{tag}" and entry["isl"] == truth.isl
    # TTFT is at the first output chunk (role-only chunk and pings excluded): not before the
    # engine's first token
    assert truth.ttft_ns is not None
    ttft_s = entry["ttft_s"]
    assert isinstance(ttft_s, float)
    assert ttft_s >= truth.ttft_ns / 1e9
    if "slow_start" in faults:
        assert ttft_s >= 0.5


@pytest.mark.parametrize("faults", ["", "keepalive,crlf", "multi_token,split"])
@pytest.mark.parametrize("client_usage", [{"include_usage": True},
                                          {"include_usage": True, "continuous_usage_stats": True}])
async def test_client_asked_usage_bytes_equal(stack: tuple[SimHandle, GatewayHandle], client_usage: Any,
                                              faults: str) -> None:
    sim, gw = stack
    b = body("chat_completions", stream_options=client_usage)
    for i in range(2):  # the first include_usage-only request teaches the gateway the sim's "usage": null
        (_, dbody, _), (_, gbody, _) = await both(sim, gw, "chat_completions", b, faults, f"u{i}")
        assert norm(gbody, f"gw-u{i}") == norm(dbody, f"direct-u{i}")  # exact, keep-alive blocks included
    assert b'"usage":{' in gbody
    sent_continuous = gw.gateway.measured.usage_null.get(sim.url)
    assert sent_continuous is (True if "continuous_usage_stats" not in client_usage else None)


@pytest.mark.parametrize(
    ("faults", "error_type", "status", "cut"),
    [
        ("http_429", "overload", 429, False),
        ("http_500", "backend_error", 500, False),
        ("http_503", "overload", 503, False),
        ("error_mid_stream", "backend_error", 200, False),
        ("no_done", "truncated_stream", 200, False),
        ("malformed_chunk", "backend_error", 200, False),
        ("reset_mid_stream", "truncated_stream", 200, True),
    ],
)
async def test_error_paths(stack: tuple[SimHandle, GatewayHandle], faults: str, error_type: str, status: int,
                           cut: bool) -> None:
    sim, gw = stack
    b = body("chat_completions", n=10)
    (ds, dbody, derr), (gs, gbody, gerr) = await both(sim, gw, "chat_completions", b, faults, faults)
    assert ds == gs == status
    if cut:
        assert derr is not None and gerr is not None  # the client sees the cut, as it would directly
        assert norm(dbody, f"direct-{faults}").startswith(norm(gbody, f"gw-{faults}"))
        assert gbody.count(b"data:") >= 3
    else:
        assert gerr is None and norm(gbody, f"gw-{faults}") == norm(dbody, f"direct-{faults}")
    await gw.gateway.wait_finished(1)
    assert requests_total(gw.metrics, model="sim-model", status="error", error_type=error_type) == 1
    assert requests_total(gw.metrics) == 1
    assert inflight(gw.metrics) == 0
    s = samples(gw.metrics)
    n = gw.metrics.names
    # failed before the first token: no TTFT and no by-ISL observation at all; failed after it:
    # the TTFT was observed (in its bucket too: continuous usage fixed the bucket at that chunk)
    got_tokens = 1 if status == 200 else 0
    assert value(s, n.ttft + "_count", model="sim-model") == got_tokens
    assert total(s, n.ttft_by_isl + "_count") == got_tokens
    assert total(s, n.duration_by_isl + "_count") == got_tokens


async def test_non_streaming_through_sim(stack: tuple[SimHandle, GatewayHandle]) -> None:
    sim, gw = stack
    for endpoint in ("chat_completions", "completions"):
        b = body(endpoint, stream=False)
        (ds, dbody, _), (gs, gbody, _) = await both(sim, gw, endpoint, b, "", "unary-" + endpoint)
        assert ds == gs == 200 and norm(gbody, "gw-unary-" + endpoint) == norm(dbody, "direct-unary-" + endpoint)
    await gw.gateway.wait_finished(2)
    s = samples(gw.metrics)
    n = gw.metrics.names
    assert requests_total(gw.metrics, request_type="unary", status="success") == 2
    assert value(s, n.ttft + "_count", model="sim-model") == 0 and value(s, n.itl + "_count", model="sim-model") == 0
    assert value(s, n.osl + "_sum", model="sim-model") == 16
    assert total(s, n.duration_by_isl + "_count") == 2


async def test_disconnect_stops_generation(stack: tuple[SimHandle, GatewayHandle]) -> None:
    sim, gw = stack
    b = body("chat_completions", n=3000)
    async with aiohttp.ClientSession() as s:
        resp = await s.post(gw.url + "/v1/chat/completions", json=b, headers={"x-request-id": "gone"})
        for _ in range(4):
            await resp.content.readuntil(b"\n\n")
        t_close = time.perf_counter_ns()
        resp.close()
    truth = await sim.wait_truth("gone", timeout=30)
    assert truth.outcome == "cancelled"
    # generation stopped after the client left and long before its 3,000 tokens (how soon after is a
    # figure of the machine's load, not of the definition)
    assert truth.cancel_ns is not None and truth.cancel_ns > t_close
    assert truth.tokens_at_cancel is not None and truth.tokens_at_cancel < 3000
    await gw.gateway.wait_finished(1)
    assert requests_total(gw.metrics, model="sim-model", error_type="cancelled") == 1
    assert requests_total(gw.metrics) == 1
    assert inflight(gw.metrics) == 0
    assert gw.metrics.state.disconnected_clients == 1
    # tokens were relayed before the client left: the TTFT is in the bucket of the sim's ISL
    # (known at the first chunk from continuous usage), and in no other bucket
    got = samples(gw.metrics)
    n = gw.metrics.names
    assert value(got, n.ttft_by_isl + "_count", model="sim-model", isl_bucket=BUCKETS.label(truth.isl)) == 1
    assert total(got, n.ttft_by_isl + "_count") == 1
    assert value(got, n.isl_assignments, model="sim-model", source="first_chunk_usage") == 1


async def test_disconnect_during_prefill(stack: tuple[SimHandle, GatewayHandle]) -> None:
    sim, gw = stack
    b = body("chat_completions", n=50)
    async with aiohttp.ClientSession() as s:
        resp = await s.post(gw.url + "/v1/chat/completions", json=b,
                            headers={"x-request-id": "gone-early", "x-servelens-fault": "slow_start",
                                     "x-servelens-fault-delay-ms": "3000"})
        await resp.content.readuntil(b"\n\n")  # the role chunk; the engine has not started yet
        resp.close()
    truth = await sim.wait_truth("gone-early", timeout=30)
    assert truth.outcome == "cancelled" and truth.osl == 0
    await gw.gateway.wait_finished(1)
    assert requests_total(gw.metrics, error_type="cancelled") == 1 and requests_total(gw.metrics) == 1
    assert value(samples(gw.metrics), gw.metrics.names.ttft + "_count", model="sim-model") == 0
    assert inflight(gw.metrics) == 0
    assert_no_by_isl(gw)  # no output before the client left: no bucket series observed


async def test_unknown_model_unreachable_and_timeout(tmp_path: Any) -> None:
    async with run_sim(speedup=20) as sim, run_gateway(sim.url, response_timeout_s=0.3) as gw:
        status, raw, _ = await fetch(gw.url + "/v1/chat/completions", {**body("chat_completions"), "model": "x"}, "u")
        assert status == 404
        assert_openai_error(raw, "model_not_found")
        assert requests_total(gw.metrics, model="unknown_model", error_type="not_found", status="error") == 1
        assert sim.get_truth("u") is None  # never reached the engine
        # unary + slow_start: no answer within the response timeout -> 504
        status, raw, _ = await fetch(gw.url + "/v1/chat/completions", body("chat_completions", stream=False), "t",
                                     "slow_start")
        assert status == 504
        assert_openai_error(raw, "upstream_timeout")
        assert requests_total(gw.metrics, model="sim-model", error_type="response_timeout", status="error",
                              request_type="unary") == 1
        assert requests_total(gw.metrics) == 2 and inflight(gw.metrics) == 0
        assert_no_by_isl(gw)
    async with run_sim(speedup=20) as sim:
        url = sim.url
    async with run_gateway(url, models=["sim-model"]) as gw:
        status, raw, _ = await fetch(gw.url + "/v1/chat/completions", body("chat_completions"), "d")
        assert status == 502
        assert_openai_error(raw, "upstream_unavailable")
        assert requests_total(gw.metrics, model="sim-model", error_type="unavailable", status="error") == 1
        assert requests_total(gw.metrics) == 1 and inflight(gw.metrics) == 0
        assert_no_by_isl(gw)


async def test_openai_sdk_through_gateway(stack: tuple[SimHandle, GatewayHandle]) -> None:
    import openai

    _, gw = stack
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["sim-model"]
        r = await client.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=5, extra_body={"ignore_eos": True})
        assert r.choices[0].message.content and r.usage is not None and r.usage.completion_tokens == 5
        stream = await client.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}],
                                                      max_tokens=6, stream=True, extra_body={"ignore_eos": True})
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert all(c.usage is None for c in chunks)  # usage the client did not ask for is not seen
        stream = await client.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}],
                                                      max_tokens=6, stream=True, stream_options={"include_usage": True},
                                                      extra_body={"ignore_eos": True})
        chunks = [c async for c in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
        c = await client.completions.create(model="sim-model", prompt="hello", max_tokens=4,
                                            extra_body={"ignore_eos": True})
        assert c.choices[0].text and c.usage is not None and c.usage.completion_tokens == 4
        cs = await client.completions.create(model="sim-model", prompt="hello", max_tokens=4, stream=True,
                                             extra_body={"ignore_eos": True})
        texts = [x.choices[0].text async for x in cs if x.choices]
        assert len(texts) == 4
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    finally:
        await client.close()
    await gw.gateway.wait_finished(5)
    assert requests_total(gw.metrics, model="sim-model", status="success") == 5
    assert requests_total(gw.metrics, model="unknown_model") == 1
    assert inflight(gw.metrics) == 0


async def test_concurrent_mixed_faults_inflight_balanced(stack: tuple[SimHandle, GatewayHandle]) -> None:
    _, gw = stack
    modes = ["", "http_429", "error_mid_stream", "reset_mid_stream", "no_done", "multi_token", "split", ""]
    results = await asyncio.gather(*(
        fetch(gw.url + "/v1/chat/completions", body("chat_completions", n=6), f"mix-{i}", m)
        for i, m in enumerate(modes * 3)))
    assert len(results) == 24
    await gw.gateway.wait_finished(24)
    assert requests_total(gw.metrics) == 24
    assert requests_total(gw.metrics, status="success") == 12
    assert inflight(gw.metrics) == 0


async def test_cached_tokens_absent_is_unknown_not_zero(tmp_path: Any) -> None:
    """Wire case 6: without a prefix cache the sim sends no ``prompt_tokens_details``."""
    async with run_sim(speedup=20, prefix_cache_blocks=0) as sim, run_gateway(sim.url) as gw:
        for stream in (True, False):
            b = body("chat_completions", stream=stream)
            if stream:
                b["stream_options"] = {"include_usage": True}
            status, raw, _ = await fetch(gw.url + "/v1/chat/completions", b, f"nocache-{stream}")
            assert status == 200 and b"prompt_tokens" in raw and b"prompt_tokens_details" not in raw
        await gw.gateway.wait_finished(2)
        s = samples(gw.metrics)
        n = gw.metrics.names
        assert requests_total(gw.metrics, status="success") == 2
        assert value(s, n.isl + "_count", model="sim-model") == 2
        assert value(s, n.cached + "_count", model="sim-model") == 0  # unknown, not observed as 0
        assert total(s, n.cached_by_isl + "_count") == 0
        assert total(s, n.duration_by_isl + "_count") == 2 and total(s, n.ttft_by_isl + "_count") == 1
        assert inflight(gw.metrics) == 0


REQUEST_ERRORS = [
    # (case, body or raw bytes, status, error code, model label, error_type, request_type)
    ("invalid_json", b'{"model": "sim-model", "messages": [', 400, "invalid_json", "unknown_model", "validation",
     "unary"),
    ("not_an_object", b"[1, 2]", 400, "invalid_json", "unknown_model", "validation", "unary"),
    ("missing_model", {"messages": [{"role": "user", "content": "hi"}], "stream": True}, 400, "missing_model",
     "unknown_model", "validation", "stream"),
    ("stream_not_bool", {"model": "sim-model", "prompt": "hi", "stream": "maybe"}, 400, "invalid_type",
     "unknown_model", "validation", "unary"),
    ("too_large", {"model": "sim-model", "prompt": "x" * 70_000, "stream": True}, 413, "request_too_large",
     "unknown_model", "validation", "unary"),
    ("unknown_model", {"model": "nope", "prompt": "hi", "stream": True}, 404, "model_not_found", "unknown_model",
     "not_found", "stream"),
    # the engine's own 400 (max_tokens < 1), relayed as it is: stream (usage injected) and unary
    ("upstream_400_stream", {"model": "sim-model", "prompt": "hi", "max_tokens": 0, "stream": True}, 400, 400,
     "sim-model", "validation", "stream"),
    ("upstream_400_unary", {"model": "sim-model", "prompt": "hi", "max_tokens": 0}, 400, 400, "sim-model",
     "validation", "unary"),
]


@pytest.mark.parametrize(("case", "payload", "status", "code", "model", "error_type", "request_type"),
                         REQUEST_ERRORS, ids=[c[0] for c in REQUEST_ERRORS])
async def test_request_errors_against_the_sim(case: str, payload: Any, status: int, code: str | int, model: str,
                                              error_type: str, request_type: str) -> None:
    """Bad input and the engine's 400: an OpenAI error object (the engine's bytes when it answered),
    counted once with its error_type, inflight back to 0, no by-ISL series, no new model series."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    async with run_sim(speedup=20) as sim, run_gateway(sim.url, max_body_bytes=65536) as gw, \
            aiohttp.ClientSession() as s:
        async with s.post(sim.url + "/v1/completions", data=data, headers={**headers, "x-request-id": "d"}) as r:
            direct = await r.read()
        async with s.post(gw.url + "/v1/completions", data=data, headers={**headers, "x-request-id": "g"}) as r:
            got_status, got = r.status, await r.read()
        assert got_status == status
        assert_openai_error(got, code)
        if case.startswith("upstream_"):
            assert got == direct  # relayed unchanged
            assert (await sim.wait_truth("g")).outcome == "invalid"
        else:
            assert sim.get_truth("g") is None  # answered by the gateway: the engine never saw it
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model=model, endpoint="completions", status="error", error_type=error_type,
                              request_type=request_type) == 1
        assert requests_total(gw.metrics) == 1
        assert inflight(gw.metrics) == 0
        assert_no_by_isl(gw)


@pytest.mark.parametrize("where", ["unary", "stream_first_read", "stream_later_read"])
async def test_internal_error_against_the_sim(stack: tuple[SimHandle, GatewayHandle], monkeypatch: pytest.MonkeyPatch,
                                              where: str) -> None:
    """A bug of ours: unary -> 500 error object; stream -> the stream is cut (never a second response
    written into it), the upstream request closed (the engine stops), counted once as ``internal``."""
    sim, gw = stack
    calls: list[int] = []

    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug in the gateway")

    if where == "unary":
        monkeypatch.setattr(measured, "parse_response", broken)
    else:
        # the per-event measurement, on the first event or a later one (sent first, measured after)
        real_measure = meter.StreamMeter._measure
        fail_at = 1 if where == "stream_first_read" else 3

        def measure(self: meter.StreamMeter, t_ns: int, blk: Any) -> None:
            calls.append(1)
            if len(calls) == fail_at:
                raise RuntimeError("a bug in the gateway")
            real_measure(self, t_ns, blk)

        monkeypatch.setattr(meter.StreamMeter, "_measure", measure)
    b = body("chat_completions", n=500, stream=where != "unary")
    status, raw, err = await fetch(gw.url + "/v1/chat/completions", b, "bug")
    await gw.gateway.wait_finished(1)
    assert requests_total(gw.metrics, model="sim-model", status="error", error_type="internal") == 1
    assert requests_total(gw.metrics) == 1
    assert inflight(gw.metrics) == 0
    s = samples(gw.metrics)
    n = gw.metrics.names
    if where == "unary":
        assert status == 500 and err is None
        assert_openai_error(raw, "internal")
        assert total(s, n.ttft_by_isl + "_count") == 0
        return
    assert status == 200 and err is not None  # cut, as an upstream cut would be
    assert b"HTTP/1.1" not in raw and raw.count(b"data:") < 500
    truth = await sim.wait_truth("bug")
    assert truth.outcome == "cancelled" and truth.tokens_at_cancel is not None and truth.tokens_at_cancel < 500
    # the bucket is known at the first chunk (continuous usage): by-ISL TTFT iff a TTFT was observed
    assert total(s, n.ttft_by_isl + "_count") == value(s, n.ttft + "_count", model="sim-model")


async def test_final_usage_sets_the_bucket_at_the_end(tmp_path: Any) -> None:
    """No continuous usage (``--continuous-usage off``): the gateway adds ``include_usage`` only and
    cuts the usage chunk out again; the ISL comes from the final usage chunk, and the TTFT measured
    at the first output chunk is then observed into that bucket (source ``final_usage``)."""
    log = tmp_path / "req.jsonl"
    async with run_sim(speedup=20) as sim, run_gateway(sim.url, continuous_usage="off", request_log=str(log)) as gw:
        b = body("chat_completions", n=9)
        (ds, dbody, _), (gs, gbody, _) = await both(sim, gw, "chat_completions", b, "multi_token", "final")
        assert ds == gs == 200 and norm(gbody, "gw-final") == norm(dbody, "direct-final")
        assert b"usage" not in gbody
        await gw.gateway.wait_finished(1)
        truth = await sim.wait_truth("gw-final")
        s = samples(gw.metrics)
        n = gw.metrics.names
        assert requests_total(gw.metrics, model="sim-model", status="success", request_type="stream") == 1
        assert inflight(gw.metrics) == 0
        assert value(s, n.isl_assignments, model="sim-model", source="final_usage") == 1
        assert value(s, n.ttft_by_isl + "_count", model="sim-model", isl_bucket=BUCKETS.label(truth.isl)) == 1
        assert total(s, n.ttft_by_isl + "_count") == 1
        assert value(s, n.osl + "_sum", model="sim-model") == 9  # the last cumulative value, not a sum
        # no usage per chunk: one chunk counts as one token (3 chunks of 1, 4, 4 tokens -> 2 ITL values)
        assert value(s, n.itl + "_count", model="sim-model") == 2
    (entry,) = read_request_log(log)
    assert entry["isl_source"] == "final_usage" and entry["isl"] == truth.isl and entry["osl_source"] == "usage"


def by_isl_counts(gw: GatewayHandle) -> dict[str, dict[str, float]]:
    """For each by-ISL histogram (TTFT, ITL, duration, cached): its ``_count`` per touched bucket."""
    s = samples(gw.metrics)
    n = gw.metrics.names
    out: dict[str, dict[str, float]] = {}
    for name in (n.ttft_by_isl, n.itl_by_isl, n.duration_by_isl, n.cached_by_isl):
        out[name] = {dict(lab)["isl_bucket"]: v for (sn, lab), v in s.items() if sn == name + "_count" and v}
    return out


async def test_mid_stream_silence_from_the_sim_is_response_timeout_and_cut() -> None:
    """``stall_mid_stream``: the engine's stream goes silent after half the tokens for longer than the
    gateway's read timeout. The client gets the first half, byte for byte, then the cut (no clean
    end); counted once as ``response_timeout``; the upstream request is closed, so the sim's truth
    shows the request ended (cancelled) long before the stall would have been over."""
    async with run_sim(speedup=20) as sim, run_gateway(sim.url, read_timeout_s=0.5) as gw:
        b = body("chat_completions", n=40)
        await fetch(sim.url + path("chat_completions"), b, "warm-stall")
        # the same bytes directly, with no silence (the delay does not change them)
        ds, dbody, derr = await fetch(sim.url + path("chat_completions"), b, "direct-stall", "stall_mid_stream",
                                      **{"x-servelens-fault-delay-ms": "0"})
        assert ds == 200 and derr is None and dbody.endswith(b"data: [DONE]\n\n")
        before = inflight(gw.metrics)
        gs, gbody, gerr = await fetch(gw.url + path("chat_completions"), b, "gw-stall", "stall_mid_stream",
                                      **{"x-servelens-fault-delay-ms": "60000"})
        assert gs == 200 and gerr is not None  # the cut is passed on: no final chunk
        assert norm(dbody, "direct-stall").startswith(norm(gbody, "gw-stall"))
        assert gbody.count(b'"content":" ') == 20 and gbody.endswith(b"\n\n")  # the half before the silence
        truth = await sim.wait_truth("gw-stall")  # within 5 s: not at the end of the 60 s stall
        assert truth.outcome == "cancelled" and 20 <= truth.osl <= 40
        assert truth.end_ns - truth.arrival_ns < 10_000_000_000
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model="sim-model", endpoint="chat_completions", request_type="stream",
                              status="error", error_type="response_timeout") == 1
        assert requests_total(gw.metrics) == 1
        assert inflight(gw.metrics) == before == 0
        # 20 tokens came before the silence, each with continuous usage: the bucket is the truth's,
        # fixed at the first chunk, and no other bucket is touched (TTFT, 19 ITLs, the duration up to
        # the cut, the cached tokens the usage reported)
        bucket = BUCKETS.label(truth.isl)
        s = samples(gw.metrics)
        n = gw.metrics.names
        touched = by_isl_counts(gw)
        assert touched == {n.ttft_by_isl: {bucket: 1}, n.itl_by_isl: {bucket: 19}, n.duration_by_isl: {bucket: 1},
                           n.cached_by_isl: {bucket: 1}}
        assert value(s, n.isl_assignments, model="sim-model", source="first_chunk_usage") == 1


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
async def test_no_headers_from_the_sim_in_time_is_504(stream: bool) -> None:
    """``slow_headers``: no response headers within the gateway's response timeout -> 504 OpenAI error
    ``upstream_timeout``, counted once as ``response_timeout``; the upstream request is closed before
    the engine started it (truth: cancelled, no token)."""
    async with run_sim(speedup=20) as sim, run_gateway(sim.url, response_timeout_s=0.3) as gw:
        before = inflight(gw.metrics)
        status, raw, err = await fetch(gw.url + path("chat_completions"), body("chat_completions", stream=stream),
                                       "late", "slow_headers", **{"x-servelens-fault-delay-ms": "60000"})
        assert status == 504 and err is None
        assert_openai_error(raw, "upstream_timeout")
        truth = await sim.wait_truth("late")  # within 5 s: the gateway closed it, not the 60 s delay
        assert (truth.outcome, truth.osl, truth.admitted_ns) == ("cancelled", 0, None)
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model="sim-model", endpoint="chat_completions", status="error",
                              error_type="response_timeout", request_type="stream" if stream else "unary") == 1
        assert requests_total(gw.metrics) == 1
        assert inflight(gw.metrics) == before == 0
        assert_no_by_isl(gw)
        assert total(samples(gw.metrics), gw.metrics.names.isl + "_count") == 0


async def test_prompt_tokens_details_null_from_the_sim_is_unknown_not_zero() -> None:
    """Wire case 6, null half (``null_details``): the engine served cached tokens (its truth says
    so), the wire says ``"prompt_tokens_details": null``: cached tokens unknown, never observed as 0.
    Stream with usage injected and stripped, stream with the client's own usage, and unary."""
    async with run_sim(speedup=20) as sim, run_gateway(sim.url) as gw:
        cases = [("inj", body("chat_completions")),
                 ("own", body("chat_completions", stream_options={"include_usage": True})),
                 ("unary", body("chat_completions", stream=False))]
        for tag, b in cases:
            (ds, dbody, _), (gs, gbody, gerr) = await both(sim, gw, "chat_completions", b, "null_details", tag)
            assert ds == gs == 200 and gerr is None
            assert norm(gbody, f"gw-{tag}") == norm(dbody, f"direct-{tag}")
            assert (b'"prompt_tokens_details":null' in gbody) == (tag != "inj")
            truth = await sim.wait_truth(f"gw-{tag}")
            assert truth.cached_tokens > 0  # the prefix cache did serve some: the wire does not say
        await gw.gateway.wait_finished(3)
        s = samples(gw.metrics)
        n = gw.metrics.names
        bucket = BUCKETS.label(truth.isl)
        assert requests_total(gw.metrics, model="sim-model", status="success") == 3
        assert requests_total(gw.metrics) == 3
        assert inflight(gw.metrics) == 0
        assert value(s, n.isl + "_count", model="sim-model") == 3
        assert value(s, n.cached + "_count", model="sim-model") == 0  # unknown, not observed as 0
        touched = by_isl_counts(gw)
        assert touched[n.cached_by_isl] == {}
        assert touched[n.ttft_by_isl] == {bucket: 2} and touched[n.duration_by_isl] == {bucket: 3}


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_client_gone_while_sending_body_to_the_sim(stack: tuple[SimHandle, GatewayHandle], framing: str
                                                         ) -> None:
    """A client that leaves while still sending its request body (another request in flight):
    counted once as ``cancelled`` (model unknown: the body never arrived), inflight back to its
    previous value, nothing sent to the engine, no by-ISL series."""
    sim, gw = stack
    async with aiohttp.ClientSession() as s:
        # a request in flight meanwhile (in a long prefill: no output, so no by-ISL series either)
        held = await s.post(gw.url + path("chat_completions"), json=body("chat_completions"),
                            headers={"x-request-id": "held", "x-servelens-fault": "slow_start",
                                     "x-servelens-fault-delay-ms": "60000"})
        await held.content.readuntil(b"\n\n")  # the role chunk: it is in flight
        before = inflight(gw.metrics)
        assert before == 1
        _, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"x-request-id: partial\r\n")
        part = b'{"model": "sim-model", "messages": [{"role": "user", "content": "hel'
        if framing == "chunked":
            writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%b\r\n" % (len(part), part))
        else:
            writer.write(head + b"Content-Length: 1000\r\n\r\n" + part)
        await writer.drain()
        writer.close()  # gone before the body is complete
        await writer.wait_closed()
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, model="unknown_model", status="error", error_type="cancelled") == 1
        assert requests_total(gw.metrics) == 1
        assert inflight(gw.metrics) == before
        assert gw.metrics.state.disconnected_clients == 1
        assert sim.get_truth("partial") is None and len(sim.engine.running) + len(sim.engine.waiting) == 0
        held.close()
    await gw.gateway.wait_finished(2)
    assert requests_total(gw.metrics, model="sim-model", error_type="cancelled") == 1
    assert inflight(gw.metrics) == 0
    assert_no_by_isl(gw)
    assert (await sim.wait_truth("held")).outcome == "cancelled"
    assert sim.get_truth("partial") is None


@pytest.mark.parametrize("faults", ["", "multi_token", "coalesce"])
async def test_request_log_chunks_against_the_truth(tmp_path: Any, faults: str) -> None:
    """--request-log-chunks: every output chunk's read time and tokens, consistent with the metrics and
    with the engine's truth (each chunk read after the engine emitted its last token; coalesced chunks
    are read together and share one time)."""
    log = tmp_path / "req.jsonl"
    async with run_sim(speedup=20) as sim, run_gateway(sim.url, request_log=str(log), request_log_chunks=True) as gw:
        status, _, err = await fetch(gw.url + path("chat_completions"), body("chat_completions", n=9), "chunks", faults)
        assert status == 200 and err is None
        await gw.gateway.wait_finished(1)
        truth = await sim.wait_truth("chunks")
    (entry,) = read_request_log(log)
    offsets, tokens = entry["chunk_offsets_ns"], entry["chunk_tokens"]
    assert isinstance(offsets, list) and isinstance(tokens, list)
    assert len(offsets) == len(tokens) == entry["output_chunks"] and sum(tokens) == entry["osl"] == truth.osl == 9
    assert offsets == sorted(offsets) and entry["arrival_ns"] + offsets[0] == entry["first_output_ns"]  # type: ignore[operator]
    last_token = 0
    for off, k in zip(offsets, tokens, strict=True):
        last_token += k
        assert entry["arrival_ns"] + off >= truth.token_times_ns[last_token - 1]  # type: ignore[operator]
    if faults == "multi_token":
        assert tokens == [1, 4, 4]
    if faults == "coalesce":  # two events per write: pairs read together
        assert len(set(offsets)) < len(offsets)


@pytest.mark.parametrize("endpoint", ["chat_completions", "completions"])
async def test_n_2_end_to_end_on_the_sim(stack: tuple[SimHandle, GatewayHandle], endpoint: str) -> None:
    """n=2 through the gateway to the embedded engine: both choices relayed whole; one request
    counted; OSL the sum over the choices (the final usage), TTFT and ITL the first choice's, as
    the sim's truth has them."""
    sim, gw = stack
    b = {**body(endpoint, n=40, ignore_eos=False), "n": 2}  # natural EOS: the choices end apart
    status, raw, err = await fetch(gw.url + path(endpoint), b, "gw-n2")
    assert status == 200 and err is None
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    finished = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]}
    assert sorted(finished) == [0, 1]
    await gw.gateway.wait_finished(1)
    truth = await sim.wait_truth("gw-n2")
    assert truth.choices == 2 and truth.outcome == "ok"
    s = samples(gw.metrics)
    n = gw.metrics.names
    assert requests_total(gw.metrics) == 1
    assert value(s, n.requests, endpoint=endpoint, error_type="", model="sim-model", request_type="stream",
                 status="success") == 1
    assert value(s, n.osl + "_sum", model="sim-model") == truth.osl
    assert truth.osl > len(truth.token_times_ns)  # the sum over both choices, not the first's alone
    assert value(s, n.ttft + "_count", model="sim-model") == 1
    assert value(s, n.ttft_by_isl + "_count", model="sim-model", isl_bucket=BUCKETS.label(truth.isl)) == 1
    assert value(s, n.itl + "_count", model="sim-model") == len(truth.token_times_ns) - 1  # the first choice's
    (entry,) = read_request_log(gw.gateway.config.request_log or "")
    assert entry["isl"] == truth.isl and entry["osl"] == truth.osl
    ttft_s = entry["ttft_s"]
    assert isinstance(ttft_s, float) and truth.ttft_ns is not None and ttft_s >= truth.ttft_ns / 1e9
