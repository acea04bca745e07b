"""The gateway's HTTP/1.1 upstream client (servelens.gateway.upstream) against scripted raw servers."""

from __future__ import annotations

import asyncio
import select
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from multidict import CIMultiDict
from yarl import URL

from servelens.gateway.testing import RawHandler, http_chunk, raw_tcp_server, read_http_request
from servelens.gateway.upstream import UpstreamClient, UpstreamError, UpstreamResponse

read_request = read_http_request


@asynccontextmanager
async def raw_server(handler: RawHandler) -> AsyncIterator[tuple[URL, list[int]]]:
    """:func:`raw_tcp_server` with the URL of its completions path."""
    async with raw_tcp_server(handler) as (port, conns):
        yield URL(f"http://127.0.0.1:{port}/v1/completions"), conns


@asynccontextmanager
async def one_response(handler: RawHandler, **client_kw: Any) -> AsyncIterator[UpstreamResponse]:
    """Serve ``handler``, POST once through a new client; yields the response (its headers read),
    closes the response and the client after."""
    async with raw_server(handler) as (url, _):
        client = UpstreamClient(connect_timeout_s=2, **client_kw)
        try:
            resp = await client.request("POST", url, CIMultiDict(), b"{}")
            try:
                yield resp
            finally:
                resp.close()
        finally:
            await client.close()


async def never_drain() -> None:
    raise AssertionError("never paused")



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


async def test_a_reused_connection_closed_unanswered_is_resent_once_on_a_fresh_one() -> None:
    """The upstream reads the next request on a kept-alive connection and closes it unanswered (as
    llama-server's close after a stream meets a request sent in that moment): the request goes out
    again on a fresh connection, once, and is counted. A fresh connection that fails is not resent."""
    posts: list[int] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        posts.append(1)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()
        # keep-alive promised, then the next request is read and the connection closed unanswered
        await read_request(r)
        posts.append(1)

    async with raw_server(handler) as (url, conns):
        client = UpstreamClient(connect_timeout_s=2)
        try:
            for expected_retries in (0, 1, 2):
                resp = await client.request("POST", url, CIMultiDict(), b"{}")
                assert await resp.read() == b"ok"
                resp.close()
                assert client.retries == expected_retries
        finally:
            await client.close()
    assert len(posts) == 5 and len(conns) == 3, "1st; 2nd read unanswered, resent; 3rd the same"


async def test_a_fresh_connection_or_a_started_response_is_never_resent() -> None:
    posts: list[int] = []

    async def hang_up(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        posts.append(1)

    async def half_head_on_reuse(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        posts.append(1)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()
        await read_request(r)
        posts.append(1)
        w.write(b"HTTP/1.1 200 O")  # a response byte came: the upstream answered, it is not asked again
        await w.drain()

    async with raw_server(hang_up) as (url, conns):
        client = UpstreamClient(connect_timeout_s=2)
        with pytest.raises(UpstreamError) as err:
            await client.request("POST", url, CIMultiDict(), b"{}")
        assert err.value.error_type == "unavailable" and err.value.before_response
        assert client.retries == 0
        await client.close()
    assert len(posts) == 1 and len(conns) == 1
    posts.clear()
    async with raw_server(half_head_on_reuse) as (url, conns):
        client = UpstreamClient(connect_timeout_s=2)
        try:
            resp = await client.request("POST", url, CIMultiDict(), b"{}")
            assert await resp.read() == b"ok"
            resp.close()
            with pytest.raises(UpstreamError) as err:
                await client.request("POST", url, CIMultiDict(), b"{}")
            assert err.value.error_type == "unavailable" and not err.value.before_response
            assert client.retries == 0
        finally:
            await client.close()
    assert len(posts) == 2 and len(conns) == 1


async def test_chunked_close_delimited_and_after_interim_responses() -> None:
    async def chunked(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK_HEAD + http_chunk(b"data: 1\n\n") + http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
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
    async def never_called(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        raise AssertionError("nothing connects")

    async with raw_server(never_called) as (url, _):
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
        w.write(OK_HEAD + http_chunk(b"data: 1\n\n"))
        await w.drain()
        await release.wait()
        w.write(http_chunk(b"data: 2\n\n"))
        await w.drain()
        w.transport.abort()  # cut mid-body

    got: list[bytes] = []

    def flush() -> bool:
        release.set()
        return False

    async with one_response(handler) as resp:
        with pytest.raises(UpstreamError) as err:
            await resp.pump(got.append, flush, never_drain)
    assert err.value.error_type == "truncated_stream"
    assert b"".join(got) == b"data: 1\n\ndata: 2\n\n"


async def test_silence_is_response_timeout() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK_HEAD + http_chunk(b"data: 1\n\n"))
        await w.drain()
        await r.read()  # then nothing until the client gives up

    async with one_response(handler, read_timeout_s=0.2) as resp:
        with pytest.raises(UpstreamError) as err:
            async with asyncio.timeout(10):
                await resp.read()
    assert err.value.error_type == "response_timeout"


async def test_sink_pauses_reading_until_drain_returns() -> None:
    n = 200
    payload = b"x" * 1000

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            w.write(OK_HEAD)
            for _ in range(n):
                w.write(http_chunk(payload))
                await w.drain()
            w.write(b"0\r\n\r\n")
            await w.drain()

    async with raw_server(handler) as (url, conns):
        client = UpstreamClient(connect_timeout_s=2, read_timeout_s=0.3)
        got: list[bytes] = []
        drains = 0
        drain_release = asyncio.Event()

        def flush() -> bool:
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
            await resp.pump(got.append, flush, drain)
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


async def test_a_second_response_after_the_final_one_is_not_read() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
                    b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nSMUGGLED!")
            await w.drain()

    async with raw_server(handler) as (url, conns):
        client = UpstreamClient(connect_timeout_s=2)
        for _ in range(2):
            resp = await client.request("POST", url, CIMultiDict(), b"{}")
            assert (resp.status, await resp.read()) == (200, b"{}")
            resp.close()
        await client.close()
    assert len(conns) == 2, "a connection that sent more than its response is not reused"


async def test_pieces_held_before_pump_can_pause_reading() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK_HEAD + http_chunk(b"first"))  # headers and a first piece in one read: held until pump
        await w.drain()
        for _ in range(50):
            w.write(http_chunk(b"x" * 10_000))
            await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()
        await r.read()

    got: list[bytes] = []
    reading_during_drain: list[bool] = []
    async with one_response(handler) as resp:

        async def drain() -> None:
            transport = resp._conn.transport
            assert transport is not None
            reading_during_drain.append(transport.is_reading())

        async with asyncio.timeout(10):
            await resp.pump(got.append, lambda: True, drain)
    assert got[0] == b"first" and b"".join(got[1:]) == b"x" * 500_000
    assert reading_during_drain and not any(reading_during_drain)


async def test_reads_are_flushed_once_each() -> None:
    events = b"".join(http_chunk(b"data: %d\n\n" % i) for i in range(50))

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK_HEAD + events + b"0\r\n\r\n")  # one write: 50 chunks in (about) one read
        await w.drain()
        await r.read()

    got: list[bytes] = []
    flushes = 0

    def flush() -> bool:
        nonlocal flushes
        flushes += 1
        return False

    async with one_response(handler) as resp:
        await resp.pump(got.append, flush, never_drain)
    assert len(got) == 50 and flushes < 5


async def test_close_delimited_body_cut_by_a_reset_is_truncated() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\n")
        await w.drain()
        await r.read(1)  # held open until the test ends; the reset is reported to the client below

    got: list[bytes] = []
    async with one_response(handler) as resp:
        pumping = asyncio.ensure_future(resp.pump(got.append, lambda: False, never_drain))
        async with asyncio.timeout(5):
            while not got:
                await asyncio.sleep(0)
        resp._conn.connection_lost(ConnectionResetError("reset by peer"))  # what the loop reports for a RST
        with pytest.raises(UpstreamError) as err:
            await pumping
    assert err.value.error_type == "truncated_stream"


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n", "over"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n{}", "over"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", "Upgrade"),
    ],
    ids=["head-over-64k", "head-over-64k-with-body", "101-upgrade"],
)
async def test_oversized_or_upgrade_response_heads_are_unavailable(head: bytes, why: str) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(head)
        await w.drain()
        await r.read()

    loop_errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))
    async with raw_server(handler) as (url, _):
        client = UpstreamClient(connect_timeout_s=2)
        with pytest.raises(UpstreamError) as err:
            await client.request("POST", url, CIMultiDict(), b"{}")
        assert err.value.error_type == "unavailable" and why in str(err.value)
        await client.close()
    assert not loop_errors


@pytest.mark.parametrize("status", [200, 500])
async def test_a_body_held_whole_over_the_limit_fails_and_is_not_held(monkeypatch: pytest.MonkeyPatch,
                                                                      status: int) -> None:
    # an upstream whose unary (or error) body never ends: it was held until the response timeout
    # (GBs in seconds); now the response fails once the body is over MAX_BODY_BYTES
    from servelens.gateway import upstream_response as upstream_mod

    monkeypatch.setattr(upstream_mod, "MAX_BODY_BYTES", 256 * 1024)
    sent = 0

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal sent
        await read_request(r)
        w.write(b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n" % status)
        while True:  # endless, until the client goes
            w.write(http_chunk(b"x" * 65536))
            sent += 65536
            await w.drain()

    async with one_response(handler) as resp:
        with pytest.raises(UpstreamError) as err:
            await asyncio.wait_for(resp.read(), 5)
        assert err.value.error_type == "backend_error" and "over 262144 bytes" in str(err.value)
        assert not resp._pieces
    assert sent < 64 * 1024 * 1024


def test_request_head_host_forms_and_url_credentials() -> None:
    head = UpstreamClient._head("POST", URL("http://[::1]:8000/v1/x?a=1"), CIMultiDict(), 2)
    assert head.startswith(b"POST /v1/x?a=1 HTTP/1.1\r\nHost: [::1]:8000\r\n")
    head = UpstreamClient._head("POST", URL("http://u%40x:p%3A@engine/v1/x"), CIMultiDict(), 0)
    assert b"\r\nHost: engine\r\n" in head and b"\r\nAuthorization: Basic dUB4OnA6\r\n" in head  # u@x:p:
    own = CIMultiDict({"Authorization": "Bearer k"})
    head = UpstreamClient._head("POST", URL("http://u:p@engine:81/v1/x"), own, 0)
    assert b"Basic" not in head and b"\r\nAuthorization: Bearer k\r\n" in head and b"Host: engine:81\r\n" in head


async def test_https_upstream() -> None:
    import ssl

    import trustme

    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")
        await w.drain()
        w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        client = UpstreamClient(connect_timeout_s=5, ssl_context=client_ctx)
        resp = await client.request("POST", URL(f"https://localhost:{port}/v1/completions"), CIMultiDict(), b"{}")
        assert await resp.read() == b"secret"
        resp.close()
        with pytest.raises(UpstreamError) as err:  # the system's CAs do not trust the test CA
            await UpstreamClient(connect_timeout_s=5).request(
                "POST", URL(f"https://localhost:{port}/v1/completions"), CIMultiDict(), b"{}")
        assert err.value.error_type == "unavailable" and "SSL" in str(err.value)
        await client.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_no_headers_within_the_deadline_is_response_timeout() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        await r.read()  # never answers

    async with raw_server(handler) as (url, _):
        client = UpstreamClient(connect_timeout_s=2, headers_timeout_s=0.2)  # no read timeout at all
        with pytest.raises(UpstreamError) as err:
            async with asyncio.timeout(10):
                await client.request("POST", url, CIMultiDict(), b"{}")
        assert err.value.error_type == "response_timeout" and "did not answer in time" in str(err.value)
        await client.close()


# -- an idle connection the upstream closed, or wrote on, before the loop read it ----------------
def block_until_readable(*socks: Any) -> None:
    """Block the event loop (no turn of it) until each of ``socks`` has something to read: what the
    loop reads in its next turn, after the code that runs now."""
    left = [s.fileno() for s in socks]
    deadline = time.monotonic() + 5
    while left:
        ready, _, _ = select.select(left, [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError("nothing to read")
        left = [fd for fd in left if fd not in ready]


IDLE_CLOSE = [
    b"",  # the upstream's FIN only (as uvicorn closes an idle keep-alive connection)
    b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 7\r\nConnection: close\r\n\r\ntimeout",  # then its FIN
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nSTRAY",  # a response to nothing, the connection kept open
]
IDLE_CLOSE_IDS = ["fin", "408-then-fin", "stray-response"]


@pytest.mark.parametrize("sent", IDLE_CLOSE, ids=IDLE_CLOSE_IDS)
async def test_an_idle_connection_with_unread_eof_or_bytes_is_not_reused(sent: bytes) -> None:
    # the upstream's close or bytes are in the socket, not yet read by the event loop, when a request
    # is sent (request's _reuse before it suspends): it went on that connection (a 502, the 408 or
    # the stray response as its answer)
    writers: list[asyncio.StreamWriter] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        writers.append(w)
        first = len(writers) == 1
        while True:
            await read_request(r)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n%b" % (b"first" if first else b"fresh"))
            await w.drain()
            if first:  # then idle: what the test writes on it is all it sends
                while await r.read(65536):
                    pass
                return

    async with raw_server(handler) as (url, conns):
        client = UpstreamClient(connect_timeout_s=2)
        try:
            resp = await client.request("POST", url, CIMultiDict(), b"{}")
            assert await resp.read() == b"first"
            resp.close()  # the connection is idle, kept alive
            (idle,) = client._all
            sock = idle.transport.get_extra_info("socket") if idle.transport is not None else None
            assert sock is not None
            up = writers[0]
            up.write(sent)
            if not sent.startswith(b"HTTP/1.1 200"):
                up.write_eof()
            assert up.transport.get_write_buffer_size() == 0  # sent, not buffered
            block_until_readable(sock)
            resp = await client.request("POST", url, CIMultiDict(), b"{}")  # in the same turn of the loop
            assert (resp.status, await resp.read()) == (200, b"fresh")
            resp.close()
            assert idle.closed
        finally:
            await client.close()
    assert len(conns) == 2
