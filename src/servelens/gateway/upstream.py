"""The gateway's HTTP/1.1 client for measured requests: keep-alive connections per upstream, responses
parsed by ``httptools`` (llhttp, the parser uvicorn uses), body pieces handed to a sink inside the
connection's own ``data_received`` callback.

Why not ``aiohttp.ClientSession`` here: its per-request machinery (about 0.3 ms of CPU) and its
per-chunk ``StreamReader`` hand-off (a task switch for every SSE event) were most of the gateway's cost
against nginx (docs/benchmarks.md, issue 4). This client does what a reverse proxy needs and no more:

* one ``write`` per request (head and body together), ``Host`` and ``Content-Length`` set here;
* no redirects, no cookies, no decompression (bodies are relayed as the upstream sent them);
* connections kept alive ``keepalive_s`` after use (LIFO); a request that finds its reused connection
  closed by the upstream before any response byte is sent once more on a new connection;
* timeouts: ``connect_timeout_s`` to connect; ``read_timeout_s`` of silence from the upstream at any
  point (not counted while the gateway itself holds reading back because its client is slow);
  the caller bounds the wait for headers (``asyncio.timeout`` around :meth:`UpstreamClient.request`).

Errors are :class:`UpstreamError` with a Dynamo ``error_type``: ``unavailable`` (cannot connect, or the
connection failed before a response), ``response_timeout`` (silence), ``truncated_stream`` (the body
was cut).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httptools
from multidict import CIMultiDict
from yarl import URL

Sink = Callable[[bytes], bool]
"""Receives each body piece as it arrives; returns True to pause reading from the upstream."""


class UpstreamError(Exception):
    """The upstream request failed; ``error_type`` is Dynamo's name for it (``unavailable``,
    ``response_timeout``, ``truncated_stream``); ``before_response``: no response byte was read."""

    def __init__(self, error_type: str, message: str, before_response: bool = False) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.before_response = before_response


class UpstreamResponse:
    """One response being read. :attr:`status`, :attr:`reason` and :attr:`headers` are set once
    :meth:`UpstreamClient.request` returns; the body is read with :meth:`read` or :meth:`pump`.
    Call :meth:`close` when done (returns the connection to the pool when the body was read whole)."""

    __slots__ = (
        "_conn",
        "_done",
        "_ended",
        "_error",
        "_header_pairs",
        "_headers_fut",
        "_paused",
        "_pieces",
        "_sink",
        "_sized",
        "_waiter",
        "headers",
        "reason",
        "status",
    )

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._headers_fut: asyncio.Future[None] = conn.loop.create_future()
        self._header_pairs: list[tuple[str, str]] = []
        self._pieces: list[bytes] = []
        self._sink: Sink | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._done = False
        self._paused = False
        self._sized = False  # Content-Length or chunked: EOF before the end is a cut
        self._error: UpstreamError | None = None
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDict[str] = CIMultiDict()

    # -- called by the connection --------------------------------------------------------
    def _on_headers(self, status: int, reason: str) -> None:
        self.status = status
        self.reason = reason
        self.headers = CIMultiDict(self._header_pairs)
        te = self.headers.get("Transfer-Encoding", "")
        self._sized = "Content-Length" in self.headers or "chunked" in te.lower()
        if not self._headers_fut.done():
            self._headers_fut.set_result(None)

    def _on_body(self, data: bytes) -> None:
        sink = self._sink
        if sink is None:
            self._pieces.append(data)
            self._wake()
        elif sink(data) and not self._paused:
            self._paused = True
            self._conn.pause_reading()
            self._wake()

    def _on_end(self) -> None:
        self._ended = True
        self._wake()

    def _on_fail(self, err: UpstreamError) -> None:
        if self._ended or self._error is not None:
            return
        if self._headers_fut.done() and not self._sized and err.error_type == "truncated_stream":
            self._ended = True  # a body delimited by the connection's close: complete
        else:
            self._error = err
            if not self._headers_fut.done():
                self._headers_fut.set_exception(err)
                self._headers_fut.exception()  # retrieved: a caller gone by now must not be warned
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        w = self._waiter = self._conn.loop.create_future()
        try:
            await w
        finally:
            self._waiter = None

    # -- public --------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        """The whole body was received."""
        return self._ended

    async def read(self) -> bytes:
        """The whole body (waits for its end; again the same body when called again). Raises
        :class:`UpstreamError`."""
        while not self._ended:
            if self._error is not None:
                raise self._error
            await self._wait()
        data = b"".join(self._pieces)
        self._pieces = [data]  # read() again gives the same body
        return data

    async def pump(self, sink: Sink, drain: Callable[[], Awaitable[None]]) -> None:
        """Hand every body piece to ``sink`` as it arrives (in the connection's callback, no task
        switch); returns when the body ended. When ``sink`` returns True, reading from the upstream
        pauses until ``drain()`` returns. Raises :class:`UpstreamError` (cut, silence)."""
        self._sink = sink
        held, self._pieces = self._pieces, []
        for piece in held:
            if sink(piece):
                self._paused = True
        while True:
            if self._paused:
                await drain()
                self._paused = False
                self._conn.resume_reading()
                continue
            if self._error is not None:
                raise self._error
            if self._ended:
                return
            await self._wait()

    def close(self) -> None:
        """Release the connection: back to the pool when the response ended cleanly and may be
        kept alive, else closed (the upstream sees the request go away)."""
        if self._done:
            return
        self._done = True
        self._sink = None
        self._conn.release(self._ended and self._error is None)


class _Connection(asyncio.Protocol):
    """One upstream connection: writes requests, feeds the parser, drives the current response."""

    def __init__(self, client: UpstreamClient, key: tuple[str, int]) -> None:
        self.client = client
        self.key = key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser: Any = None
        self.resp: UpstreamResponse | None = None
        self.got_bytes = False
        self.keep_alive = False
        self.reused = False
        self.closed = False
        self.reading_paused = False
        self.interim = False
        self.last_read = 0.0
        self._status_reason = ""
        self._name = b""
        self._idle: asyncio.TimerHandle | None = None
        self._watch: asyncio.TimerHandle | None = None

    # -- protocol callbacks --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        if self.resp is None:  # bytes while idle: the connection cannot be trusted any more
            self.close()
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(
                UpstreamError(
                    "truncated_stream" if self.resp.status else "unavailable",
                    f"malformed HTTP response from the upstream: {exc}",
                )
            )
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timers()
        self.client._forget(self)
        if self.resp is not None:
            if self.resp.status:
                self._fail(UpstreamError("truncated_stream", "the upstream closed the connection mid-body"))
            else:
                self._fail(
                    UpstreamError(
                        "unavailable",
                        f"the upstream closed the connection: {type(exc).__name__ if exc else 'EOF'}",
                        before_response=not self.got_bytes,
                    )
                )

    def pause_writing(self) -> None:  # request bodies are written at once; nothing to hold back
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks -------------------------------------------------------------
    def on_status(self, status: bytes) -> None:
        self._status_reason += status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.resp is not None
        self.resp._header_pairs.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        assert self.resp is not None
        status = int(self.parser.get_status_code())
        if 100 <= status < 200:  # an interim response (100 Continue, 103 Early Hints): the real one follows
            self.interim = True
            self.resp._header_pairs.clear()
            self._status_reason = ""
            return
        self.keep_alive = bool(self.parser.should_keep_alive())
        self.resp._on_headers(status, self._status_reason)

    def on_body(self, body: bytes) -> None:
        assert self.resp is not None
        self.resp._on_body(body)

    def on_message_complete(self) -> None:
        resp = self.resp
        assert resp is not None
        if self.interim:
            self.interim = False
            return
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        resp._on_end()

    # -- driving -------------------------------------------------------------------------
    def send(self, head: bytes, body: bytes) -> UpstreamResponse:
        assert self.transport is not None
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self.resp = UpstreamResponse(self)
        self.parser = httptools.HttpResponseParser(self)
        self._status_reason = ""
        self.interim = False
        self.got_bytes = False
        self.last_read = self.loop.time()
        self._arm_watch(self.client.read_timeout_s)
        if body:
            self.transport.write(head + body)
        else:
            self.transport.write(head)
        return self.resp

    def _arm_watch(self, after: float | None) -> None:
        if after is not None and after > 0:
            self._watch = self.loop.call_later(after, self._check_silence)

    def _check_silence(self) -> None:
        self._watch = None
        timeout = self.client.read_timeout_s
        if self.resp is None or timeout is None:
            return
        if self.reading_paused:  # the gateway holds reading back: not the upstream's silence
            self._arm_watch(timeout)
            return
        idle = self.loop.time() - self.last_read
        if idle >= timeout:
            self._fail(UpstreamError("response_timeout", f"no data from the upstream for {timeout:g} s"))
            self.close()
        else:
            self._arm_watch(timeout - idle)

    def _fail(self, err: UpstreamError) -> None:
        if self.resp is not None:
            self.resp._on_fail(err)

    def pause_reading(self) -> None:
        if self.transport is not None and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self.reading_paused:
            self.reading_paused = False
            self.last_read = self.loop.time()
            if not self.transport.is_closing():
                self.transport.resume_reading()

    def release(self, reusable: bool) -> None:
        """The response is done with: keep the connection for the next request, or close it."""
        self.resp = None
        self.parser = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if reusable and self.keep_alive and not self.closed and not self.reading_paused:
            self.reused = True
            self._idle = self.loop.call_later(self.client.keepalive_s, self.close)
            self.client._park(self)
        else:
            self.close()

    def close(self) -> None:
        self._cancel_timers()
        self.client._forget(self)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.closed = True

    def _cancel_timers(self) -> None:
        for h in (self._idle, self._watch):
            if h is not None:
                h.cancel()
        self._idle = self._watch = None


class UpstreamClient:
    """Keep-alive HTTP/1.1 connections to upstreams (``http://`` only), for the gateway's measured
    requests. Create and use it inside a running event loop; :meth:`close` at the end.

    Args:
        connect_timeout_s: bound on connecting (seconds).
        read_timeout_s: bound on silence from the upstream while a response is awaited or read
            (seconds; None: none).
        keepalive_s: how long an idle connection is kept (seconds).
    """

    def __init__(
        self, connect_timeout_s: float = 10.0, read_timeout_s: float | None = None, keepalive_s: float = 4.0
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._all: set[_Connection] = set()

    async def request(self, method: str, url: URL, headers: CIMultiDict[str], body: bytes = b"") -> UpstreamResponse:
        """Send a request and wait for the response headers.

        ``url``: absolute ``http://`` URL (its raw path and query are sent as they are);
        ``headers``: sent as given, plus ``Host`` and ``Content-Length`` (set here). Returns the
        response with status and headers; read its body with :meth:`UpstreamResponse.read` or
        :meth:`UpstreamResponse.pump`. Raises :class:`UpstreamError` (``unavailable``,
        ``response_timeout``); bound the wait with ``asyncio.timeout`` for a response deadline.
        """
        if url.scheme != "http" or not url.host:
            raise UpstreamError("unavailable", f"unsupported upstream URL {url} (http:// only)", True)
        host, port = url.host, url.port or 80
        head = self._head(method, url, headers, len(body))
        for attempt in range(2):
            conn = await self._acquire((host, port))
            resp = conn.send(head, body)
            try:
                await resp._headers_fut
            except UpstreamError as exc:
                resp.close()
                if attempt == 0 and conn.reused and exc.before_response:
                    continue  # the upstream had closed the idle connection: once more, on a new one
                raise
            except BaseException:
                resp.close()
                raise
            return resp
        raise AssertionError("unreachable")

    def _head(self, method: str, url: URL, headers: CIMultiDict[str], length: int) -> bytes:
        target = url.raw_path_qs
        host = url.raw_host or ""
        if url.explicit_port:
            host = f"{host}:{url.port}"
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
        lines.extend(f"{k}: {v}\r\n" for k, v in headers.items())
        lines.append(f"Content-Length: {length}\r\n\r\n")
        return "".join(lines).encode("utf-8", "surrogateescape")

    async def _acquire(self, key: tuple[str, int]) -> _Connection:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await loop.create_connection(lambda: _Connection(self, key), key[0], key[1])
        except TimeoutError:
            raise UpstreamError("unavailable", f"cannot connect to {key[0]}:{key[1]}: timed out", True) from None
        except OSError as exc:
            raise UpstreamError(
                "unavailable", f"cannot connect to {key[0]}:{key[1]}: {type(exc).__name__}", True
            ) from None
        self._all.add(proto)
        return proto

    def _park(self, conn: _Connection) -> None:
        self._idle.setdefault(conn.key, []).append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def close(self) -> None:
        """Close every connection (idle or in use)."""
        for conn in list(self._all):
            with contextlib.suppress(Exception):
                conn.close()
        self._idle.clear()
        self._all.clear()
