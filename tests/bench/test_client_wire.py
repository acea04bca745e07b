"""The bench client on exact wire cases (a scripted upstream writing known bytes): tokens per chunk
and outcomes are read as the gateway reads them (servelens.core.stream)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from servelens.bench.client import RequestSpec, send_request
from servelens.formats.results import BenchRecord
from servelens.gateway.testing import raw_tcp_server, read_http_request, run_scripted_upstream


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(text: str, ct: int | None, index: int = 0, reason: str | None = None) -> bytes:
    body: dict[str, object] = {"choices": [{"index": index, "delta": {"content": text}, "finish_reason": reason}]}
    if ct is not None:
        body["usage"] = {"prompt_tokens": 5, "completion_tokens": ct, "total_tokens": 5 + ct}
    return ev(body)


DONE = b"data: [DONE]\n\n"


async def run(stream: list[bytes]) -> BenchRecord:
    async with run_scripted_upstream(raw_stream=stream) as up, aiohttp.ClientSession() as session:
        spec = RequestSpec(0, 0, 5, 4, b'{"model": "fake-model", "stream": true, "max_tokens": 4}')
        return await send_request(session, f"{up.url}/v1/chat/completions", spec)


async def test_a_chunk_whose_count_did_not_move_carries_no_token() -> None:
    rec = await run([chunk("a", 1), chunk("b", 1), chunk("c", 2), chunk("d", 3, reason="stop"), DONE])
    assert rec.ok and rec.tokens_from_usage
    assert rec.chunk_tokens == (1, 1, 1) and len(rec.itl_values_s()) == 2 and rec.osl == 3


async def test_a_token_in_an_empty_text_chunk_is_counted() -> None:
    rec = await run([chunk("a", 1), chunk("", 2), chunk("c", 3), chunk("d", 4, reason="stop"), DONE])
    assert rec.ok and rec.chunk_tokens == (1, 1, 1, 1) and len(rec.itl_values_s()) == 3 and rec.osl == 4


async def test_several_choices_take_the_first_choices_own_counts() -> None:
    stream = [chunk(f"t{s}t{s}", 2 * (s + 1), i, "length" if s == 3 else None) for s in range(4) for i in (0, 1)]
    final = ev({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}})
    rec = await run([*stream, final, DONE])
    assert rec.ok and rec.osl == 16
    assert rec.chunk_tokens == (2, 2, 2, 2) and len(rec.itl_values_s()) == 6


@pytest.mark.parametrize(
    ("stream", "error_type"),
    [
        ([DONE], "backend_error"),
        ([ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}), DONE], "backend_error"),
        ([b'event: error\ndata: {"message": "boom"}\n\n', DONE], "backend_error"),
        ([chunk("a", None), b'event: error\ndata: {"message": "boom"}\n\n', DONE], "backend_error"),
        ([ev({"object": "error", "message": "boom", "type": "BadRequestError", "param": None, "code": 400}), DONE],
         "backend_error"),
        ([chunk("a", None)], "truncated_stream"),
    ],
    ids=["done-alone", "role-only", "sse-event-error", "output-then-sse-event-error", "vllm-object-error",
         "truncated"],
)
async def test_streams_that_produced_nothing_or_said_they_failed_are_errors(
    stream: list[bytes], error_type: str
) -> None:
    rec = await run(stream)
    assert rec.status == "error" and rec.error_type == error_type
    if "boom" in b"".join(stream).decode():
        assert "boom" in rec.error


@pytest.mark.parametrize(
    ("framing", "error"),
    [
        ("chunked", "connection closed mid-stream: the response ended before its last chunk (chunked encoding)"),
        ("length", "connection closed mid-stream: the response ended before its Content-Length (received "
                   f"{len(chunk('a', None))} of {2 * len(chunk('a', None))} bytes)"),
    ],
)
async def test_a_body_cut_short_is_said_in_words_without_aiohttps_code(framing: str, error: str) -> None:
    """A gateway worker killed mid-stream: the text was aiohttp's "<TransferEncodingError: 400, message=...>"
    beside http_status 200, and the 400 (aiohttp's parser code) reads as an HTTP status."""
    one = chunk("a", None)

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_http_request(r)
        if framing == "chunked":  # one whole chunk, then part of the next, then the connection closes
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + b"%x\r\n%s\r\n" % (len(one), one) + b"%x\r\n%s" % (len(one), one[:5]))
        else:  # half of the body its Content-Length promises
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                    % (2 * len(one), one))
        await w.drain()

    async with raw_tcp_server(handler) as (port, _), aiohttp.ClientSession() as session:
        spec = RequestSpec(0, 0, 5, 4, b'{"model": "fake-model", "stream": true, "max_tokens": 4}')
        rec = await send_request(session, f"http://127.0.0.1:{port}/v1/chat/completions", spec)
    assert (rec.status, rec.error_type, rec.http_status, rec.error) == ("error", "truncated_stream", 200, error)
    assert rec.chunk_tokens == (1,)  # the whole chunk before the cut was read
