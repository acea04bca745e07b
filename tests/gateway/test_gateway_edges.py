"""The gateway on the edges an adversarial tester found (a scripted upstream writing known bytes):
absurd usage numbers, lax ``stream`` values, streams cut mid-event, methods on the gateway's own paths.
Exact counts and bytes, never timing."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from servelens.gateway.testing import (
    FAKE_MODEL,
    ScriptedUpstream,
    inflight,
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
        assert gw.metrics.state.models[FAKE_MODEL].isl_sources["unknown"] == 1
        assert inflight(gw.metrics) == 0
