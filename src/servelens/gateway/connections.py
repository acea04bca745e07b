"""Client connections against the open-files limit: how many the gateway takes, and what happens past it.

Every stream holds two file descriptors (the client's connection and the upstream's), so the soft
``RLIMIT_NOFILE`` bounds the streams: at the common default of 1024, near 500. The CLI raises the soft
limit to the hard one at start (:func:`servelens.serving.raise_open_files_limit`, as nginx's
``worker_rlimit_nofile``) and the start-up line says the resulting capacity.

Past the limit, ``accept()`` fails with ``EMFILE``, and neither event loop tells the application:

* asyncio (``BaseSelectorEventLoop._accept_connection``) passes the error to the loop's exception
  handler with the message ``socket.accept() out of system resource`` and stops accepting for a second
  (the connection waits in the listen backlog); the default handler logs a traceback per failed call.
* uvloop/libuv (``uv__server_io``) accepts the connection on a reserved descriptor and closes it at once
  (its "EMFILE trick"): the client sees a connection reset and nothing reaches Python at all.

So the gateway does not wait for ``accept()`` to fail: :class:`ConnectionGuard` keeps the client
connections under :attr:`FileBudget.max_connections` (the soft limit, less what was open at start and
:data:`RESERVED_FILES`, halved) and answers a connection over it with a 503 OpenAI error (``Connection:
close``) instead of a reset. Each refusal and each ``EMFILE`` the asyncio loop reports (descriptors can
still run out elsewhere, e.g. the upstream pool) is logged (at most one line per
:data:`LOG_EVERY_S`, with the count since the last) and counted in
``servelens_gateway_accept_failures_total{reason}`` (``connection_limit``, ``open_files``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

from servelens.core.openai import error_body
from servelens.serving import bad_request_reason

log = logging.getLogger("servelens.gateway")

RESERVED_FILES = 64
"""Descriptors kept out of the connection budget: /metrics scrapes, the request log, the model-list
polls, idle upstream connections."""
LOG_EVERY_S = 10.0
"""At most one log line per this many seconds about refused or failed accepts."""
MAX_REQUEST_LINE_BYTES = 8190
"""Longest request line (method, target, version) read; longer: 414 (aiohttp's default, nginx's 8 KiB)."""
MAX_FIELD_BYTES = 16384
"""Longest header line read; longer: 431 (an ``Authorization`` JWT fits many times over)."""
MAX_HEADERS = 100
"""Most header lines read; more: 431 (an SDK sends ~15, proxies add a few)."""
ACCEPT_FAILURE_REASONS = ("connection_limit", "open_files")
"""Label values of ``reason``: refused by the gateway at its budget; ``accept()`` failed (EMFILE/ENFILE)."""


@dataclass(frozen=True)
class FileBudget:
    """The open-files budget of a gateway process.

    Attributes:
        soft, hard: ``RLIMIT_NOFILE`` in force (descriptors).
        at_start: descriptors open when the budget was made.
        max_connections: client connections taken at once (each may hold an upstream connection too),
            at least 1; this is the stream capacity.
    """

    soft: int
    hard: int
    at_start: int
    max_connections: int


def file_budget(soft: int, hard: int, at_start: int) -> FileBudget:
    """The budget for a soft limit ``soft`` with ``at_start`` descriptors already open: two per stream,
    after :data:`RESERVED_FILES`."""
    return FileBudget(soft, hard, at_start, max(1, (soft - at_start - RESERVED_FILES) // 2))


class _Refused(asyncio.Protocol):
    """A connection over the budget: a 503 OpenAI error, then closed once the request came (closing
    before reading it could reset the connection and lose the answer) or after ``linger_s``."""

    def __init__(self, response: bytes, linger_s: float) -> None:
        self._response = response
        self._linger_s = linger_s
        self._transport: Any = None

    def connection_made(self, transport: Any) -> None:  # (uvloop's transports are not asyncio.Transport)
        self._transport = transport
        transport.write(self._response)
        asyncio.get_running_loop().call_later(self._linger_s, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.close()  # what was written goes out first


class ConnectionGuard:
    """Counts accept failures and keeps client connections within a :class:`FileBudget`.

    Args:
        budget: the budget; its ``max_connections`` is the cap.
        linger_s: how long a refused connection is held for its request at most (seconds).
    """

    def __init__(self, budget: FileBudget, linger_s: float = 1.0) -> None:
        self.budget = budget
        self.failures: dict[str, int] = dict.fromkeys(ACCEPT_FAILURE_REASONS, 0)
        """Accept failures by reason (see :data:`ACCEPT_FAILURE_REASONS`), since start."""
        self._linger_s = linger_s
        self._logged_at = -1e18
        self._unlogged = 0
        self._response = _refusal(budget.max_connections)

    def protocol_factory(self, server: web.Server) -> Callable[[], asyncio.BaseProtocol]:
        """``server`` (aiohttp's protocol factory) with the cap in front of it; the connections it takes
        get a :class:`GatewayRequestHandler` (malformed requests answered in the OpenAI format)."""
        live: dict[Any, Any] = getattr(server, "_connections", {})  # aiohttp's open connections
        loop = asyncio.get_running_loop()
        kwargs: dict[str, Any] = getattr(server, "_kwargs", {})  # what aiohttp's Server passes its handlers

        def factory() -> asyncio.BaseProtocol:
            if len(live) >= self.budget.max_connections:
                self.failed("connection_limit")
                return _Refused(self._response, self._linger_s)
            return GatewayRequestHandler(server, loop=loop, **kwargs)

        return factory

    def failed(self, reason: str) -> None:
        """Count one accept failure (``reason`` in :data:`ACCEPT_FAILURE_REASONS`) and log, at most once per
        :data:`LOG_EVERY_S`."""
        self.failures[reason] += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_S:
            return
        b = self.budget
        what = ("refused with 503 at the connection budget" if reason == "connection_limit"
                else "failed: too many open files")
        log.warning("accepting a client connection %s (%d since the last report; %d connections max, open files "
                    "limit %d, hard %d: raise it with ulimit -n or LimitNOFILE=)", what, self._unlogged,
                    b.max_connections, b.soft, b.hard)
        self._logged_at = now
        self._unlogged = 0

    def exception_handler(
        self, previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None
    ) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
        """An event-loop exception handler counting the accept failures asyncio reports (``EMFILE``,
        ``ENFILE``) in place of the default traceback per failed call; other errors go to ``previous``
        (None: the loop's default handler)."""

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE) and \
                    "accept" in str(context.get("message", "")):
                self.failed("open_files")
                return
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        return handler


def _refusal(max_connections: int) -> bytes:
    body = error_body(f"the gateway is at its connection limit ({max_connections}, set by its open-files limit); "
                      "retry later", "server_error", "too_many_connections")
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


class GuardedSite(web.TCPSite):
    """aiohttp's :class:`~aiohttp.web.TCPSite` whose connections go through a :class:`ConnectionGuard`."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, guard: ConnectionGuard, backlog: int,
                 reuse_port: bool = False) -> None:
        super().__init__(runner, host, port, backlog=backlog)
        self._guard = guard
        self._reuse = reuse_port

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.protocol_factory(server), self._host, self._port, backlog=self._backlog,
            reuse_port=self._reuse or None)


class GatewayRequestHandler(RequestHandler):
    """aiohttp's connection handler, with malformed requests (a request line over
    :data:`MAX_REQUEST_LINE_BYTES`, a header over :data:`MAX_FIELD_BYTES`, more than :data:`MAX_HEADERS`
    headers, bad framing) answered with an OpenAI error object (414, 431, 400) and logged in one line that
    quotes none of the request (aiohttp's text reply and log echo part of the offending line: it may be a key).
    Other errors go aiohttp's way."""

    __slots__ = ()

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError) or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        status, code, text = bad_request_reply(exc)
        if isinstance(exc, BadHttpMethod):  # not HTTP at all (TLS to a plain port, a scanner): noise
            self.logger.debug("bad HTTP request from %s: %s", request.remote, text)
        else:
            self.logger.warning("bad HTTP request from %s: %s (%d)", request.remote, text, status)
        resp = web.Response(status=status, body=error_body(text, "invalid_request_error", code),
                            content_type="application/json")
        resp.force_close()
        return resp


def bad_request_reply(exc: HttpProcessingError) -> tuple[int, str, str]:
    """``(status, code, message)`` for a request aiohttp could not parse: 414 ``uri_too_long``, 431
    ``header_too_large`` or ``too_many_headers``, else 400 ``bad_request``. The message names the limit,
    never the request's bytes."""
    if isinstance(exc, LineTooLong):
        limit = exc.args[1] if len(exc.args) > 1 else None
        if limit == MAX_REQUEST_LINE_BYTES:
            return 414, "uri_too_long", f"the request line is over {MAX_REQUEST_LINE_BYTES} bytes"
        return 431, "header_too_large", f"a request header is over {MAX_FIELD_BYTES} bytes"
    reason = bad_request_reason(exc)
    if reason == "Too many headers received":
        return 431, "too_many_headers", f"the request has more than {MAX_HEADERS} headers"
    return 400, "bad_request", f"malformed HTTP request: {reason}"
