"""The gateway's measured path against raw upstreams that misbehave at the HTTP level."""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

import aiohttp
import pytest

from servelens.gateway.testing import (
    GatewayHandle,
    RawHandler,
    http_chunk,
    inflight,
    raw_tcp_server,
    read_http_request,
    requests_total,
    run_gateway,
    samples,
    total,
)


@asynccontextmanager
async def raw_upstream(handler: RawHandler) -> AsyncIterator[str]:
    """:func:`raw_tcp_server` as an upstream base URL."""
    async with raw_tcp_server(handler) as (port, _):
        yield f"http://127.0.0.1:{port}"


async def read_request(r: asyncio.StreamReader) -> bytes:
    return (await read_http_request(r))[1]


BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                   "stream": True}).encode()


async def raw_post(port: int, head_extra: bytes = b"", version: bytes = b"1.1") -> tuple[asyncio.StreamReader,
                                                                                        asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"POST /v1/chat/completions HTTP/" + version + b"\r\nHost: x\r\nContent-Type: application/json\r\n"
            + head_extra + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
    await w.drain()
    return r, w


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENTS = [b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n',
          b'data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"length"}]}\n\n',
          b"data: [DONE]\n\n"]



async def test_client_leaving_while_a_rejected_injection_is_read_closes_the_upstream_connection() -> None:
    sent_part = asyncio.Event()
    upstream_saw_close = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        # a 400 naming stream_options (the gateway may resend without it), its body sent in part only
        w.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                b'{"error": {"message": "stream_options')
        await w.drain()
        sent_part.set()
        if not await r.read(1):
            upstream_saw_close.set()

    async with raw_upstream(handler) as url, run_gateway(url, models=["m"]) as gw:
        _, w = await raw_post(gw.port)
        async with asyncio.timeout(5):
            await sent_part.wait()
        w.close()
        async with asyncio.timeout(5):
            await upstream_saw_close.wait()
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, error_type="cancelled") == 1 and inflight(gw.metrics) == 0


async def test_second_response_on_the_connection_is_not_relayed() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            w.write(SSE_HEAD + b"".join(http_chunk(e) for e in EVENTS) + b"0\r\n\r\n"
                    b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nSMUGGLED!")
            await w.drain()

    async with raw_upstream(handler) as url, run_gateway(url, models=["m"], inject_usage=False) as gw:
        for _ in range(2):
            r, w = await raw_post(gw.port, b"Connection: close\r\n")
            async with asyncio.timeout(5):
                got = await r.read()
            w.close()
            assert got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") and b"SMUGGLED" not in got
        await gw.gateway.wait_finished(2)
        assert requests_total(gw.metrics, status="success") == 2


def two_reads(first: bytes, second: bytes) -> RawHandler:
    """An upstream that answers one request with ``first``, then ``second`` in a later read."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(first)
        await w.drain()
        await asyncio.sleep(0.05)  # a second read (not a test wait)
        w.write(second)
        await w.drain()
        await r.read()
    return handler


@asynccontextmanager
async def relayed_once(handler: RawHandler) -> AsyncIterator[tuple[bytes, GatewayHandle]]:
    """One stream request through a gateway (no usage injection) in front of ``handler``: what the
    client got, and the gateway once it counted the request."""
    async with raw_upstream(handler) as url, run_gateway(url, models=["m"], inject_usage=False) as gw:
        r, w = await raw_post(gw.port, b"Connection: close\r\n")
        async with asyncio.timeout(5):
            got = await r.read()
        w.close()
        await gw.gateway.wait_finished(1)
        yield got, gw


@pytest.mark.parametrize("tail", [b"GARBAGE\r\n", b"x"])
@pytest.mark.parametrize("close", [False, True])
async def test_garbage_after_the_final_chunk_leaves_the_response_whole(tail: bytes, close: bool) -> None:
    # the end of the stream and the stray bytes come in one read: the parser fails on the bytes after
    # the response, and what it parsed before them (the last events, [DONE]) was dropped, counted
    # truncated_stream
    head = SSE_HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") if close else SSE_HEAD
    rest = http_chunk(EVENTS[1]) + http_chunk(EVENTS[2]) + b"0\r\n\r\n" + tail
    async with relayed_once(two_reads(head + http_chunk(EVENTS[0]), rest)) as (got, gw):
        assert got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") and got.count(b"data:") == 3
        assert requests_total(gw.metrics, status="success") == 1 and inflight(gw.metrics) == 0


async def test_events_before_broken_chunk_framing_are_relayed_then_the_stream_is_truncated() -> None:
    broken = http_chunk(EVENTS[1]) + b"zz\r\nnot a chunk\r\n"
    async with relayed_once(two_reads(SSE_HEAD + http_chunk(EVENTS[0]), broken)) as (got, gw):
        assert got.count(b"data:") == 2 and not got.endswith(b"0\r\n\r\n")  # cut: no final chunk
        assert requests_total(gw.metrics, error_type="truncated_stream") == 1 and inflight(gw.metrics) == 0


async def test_http10_client_asking_keep_alive_gets_the_stream_ended_by_close() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(SSE_HEAD + b"".join(http_chunk(e) for e in EVENTS) + b"0\r\n\r\n")
        await w.drain()
        await r.read()

    async with raw_upstream(handler) as url, run_gateway(url, models=["m"], inject_usage=False) as gw:
        r, w = await raw_post(gw.port, b"Connection: keep-alive\r\n", version=b"1.0")
        async with asyncio.timeout(5):
            got = await r.read()  # EOF: an HTTP/1.0 body without length ends with the connection
        w.close()
        head, _, body = got.partition(b"\r\n\r\n")
        assert b"Transfer-Encoding" not in head and body == b"".join(EVENTS)
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, status="success") == 1


async def test_many_events_in_one_read_are_relayed_and_counted() -> None:
    n = 300
    events = [b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'] * (n - 1)
    events.append(b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"length"}]}\n\n')

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(SSE_HEAD + b"".join(http_chunk(e) for e in events) + http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await w.drain()
        await r.read()

    async with raw_upstream(handler) as url, run_gateway(url, models=["m"], inject_usage=False) as gw:
        r, w = await raw_post(gw.port, b"Connection: close\r\n")
        async with asyncio.timeout(5):
            got = await r.read()
        w.close()
        body = got.partition(b"\r\n\r\n")[2]
        # de-chunk what the gateway sent
        out = b""
        while body:
            size, _, rest = body.partition(b"\r\n")
            k = int(size, 16)
            out, body = out + rest[:k], rest[k + 2:]
        assert out == b"".join(events) + b"data: [DONE]\n\n"
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, status="success") == 1
        assert total(samples(gw.metrics), "servelens_output_sequence_tokens_sum") == n


async def test_hop_by_hop_response_headers_are_not_relayed() -> None:
    # hop-by-hop headers (and those the upstream's Connection names) describe the upstream's own
    # connection: the client gets the end-to-end ones only, on the measured routes, stream and unary
    unary = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"stop"}]}'
    hop = (b"Connection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\nProxy-Authenticate: Basic\r\n"
           b"Upgrade: h2c\r\nX-Kept: 1\r\n")

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            body = json.loads(await read_request(r))
            if body.get("stream"):
                w.write(SSE_HEAD.replace(b"\r\n\r\n", b"\r\n" + hop + b"\r\n", 1)
                        + b"".join(http_chunk(e) for e in EVENTS) + b"0\r\n\r\n")
            else:
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + hop
                        + b"Content-Length: %d\r\n\r\n" % len(unary) + unary)
            await w.drain()

    async with raw_upstream(handler) as url, run_gateway(url, models=["m"], inject_usage=False) as gw:
        for stream in (True, False):
            body = BODY if stream else BODY.replace(b'"stream": true', b'"stream": false')
            r, w = await asyncio.open_connection("127.0.0.1", gw.port)
            w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            async with asyncio.timeout(5):
                got = await r.read()
            w.close()
            head, _, rest = got.partition(b"\r\n\r\n")
            names = {line.split(b":")[0].strip().lower() for line in head.split(b"\r\n")[1:]}
            assert head.startswith(b"HTTP/1.1 200 ") and b"x-kept" in names
            assert not names & {b"keep-alive", b"x-hop", b"proxy-authenticate", b"upgrade"}, names
            assert (b"data: [DONE]" in rest) if stream else rest == unary
        await gw.gateway.wait_finished(2)
        assert requests_total(gw.metrics, status="success") == 2 and inflight(gw.metrics) == 0


async def test_client_gone_while_not_reading_is_noticed_and_the_upstream_closed() -> None:
    # a client that stops reading and then closes its side (FIN) leaves the gateway a closing transport
    # whose write buffer never drains; aiohttp reports no disconnect until it does, so the relay waited
    # on drain() for ever: never counted, and the engine generated on (seen once against vLLM in CI)
    import socket

    from servelens.prometheus.parse import parse_exposition
    from servelens.sim.testing import run_sim

    async with run_sim(speedup=1000) as sim, run_gateway(sim.url) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"model": sim.model, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 100000, "ignore_eos": True, "stream": True}).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                     b"x-request-id: slow-reader\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
        await writer.drain()
        assert (await reader.read(100)).startswith(b"HTTP/1.1 200")
        # the client reads no more: the gateway's buffer to it fills up
        cast(asyncio.ReadTransport, writer.transport).pause_reading()
        async with asyncio.timeout(10):  # until the gateway holds back reading from the sim: its buffer is full
            while not any(c.reading_paused for c in gw.gateway.upstream._all):
                await asyncio.sleep(0.01)
        writer.get_extra_info("socket").shutdown(socket.SHUT_WR)  # FIN; the socket stays open, unread
        try:
            await gw.gateway.wait_finished(1, timeout=30.0)
            samples = parse_exposition(gw.metrics.exposition().decode())
            cancelled = sum(v for (name, labels), v in samples.items()
                            if name == "servelens_requests_total" and ("error_type", "cancelled") in labels)
            assert cancelled == 1
            assert sum(v for (name, _), v in samples.items() if name == "servelens_inflight_requests") == 0
            truth = await sim.wait_truth("slow-reader")
            assert truth.outcome == "cancelled" and len(truth.token_times_ns) < 100000  # generation stopped
        finally:
            writer.close()


UNARY = (b'{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],'
         b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}')


async def test_gzip_body_despite_identity_is_decoded_measured_and_relayed_as_it_comes() -> None:
    # the gateway asks for Accept-Encoding: identity; an upstream (or a proxy in front of it) that
    # compresses anyway had its stream held to the end and counted truncated_stream, its unary reply
    # counted backend_error
    client_got_first = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            _, body = await read_http_request(r)
            z = zlib.compressobj(wbits=31)
            if json.loads(body).get("stream"):
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n")
                for i, e in enumerate(EVENTS):
                    w.write(http_chunk(z.compress(e) + z.flush(zlib.Z_SYNC_FLUSH)))
                    await w.drain()
                    if i == 0:
                        async with asyncio.timeout(5):
                            await client_got_first.wait()  # the first event reached the client alone
                w.write(http_chunk(z.flush()) + b"0\r\n\r\n")
            else:
                data = z.compress(UNARY) + z.flush()
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                        b"Content-Length: %d\r\n\r\n%b" % (len(data), data))
            await w.drain()

    async with raw_upstream(handler) as url, run_gateway(url, models=["m"]) as gw, aiohttp.ClientSession(
            auto_decompress=False) as http:
        body = json.loads(BODY)
        async with http.post(gw.url + "/v1/chat/completions", json=body) as resp:
            assert "Content-Encoding" not in resp.headers
            got = await resp.content.readuntil(b"\n\n")
            assert got == EVENTS[0]
            client_got_first.set()
            got += await resp.read()
        assert got == b"".join(EVENTS)
        async with http.post(gw.url + "/v1/chat/completions", json={**body, "stream": False}) as resp:
            assert "Content-Encoding" not in resp.headers and await resp.read() == UNARY
        await gw.gateway.wait_finished(2)
        assert requests_total(gw.metrics, status="success") == 2 and inflight(gw.metrics) == 0
        assert total(samples(gw.metrics), "servelens_time_to_first_token_seconds_count") == 1


@pytest.mark.parametrize(("coding", "data"), [("br", b"\x1b\x00"), ("gzip", b"not gzip at all")])
async def test_body_in_a_coding_the_gateway_cannot_read_is_a_backend_error(coding: str, data: bytes) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: %b\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n%b0\r\n\r\n" % (coding.encode(), http_chunk(data)))
        await w.drain()
        await r.read()

    async with raw_upstream(handler) as url, run_gateway(url, models=["m"]) as gw, aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/chat/completions", data=BODY) as resp:
            with contextlib.suppress(aiohttp.ClientPayloadError):  # br: a 502; broken gzip: the stream cut
                await resp.read()
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, error_type="backend_error") == 1 and inflight(gw.metrics) == 0


def gz(data: bytes, wbits: int = 31) -> bytes:
    z = zlib.compressobj(wbits=wbits)
    return z.compress(data) + z.flush()


def _bad_crc() -> bytes:
    bad = bytearray(gz(UNARY))
    bad[-6] ^= 0xFF  # in the CRC-32 of the trailer
    return bytes(bad)


def unary_head(coding: bytes, n: int | None, status: bytes = b"200 OK") -> bytes:
    size = b"Connection: close\r\n" if n is None else b"Content-Length: %d\r\n" % n
    return b"HTTP/1.1 %b\r\nContent-Type: application/json\r\nContent-Encoding: %b\r\n%b\r\n" % (status, coding, size)


BAD = _bad_crc()
BOMB = gz(b"0" * (20 << 20))
RAW_DEFLATE = gz(UNARY, -15)
WHOLE = gz(UNARY)


@pytest.mark.parametrize("reads", [
    [unary_head(b"gzip", len(BAD)) + BAD],  # the error and the end of the body in one read
    [unary_head(b"gzip", len(BAD)) + BAD[:-8], BAD[-8:]],  # the bad trailer in a read of its own
    [unary_head(b"gzip", len(BOMB)) + BOMB],  # decodes to over MAX_INFLATE_BYTES in one read
    [unary_head(b"deflate", len(RAW_DEFLATE)) + RAW_DEFLATE],  # raw deflate: not what deflate means
    [unary_head(b"gzip", None) + WHOLE[:-8]],  # ended by close before its trailer
], ids=["bad-crc", "bad-crc-own-read", "bomb", "raw-deflate", "cut-by-close"])
async def test_unary_body_that_does_not_decode_is_a_502_backend_error(reads: list[bytes]) -> None:
    # read() returned what was decoded (even a whole body with a bad CRC) once the message ended in
    # the same read as the error: 200, counted success or backend_error with an empty body
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        for i, data in enumerate(reads):
            if i:
                await asyncio.sleep(0.05)  # a read of its own (not a test wait)
            w.write(data)
            await w.drain()
        w.close()

    async with raw_upstream(handler) as url, run_gateway(url, models=["m"]) as gw, aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/chat/completions", json={**json.loads(BODY), "stream": False}) as resp:
            assert resp.status == 502 and (await resp.json())["error"]["code"] == "upstream_error"
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, error_type="backend_error") == 1 and inflight(gw.metrics) == 0


async def test_gzip_stream_of_several_members_is_decoded_whole() -> None:
    # one member per event (RFC 1952 allows any number): only the first was decoded
    head = SSE_HEAD.replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n")
    members = gz(EVENTS[1]) + gz(EVENTS[2])
    rest = http_chunk(members[:5]) + http_chunk(members[5:]) + http_chunk(b"\x00\x00") + b"0\r\n\r\n"  # (padding)
    async with relayed_once(two_reads(head + http_chunk(gz(EVENTS[0])), rest)) as (got, gw):
        assert got.count(b"data:") == 3 and b"Content-Encoding" not in got
        assert requests_total(gw.metrics, status="success") == 1


async def test_empty_body_labelled_gzip_is_relayed_as_it_is() -> None:
    # an empty body is no cut-short member: a 429 became a 502 backend_error
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(unary_head(b"gzip", 0, b"429 Too Many Requests"))
        await w.drain()
        await r.read()

    async with raw_upstream(handler) as url, run_gateway(url, models=["m"]) as gw, aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/chat/completions", json={**json.loads(BODY), "stream": False}) as resp:
            assert resp.status == 429 and await resp.read() == b""
        await gw.gateway.wait_finished(1)
        assert requests_total(gw.metrics, error_type="overload") == 1


async def test_an_upstream_closing_after_every_stream_costs_no_request() -> None:
    """As llama-server does: keep-alive in the headers, yet the connection closes after the stream
    (here as the next request arrives, so every reuse meets the close). Every request succeeds, is
    counted once, and each resend on a fresh connection is in ``servelens_gateway_upstream_retries_total``."""
    n = 6
    reads: list[int] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        reads.append(1)
        w.write(SSE_HEAD + b"".join(http_chunk(e) for e in EVENTS) + b"0\r\n\r\n")
        await w.drain()
        await read_request(r)  # the next request on this connection: closed unanswered
        reads.append(1)

    async with raw_tcp_server(handler) as (port, conns), run_gateway(
        f"http://127.0.0.1:{port}", models=["m"], inject_usage=False
    ) as gw, aiohttp.ClientSession() as s:
        for _ in range(n):
            async with s.post(gw.url + "/v1/chat/completions", data=BODY,
                              headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200 and (await resp.read()).endswith(b"data: [DONE]\n\n")
        await gw.gateway.wait_finished(n)
        assert requests_total(gw.metrics, status="success") == requests_total(gw.metrics) == n
        assert gw.gateway.upstream_retries == n - 1
        async with s.get(gw.url + "/metrics") as resp:
            text = await resp.text()
    assert f"servelens_gateway_upstream_retries_total {float(n - 1)}" in text
    assert len(conns) == n and len(reads) == 2 * n - 1  # each reuse read once, unanswered
