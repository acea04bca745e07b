"""The gateway's HTTP/1.1 upstream client (servelens.gateway.upstream) against scripted raw servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from multidict import CIMultiDict
from yarl import URL

from servelens.gateway.upstream import UpstreamClient, UpstreamError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[tuple[URL, list[int]]]:
    """A TCP server on 127.0.0.1 (free port) running ``handler`` per connection; yields its URL and a
    list that gets one entry per accepted connection."""
    conns: list[int] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append(1)
        try:
            await handler(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield URL(f"http://127.0.0.1:{port}/v1/completions"), conns
    finally:
        server.close()
        await server.wait_closed()


async def read_request(r: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request: (head, body) (Content-Length bodies only)."""
    head = await r.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await r.readexactly(length)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_request_head_and_keep_alive_reuse() -> None:
    heads: list[bytes] = []
    bodies: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head, body = await read_request(r)
            heads.append(head)
            bodies.append(body)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Request-Id: abc\r\n\r\nhello")
            await w.drain()

    async with raw_server(handler) as (url, conns):
        client = UpstreamClient(connect_timeout_s=2)
        try:
            for i in range(3):
                auth = CIMultiDict({"Authorization": "Bearer t"})
                resp = await client.request("POST", url.with_query(a=str(i)), auth, b'{"x": 1}')
                assert (resp.status, resp.reason, resp.headers["x-request-id"]) == (200, "OK", "abc")
                assert await resp.read() == b"hello" and await resp.read() == b"hello"
                resp.close()
        finally:
            await client.close()
    assert len(conns) == 1, "one kept-alive connection for all three requests"
    assert heads[2].startswith(b"POST /v1/completions?a=2 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nAuthorization: Bearer t\r\n" in heads[0] and b"\r\nContent-Length: 8\r\n" in heads[0]
    assert bodies == [b'{"x": 1}'] * 3


async def test_stale_kept_alive_connection_is_retried_once_on_a_new_one() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()
        # keep-alive promised, then the connection is closed once the next request arrives
        await r.read(1)

    async with raw_server(handler) as (url, conns):
        client = UpstreamClient(connect_timeout_s=2)
        try:
            for _ in range(2):
                resp = await client.request("POST", url, CIMultiDict(), b"{}")
                assert await resp.read() == b"ok"
                resp.close()
        finally:
            await client.close()
    assert len(conns) == 2


async def test_chunked_close_delimited_and_after_interim_responses() -> None:
    async def chunked(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK_HEAD + chunk(b"data: 1\n\n") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await w.drain()
        await r.read()

    async def interim_first(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nbody")
        await w.drain()
        await r.read()

    async def close_delimited(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await w.drain()

    cases = ((chunked, b"data: 1\n\ndata: [DONE]\n\n"), (close_delimited, b"all of it"), (interim_first, b"body"))
    for handler, want in cases:
        async with raw_server(handler) as (url, _):
            client = UpstreamClient(connect_timeout_s=2)
            try:
                resp = await client.request("POST", url, CIMultiDict(), b"{}")
                assert await resp.read() == want and resp.ended
                resp.close()
            finally:
                await client.close()


async def test_cannot_connect_is_unavailable() -> None:
    async with raw_server(read_request) as (url, _):
        pass  # closed: nothing listens on that port now
    client = UpstreamClient(connect_timeout_s=2)
    with pytest.raises(UpstreamError) as err:
        await client.request("POST", url, CIMultiDict(), b"{}")
    assert err.value.error_type == "unavailable" and err.value.before_response
    await client.close()


async def test_closed_before_response_is_unavailable_and_malformed_response_too() -> None:
    async def hang_up(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)

    async def garbage(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"SMTP ready\r\n\r\n")
        await w.drain()
        await r.read()

    for handler in (hang_up, garbage):
        async with raw_server(handler) as (url, _):
            client = UpstreamClient(connect_timeout_s=2)
            with pytest.raises(UpstreamError) as err:
                await client.request("POST", url, CIMultiDict(), b"{}")
            assert err.value.error_type == "unavailable"
            await client.close()


async def test_pump_delivers_pieces_in_order_and_a_cut_is_truncated_stream() -> None:
    release = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK_HEAD + chunk(b"data: 1\n\n"))
        await w.drain()
        await release.wait()
        w.write(chunk(b"data: 2\n\n"))
        await w.drain()
        w.transport.abort()  # cut mid-body

    async with raw_server(handler) as (url, _):
        client = UpstreamClient(connect_timeout_s=2)
        got: list[bytes] = []

        def sink(data: bytes) -> bool:
            got.append(data)
            release.set()
            return False

        async def drain() -> None:
            raise AssertionError("never paused")

        resp = await client.request("POST", url, CIMultiDict(), b"{}")
        with pytest.raises(UpstreamError) as err:
            await resp.pump(sink, drain)
        assert err.value.error_type == "truncated_stream"
        assert b"".join(got) == b"data: 1\n\ndata: 2\n\n"
        resp.close()
        await client.close()


async def test_silence_is_response_timeout() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK_HEAD + chunk(b"data: 1\n\n"))
        await w.drain()
        await r.read()  # then nothing until the client gives up

    async with raw_server(handler) as (url, _):
        client = UpstreamClient(connect_timeout_s=2, read_timeout_s=0.2)
        resp = await client.request("POST", url, CIMultiDict(), b"{}")
        with pytest.raises(UpstreamError) as err:
            async with asyncio.timeout(10):
                await resp.read()
        assert err.value.error_type == "response_timeout"
        resp.close()
        await client.close()


async def test_sink_pauses_reading_until_drain_returns() -> None:
    n = 200
    payload = b"x" * 1000

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            w.write(OK_HEAD)
            for _ in range(n):
                w.write(chunk(payload))
                await w.drain()
            w.write(b"0\r\n\r\n")
            await w.drain()

    async with raw_server(handler) as (url, conns):
        client = UpstreamClient(connect_timeout_s=2, read_timeout_s=0.3)
        got: list[bytes] = []
        drains = 0
        drain_release = asyncio.Event()

        def sink(data: bytes) -> bool:
            got.append(data)
            return True  # always "the client is slow"

        async def drain() -> None:
            nonlocal drains
            drains += 1
            if drains == 1:
                # held longer than read_timeout_s: a pause of ours is not the upstream's silence
                loop = asyncio.get_running_loop()
                loop.call_later(0.5, drain_release.set)
                await drain_release.wait()

        resp = await client.request("POST", url, CIMultiDict(), b"{}")
        async with asyncio.timeout(20):
            await resp.pump(sink, drain)
        assert b"".join(got) == payload * n and drains >= 1
        resp.close()
        # the response was read whole: its connection is reused; closed unread, it is not kept
        resp = await client.request("POST", url, CIMultiDict(), b"{}")
        resp.close()
        assert len(conns) == 1
        resp = await client.request("POST", url, CIMultiDict(), b"{}")
        resp.close()
        await client.close()
        assert len(conns) == 2
