"""The bench client on the wire cases an adversarial tester found (a scripted upstream writing known
bytes), read as the gateway reads them: absurd usage numbers, a stream cut mid-event."""

from __future__ import annotations

import json

import aiohttp
import pytest

from servelens.bench.client import RequestSpec, send_request
from servelens.formats.results import BenchRecord
from servelens.gateway.testing import run_scripted_upstream


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def tok(text: str, reason: str | None = None) -> bytes:
    return ev({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": reason}]})


DONE = b"data: [DONE]\n\n"


async def run(stream: list[bytes]) -> BenchRecord:
    async with run_scripted_upstream(raw_stream=stream) as up, aiohttp.ClientSession() as session:
        spec = RequestSpec(0, 0, 5, 4, b'{"model": "fake-model", "stream": true, "max_tokens": 4}')
        return await send_request(session, f"{up.url}/v1/chat/completions", spec)


async def test_absurd_usage_is_unknown_osl_from_chunks() -> None:
    final = ev({"choices": [], "usage": {"prompt_tokens": 10**15, "completion_tokens": 10**18,
                                         "total_tokens": 10**15 + 10**18}})
    rec = await run([tok("a"), tok("b"), tok("c", "stop"), final, DONE])
    assert rec.ok and rec.osl == 3 and rec.isl_server is None and not rec.tokens_from_usage


@pytest.mark.parametrize(("last", "error_type"), [
    (b'data: {"choi', "truncated_stream"),  # the body ends inside an event
    (b"data: [DONE]", ""),  # a whole last line without its blank line: read, as the gateway reads it
    (b'data: {"error": {"message": "boom"}}', "backend_error"),
])
async def test_body_ending_inside_an_event_is_truncated(last: bytes, error_type: str) -> None:
    rec = await run([tok("a"), last])
    assert rec.error_type == error_type and rec.ok == (not error_type) and rec.osl == 1
