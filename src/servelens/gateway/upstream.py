"""The gateway's HTTP/1.1 client for measured requests: keep-alive connections per upstream, responses
parsed by ``httptools`` (llhttp, the parser uvicorn uses), body pieces handed to a sink inside the
connection's own ``data_received`` callback.

Why not ``aiohttp.ClientSession`` here: its per-request machinery (about 0.3 ms of CPU) and its
per-chunk ``StreamReader`` hand-off (a task switch for every SSE event) were most of the gateway's cost
against nginx (docs/benchmarks.md, issue 4). This client does what a reverse proxy needs and no more:

* ``http://`` and ``https://`` upstreams (IPv6 literals included); credentials in the URL
  (``http://user:pass@host``) are sent as ``Authorization: Basic`` unless the request has its own
  ``Authorization``;
* one ``write`` per request (head and body together), ``Host`` and ``Content-Length`` set here;
* no redirects, no cookies; the gateway asks for ``Accept-Encoding: identity``, and a body the upstream
  compresses anyway with gzip or deflate is decoded here (its ``Content-Encoding`` dropped), so the
  stream is measured, cut and relayed as if it came plain; another coding fails as ``backend_error``;
* connections kept alive ``keepalive_s`` after use (LIFO; below the 5 s keep-alive of uvicorn, which
  serves vLLM and SGLang, so the upstream rarely closes a connection just as it is reused). A request
  whose *reused* connection fails before any byte of a response was read (EOF or reset: the upstream
  closed the idle connection as the request went out) is sent once more on a fresh connection, and
  counted (:attr:`UpstreamClient.retries`): llama-server closes its connection after every streamed
  response although its headers say keep-alive, and a request sent in that moment met the close
  (docs/llama-cpp.md). Browsers resend on the same condition. The cost: an upstream that read the
  request and then closed without a byte may compute it twice (an inference request has no other
  effect). A request is never resent after any response byte, after a timeout, or from a fresh
  connection;
* limits: response head (status line and headers) at most :data:`MAX_HEAD_BYTES`; a body held whole
  (read with :meth:`UpstreamResponse.read`, or not yet pumped) at most :data:`~.upstream_response.MAX_BODY_BYTES`; a
  response after the final one on the same connection is not read (the connection is dropped);
* timeouts: ``connect_timeout_s`` to connect; ``headers_timeout_s`` from sending the request to the
  response headers; ``read_timeout_s`` of silence from the upstream at any point (not counted while
  the gateway itself holds reading back because its client is slow); one timer per request.

Errors are :class:`UpstreamError` with a Dynamo ``error_type``: ``unavailable`` (cannot connect, or the
connection failed before a response, a reused one twice), ``response_timeout`` (silence), ``truncated_stream`` (the body
was cut), ``backend_error`` (a body to hold whole over :data:`~.upstream_response.MAX_BODY_BYTES`).

Three modules, one client: this one has the pool (:class:`UpstreamClient`) and the connection, a
protocol that writes requests and feeds the parser; :mod:`.upstream_response` has the response state it
drives and the errors; :mod:`.inflate` decodes a compressed body. The connection stays whole (about
250 lines): its parser callbacks, timers and keep-alive rules all act on one request's state.
The pool's resend of a request whose reused connection closed before any answer stays beside the
pool it acts on (about 30 lines).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import select
import ssl
from typing import Any, cast

import httptools
from multidict import CIMultiDict
from yarl import URL

from servelens.gateway.upstream_response import UpstreamError, UpstreamResponse

MAX_HEAD_BYTES = 64 * 1024
"""Largest response head accepted (bytes; nginx's default is 4-8 KiB, aiohttp's 8 KiB per field)."""

_PARSE_ERRORS = (httptools.HttpParserError, httptools.HttpParserUpgrade)


def redacted_url(url: str) -> str:
    """``url`` fit to log or show: a password in it becomes ``***`` (``http://u:***@host:8000``);
    a URL without a password is returned as it is."""
    parsed = URL(url)
    return str(parsed.with_password("***")) if parsed.password else url


class _Connection(asyncio.Protocol):
    """One upstream connection: writes requests, feeds the parser, drives the current response."""

    def __init__(self, client: UpstreamClient, key: tuple[str, str, int]) -> None:
        self.client = client
        self.key = key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.fd = -1  # the socket's descriptor (to see unread bytes while idle)
        self.parser: Any = None
        self.resp: UpstreamResponse | None = None
        self.got_bytes = False
        self.keep_alive = False
        self.closed = False
        self.reading_paused = False
        self.interim = False  # parsing a 1xx interim response
        self.head_deadline: float | None = None
        self.final_done = False  # the final response is complete: anything after it is not read
        self.trailing = False  # the upstream sent more after the final response
        self.head_done = False
        self.head_bytes = 0  # bytes read while the head was incomplete
        self.head_size = 0  # status and header bytes parsed
        self.last_read = 0.0
        self._status_reason = ""
        self._idle: asyncio.TimerHandle | None = None
        self._watch: asyncio.TimerHandle | None = None

    # -- protocol callbacks --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        self.fd = sock.fileno() if sock is not None else -1

    def reusable(self) -> bool:
        """An idle connection may take a request: open, and nothing unread on it. The upstream's close
        (EOF), or bytes it sent while idle, may be waiting in the socket not yet read by the event loop:
        such a connection is closed (a request sent on it would get that EOF or those bytes as its
        answer)."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        if self.fd >= 0:
            try:
                readable = select.select([self.fd], [], [], 0)[0]
            except (OSError, ValueError):
                readable = [self.fd]
            if readable:
                self.close()
                return False
        return True

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        resp = self.resp
        if resp is None or self.trailing:  # bytes while idle, or after the final response: not trusted
            self.keep_alive = False
            if resp is None:
                self.close()
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except _PARSE_ERRORS as exc:
            # what this read held before the error goes out first; bytes after a complete final
            # response (garbage, a broken second message) leave that response whole
            resp._after_read()
            if not self.final_done:
                self._fail(UpstreamError("truncated_stream" if resp.status else "unavailable",
                                         f"malformed HTTP response from the upstream: {type(exc).__name__}: {exc}"))
            self.keep_alive = False
            self.close()
            return
        if not self.head_done:
            self.head_bytes += len(data)  # a head arriving in many reads is bounded before it completes
        if self.head_bytes > MAX_HEAD_BYTES or self.head_size > MAX_HEAD_BYTES:
            resp._after_read()
            if not self.final_done:  # (trailers over the bound after a complete response: it stands)
                self._fail(UpstreamError("unavailable", f"the upstream's response head is over {MAX_HEAD_BYTES} bytes"))
            self.keep_alive = False
            self.close()
            return
        resp._after_read()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timers()
        self.client._forget(self)
        resp = self.resp
        if resp is None:
            return
        if resp.status:
            resp._on_fail(UpstreamError("truncated_stream", "the upstream closed the connection mid-body"),
                          clean_eof=exc is None)
        else:
            why = f"{type(exc).__name__}" if exc is not None else "EOF"
            resp._on_fail(UpstreamError("unavailable", f"the upstream closed the connection: {why}",
                                        before_response=not self.got_bytes))

    # -- httptools callbacks (all ignored once the final response is complete) -----------
    def on_message_begin(self) -> None:
        if self.final_done:
            self.trailing = True
            self.keep_alive = False

    def on_status(self, status: bytes) -> None:
        if not self.trailing:
            self.head_size += len(status)
            self._status_reason += status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.trailing:
            assert self.resp is not None
            self.head_size += len(name) + len(value) + 4
            self.resp._header_pairs.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        if self.trailing:
            return
        assert self.resp is not None
        status = int(self.parser.get_status_code())
        if 100 <= status < 200:  # an interim response (100 Continue, 103 Early Hints): the real one follows
            self.interim = True
            self.resp._header_pairs.clear()
            self._status_reason = ""
            return
        self.head_done = True
        if self.head_size > MAX_HEAD_BYTES:  # a head that came in one read: failed after this read
            self.trailing = True  # nothing more of this connection is read
            return
        self.keep_alive = bool(self.parser.should_keep_alive())
        self.resp._on_headers(status, self._status_reason)

    def on_body(self, body: bytes) -> None:
        if not self.trailing:
            assert self.resp is not None
            self.resp._on_body(body)

    def on_message_complete(self) -> None:
        if self.trailing:
            return
        if self.interim:
            self.interim = False
            return
        resp = self.resp
        assert resp is not None
        self.final_done = True
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
        self.interim = self.final_done = self.trailing = self.head_done = False
        self.head_bytes = self.head_size = 0
        self.got_bytes = False
        now = self.last_read = self.loop.time()
        ht = self.client.headers_timeout_s
        self.head_deadline = now + ht if ht is not None else None
        self._arm_watch(now)
        self.transport.write(head + body if body else head)
        return self.resp

    def _arm_watch(self, now: float) -> None:
        """One timer for both bounds: the next moment silence or the headers deadline could expire."""
        due: float | None = None
        rt = self.client.read_timeout_s
        if rt is not None:
            due = self.last_read + rt
        if self.head_deadline is not None and not self.head_done:
            due = self.head_deadline if due is None else min(due, self.head_deadline)
        if due is not None:
            self._watch = self.loop.call_later(max(due - now, 0.001), self._check_timeouts)

    def _check_timeouts(self) -> None:
        self._watch = None
        if self.resp is None:
            return
        now = self.loop.time()
        if self.head_deadline is not None and not self.head_done and now >= self.head_deadline:
            self._fail(UpstreamError("response_timeout", "upstream did not answer in time"))
            self.close()
            return
        rt = self.client.read_timeout_s
        if self.reading_paused:  # the gateway holds reading back: not the upstream's silence
            self.last_read = now
        elif rt is not None and now - self.last_read >= rt:
            self._fail(UpstreamError("response_timeout", f"no data from the upstream for {rt:g} s"))
            self.close()
            return
        self._arm_watch(now)

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
    """Keep-alive HTTP/1.1 connections to upstreams, for the gateway's measured requests. Create and
    use it inside a running event loop; :meth:`close` at the end.

    Args:
        connect_timeout_s: bound on connecting, TLS handshake included (seconds).
        read_timeout_s: bound on silence from the upstream while a response is awaited or read
            (seconds; None: none).
        keepalive_s: how long an idle connection is kept (seconds).
        ssl_context: for ``https://`` upstreams (default: the system's trusted CAs, hostname checked).
        headers_timeout_s: bound on the wait for the response headers once the request is sent
            (seconds; None: none). One timer per request serves both bounds.
    """

    def __init__(self, connect_timeout_s: float = 10.0, read_timeout_s: float | None = None,
                 keepalive_s: float = 4.0, ssl_context: ssl.SSLContext | None = None,
                 headers_timeout_s: float | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.headers_timeout_s = headers_timeout_s
        self.keepalive_s = keepalive_s
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._all: set[_Connection] = set()
        self.retries = 0
        """Requests sent a second time, on a fresh connection, because their reused connection failed
        before any response byte (since the client was made)."""

    async def request(self, method: str, url: URL, headers: CIMultiDict[str], body: bytes = b"") -> UpstreamResponse:
        """Send a request and wait for the response headers.

        ``url``: absolute ``http://`` or ``https://`` URL (its raw path and query are sent as they
        are); ``headers``: sent as given, plus ``Host`` and ``Content-Length`` (set here), and
        ``Authorization: Basic`` from the URL's credentials when ``headers`` has none. Returns the
        response with status and headers; read its body with :meth:`UpstreamResponse.read` or
        :meth:`UpstreamResponse.pump`. A reused connection that fails before any response byte is
        replaced by a fresh one and the request sent again, once (counted in :attr:`retries`).
        Raises :class:`UpstreamError` (``unavailable``, ``response_timeout``: no headers within
        ``headers_timeout_s``, or silence over ``read_timeout_s``).
        """
        if url.scheme not in ("http", "https") or not url.host:
            raise UpstreamError("unavailable", f"unsupported upstream URL {redacted_url(str(url))} (http:// or https://)",
                                True)
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        head = self._head(method, url, headers, len(body))
        conn = self._reuse(key)
        if conn is not None:
            resp = conn.send(head, body)
            try:
                await resp._headers_fut
                return resp
            except UpstreamError as exc:
                resp.close()
                if not (exc.before_response and exc.error_type == "unavailable"):
                    raise
                self.retries += 1  # closed as the request went out: nothing of a reply was read
            except BaseException:
                resp.close()
                raise
        resp = (await self._connect(key)).send(head, body)
        try:
            await resp._headers_fut
        except BaseException:
            resp.close()
            raise
        return resp

    @staticmethod
    def _head(method: str, url: URL, headers: CIMultiDict[str], length: int) -> bytes:
        host = url.raw_host or ""
        if ":" in host:  # an IPv6 literal
            host = f"[{host}]"
        if url.explicit_port:
            host = f"{host}:{url.port}"
        lines = [f"{method} {url.raw_path_qs} HTTP/1.1\r\nHost: {host}\r\n"]
        lines.extend(f"{k}: {v}\r\n" for k, v in headers.items())
        if url.user is not None and "Authorization" not in headers:
            token = base64.b64encode(f"{url.user}:{url.password or ''}".encode()).decode()
            lines.append(f"Authorization: Basic {token}\r\n")
        lines.append(f"Content-Length: {length}\r\n\r\n")
        return "".join(lines).encode("utf-8", "surrogateescape")

    def _reuse(self, key: tuple[str, str, int]) -> _Connection | None:
        """The most recently parked idle connection to ``key`` that may take a request, or None."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.reusable():
                return conn
        return None

    async def _connect(self, key: tuple[str, str, int]) -> _Connection:
        """A new connection to ``key`` (TLS for https). Raises :class:`UpstreamError` ``unavailable``."""
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = {"ssl": self._ssl, "server_hostname": host}
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await loop.create_connection(lambda: _Connection(self, key), host, port, **tls)
        except TimeoutError:
            raise UpstreamError("unavailable", f"cannot connect to {host}:{port}: timed out", True) from None
        except OSError as exc:  # ssl.SSLError included
            raise UpstreamError("unavailable", f"cannot connect to {host}:{port}: {type(exc).__name__}: {exc}",
                                True) from None
        self._all.add(proto)
        return proto

    @property
    def connections(self) -> tuple[int, int]:
        """``(in use, idle)`` connections to the upstreams now (tests check that none is left in use)."""
        idle = sum(len(v) for v in self._idle.values())
        return len(self._all) - idle, idle

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
