"""One upstream response as the gateway reads it: status and headers, then the body held whole
(:meth:`UpstreamResponse.read`) or handed on piece by piece as it is parsed
(:meth:`UpstreamResponse.pump`, the relay's path), and the errors that end it (:class:`UpstreamError`).

The connection (:mod:`servelens.gateway.upstream`) drives it through its ``_on_*`` callbacks from
inside its own ``data_received``; the gateway's request flow and relay use the public methods.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from multidict import CIMultiDict

from servelens.gateway.inflate import DECODED_CODINGS, MAX_INFLATE_BYTES, Inflater

if TYPE_CHECKING:
    from servelens.gateway.upstream import _Connection

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest response body held in memory whole (bytes: a unary reply, an error body); a pumped stream
is not held (it goes to the client as it is read)."""

Sink = Callable[[bytes], None]
"""Receives each body piece as it is parsed (in the connection's callback)."""
Flush = Callable[[], bool]
"""Called once after each read from the upstream that gave body pieces; returns True to pause reading."""


class UpstreamError(Exception):
    """The upstream request failed; ``error_type`` is Dynamo's name for it (``unavailable``,
    ``response_timeout``, ``truncated_stream``, ``backend_error``); ``before_response``: no response
    byte was read."""

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
        "_flush",
        "_fresh",
        "_header_pairs",
        "_headers_fut",
        "_held",
        "_inflate",
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
        self._held = 0  # bytes in _pieces
        self._sink: Sink | None = None
        self._flush: Flush | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._fresh = False  # pieces arrived in this read
        self._ended = False
        self._done = False
        self._paused = False
        self._sized = False  # Content-Length or chunked: EOF before the end is a cut
        self._error: UpstreamError | None = None
        self._inflate: Inflater | None = None  # for a gzip or deflate body
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
        coding = self.headers.get("Content-Encoding", "").strip().lower()
        if coding and coding != "identity":
            if coding not in DECODED_CODINGS:
                self._on_fail(UpstreamError("backend_error", f"the upstream sent its body in Content-Encoding "
                                            f"{coding[:40]!r}, which the gateway did not accept"))
                self._conn.close()
                return
            self._inflate = Inflater(DECODED_CODINGS[coding])
            del self.headers["Content-Encoding"]  # what the client gets is the decoded body
        if not self._headers_fut.done():
            self._headers_fut.set_result(None)

    def _on_body(self, data: bytes) -> None:
        if self._inflate is not None:
            data = self._decoded(data)
            if not data:
                return
        sink = self._sink
        if sink is None:
            self._pieces.append(data)
            self._held += len(data)
            if self._held > MAX_BODY_BYTES:  # not held any longer: the response fails
                self._pieces = []
                self._on_fail(UpstreamError("backend_error",
                                            f"the upstream's response body is over {MAX_BODY_BYTES} bytes"))
                self._conn.close()
        else:
            sink(data)
        self._fresh = True

    def _after_read(self) -> None:
        """One upstream read was parsed: write out (flush) or wake the reader."""
        if not self._fresh:
            return
        self._fresh = False
        flush = self._flush
        if flush is None:
            self._wake()
        elif flush() and not self._paused:
            self._pause()

    def _pause(self) -> None:
        self._paused = True
        self._conn.pause_reading()
        self._wake()

    def _on_end(self) -> None:
        if self._error is not None:
            return  # failed in this read (a body that does not decode, over its bound): it stays failed
        inflate = self._inflate
        if inflate is not None:
            self._inflate = None
            try:
                rest = inflate.finish()
            except zlib.error:
                self._coding_failed("the upstream's compressed body is cut short")
                return
            if rest:
                self._on_body(rest)
        self._ended = True
        self._wake()

    def _decoded(self, data: bytes) -> bytes:
        """A piece of a compressed body, decoded (b"" once the response failed)."""
        assert self._inflate is not None
        try:
            return self._inflate.decode(data)
        except zlib.error as exc:
            self._coding_failed(f"the upstream's compressed body is broken: {exc}")
        except OverflowError:
            self._coding_failed(f"one read of the upstream's compressed body decodes to over {MAX_INFLATE_BYTES} bytes")
        return b""

    def _coding_failed(self, why: str) -> None:
        self._inflate = None
        self._on_fail(UpstreamError("backend_error", why))
        self._conn.close()

    def _on_fail(self, err: UpstreamError, clean_eof: bool = False) -> None:
        if self._ended or self._error is not None:
            return
        if clean_eof and self._headers_fut.done() and not self._sized:
            self._on_end()  # a body delimited by the connection's orderly close: complete (if it decodes)
            return
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

    def take_held(self) -> bytes:
        """The body bytes received so far and not yet read (they are then gone from the response)."""
        held, self._pieces = self._pieces, []
        self._held = 0
        return held[0] if len(held) == 1 else b"".join(held)

    async def pump(self, sink: Sink, flush: Flush, drain: Callable[[], Awaitable[None]]) -> None:
        """Hand every body piece to ``sink`` as it is parsed and call ``flush()`` after each upstream
        read (both in the connection's callback: no task switch); returns when the body ended. When
        ``flush`` returns True, reading from the upstream pauses until ``drain()`` returns. Raises
        :class:`UpstreamError` (cut, silence) and whatever ``drain`` raises."""
        self._sink = sink
        self._flush = flush
        held, self._pieces = self._pieces, []
        self._held = 0
        for piece in held:
            sink(piece)
        if held and flush():
            self._pause()
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
        self._flush = None
        self._conn.release(self._ended and self._error is None)


