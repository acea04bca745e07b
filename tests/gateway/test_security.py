"""What the gateway never writes down (keys, prompts, completions) and how it answers oversized or
malformed request heads (an OpenAI error object, one log line quoting none of the request)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import aiohttp
import pytest

from servelens.gateway.connections import MAX_FIELD_BYTES, MAX_HEADERS, MAX_REQUEST_LINE_BYTES
from servelens.gateway.server import startup_summary
from servelens.gateway.testing import FAKE_MODEL, run_gateway, run_scripted_upstream

CLIENT_KEY = "sk-client-0123456789abcdef"
HEADER_KEY = "sk-header-fedcba9876543210"
QUERY_KEY = "sk-query-55555555"
UPSTREAM_KEY = "sk-upstream-77777777"
PROMPT = "purple-elephant-prompt-text"
COMPLETION = "zebra-completion-text"


def stream(text: str) -> list[bytes]:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}}
    return [b"data: " + json.dumps(chunk).encode() + b"\n\n", b"data: [DONE]\n\n"]


async def test_keys_prompts_and_completions_are_never_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    log_path = tmp_path / "requests.jsonl"
    secrets = (CLIENT_KEY, HEADER_KEY, QUERY_KEY, UPSTREAM_KEY)
    headers = {"Authorization": f"Bearer {CLIENT_KEY}", "api-key": HEADER_KEY, "x-api-key": HEADER_KEY}
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": True}
    async with run_scripted_upstream(raw_stream=stream(COMPLETION)) as up:
        upstream_url = up.url.replace("http://", f"http://svc:{UPSTREAM_KEY}@")
        async with run_gateway(upstream_url, request_log=str(log_path), models_refresh_s=0) as gw, \
                aiohttp.ClientSession() as http:
            said = [startup_summary_of(gw)]
            for query in ("", f"?api-key={QUERY_KEY}"):
                async with http.post(f"{gw.url}/v1/chat/completions{query}", json=body, headers=headers) as r:
                    assert r.status == 200 and COMPLETION.encode() in await r.read()
                async with http.post(f"{gw.url}/v1/chat/completions{query}", json={**body, "stream": False},
                                     headers=headers) as r:
                    assert r.status == 200
            async with http.post(f"{gw.url}/v1/chat/completions", json={**body, "model": "nope"},
                                 headers=headers) as r:
                assert r.status == 404
            await up.stop()  # the engine goes away: every failure path logs and answers
            for stream_flag in (True, False):
                async with http.post(f"{gw.url}/v1/chat/completions?api-key={QUERY_KEY}",
                                     json={**body, "stream": stream_flag}, headers=headers) as r:
                    assert r.status == 502
                    said.append(await r.text())
            async with http.get(f"{gw.url}/ready") as r:
                said.append(await r.text())
            await gw.gateway.router.poll(gw.gateway.session)  # a failed poll is logged with its URL
            await gw.gateway.wait_finished(7)
    logged = "\n".join([*(rec.getMessage() for rec in caplog.records),
                        *(caplog.text.splitlines()), *said])
    written = log_path.read_text()
    assert len(written.splitlines()) == 6  # (the unknown model is counted, not logged: no model)
    for secret in secrets:
        assert secret not in logged, secret
        assert secret not in written, secret
    for text in (PROMPT, COMPLETION):  # the request log holds figures, not content
        assert text not in written and text not in logged


def startup_summary_of(gw: object) -> str:
    from servelens.gateway.server import RunningGateway

    gateway = gw.gateway  # type: ignore[attr-defined]
    return startup_summary(RunningGateway(gateway, None, "127.0.0.1", gw.port))  # type: ignore[arg-type, attr-defined]


async def raw(port: int, request: bytes) -> tuple[int, dict[str, object], bytes]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        w.write(request)
        await w.drain()
        data = await r.read()  # the gateway closes the connection after the error
    finally:
        w.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(body), head


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + CLIENT_KEY.encode()
         + b"x" * (MAX_FIELD_BYTES + 1) + b"\r\n\r\n", 431, "header_too_large"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, CLIENT_KEY.encode())
                                                            for i in range(MAX_HEADERS + 1)) + b"\r\n",
         431, "too_many_headers"),
        (b"GET /v1/models?api-key=" + QUERY_KEY.encode() + b"a" * MAX_REQUEST_LINE_BYTES + b" HTTP/1.1\r\n"
         b"Host: x\r\n\r\n", 414, "uri_too_long"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header" + CLIENT_KEY.encode() + b"\r\n\r\n", 400, "bad_request"),
    ],
    ids=["header-too-long", "too-many-headers", "request-line-too-long", "malformed-header"],
)
async def test_oversized_or_malformed_request_heads_get_an_openai_error(
    request_bytes: bytes, status: int, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with run_scripted_upstream() as up, run_gateway(up.url) as gw:
        got, body, head = await raw(gw.port, request_bytes)
        assert got == status
        err = body["error"]
        assert isinstance(err, dict) and err["code"] == code and err["type"] == "invalid_request_error"
        assert b"application/json" in head
        # the gateway still serves
        async with aiohttp.ClientSession() as http, http.get(gw.url + "/health") as r:
            assert r.status == 200
    lines = [rec for rec in caplog.records if rec.name == "aiohttp.server"]
    assert len(lines) == 1 and lines[0].exc_info is None  # one line, no traceback
    assert CLIENT_KEY not in caplog.text and QUERY_KEY not in caplog.text
