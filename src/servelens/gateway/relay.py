"""The relay: a 200 event stream from the upstream to the client, chunk by chunk, measured on the way.

This is the gateway's hot path. :func:`relay_stream` is called by the request flow
(:mod:`servelens.gateway.measured`) once the upstream answered 200 with an event stream; it writes
the response head, then each upstream read, and returns when the stream ended, was cut, or the client
went away. Per read, in the upstream connection's own ``data_received`` callback (no task switch per
chunk):

1. the read goes to the client's transport at once (with the usage the gateway injected cut out,
   when it injected any: :meth:`~servelens.gateway.meter.StreamMeter.relay`);
2. its measurement (:meth:`~servelens.gateway.meter.StreamMeter.measure`: TTFT, ITL, usage) is
   scheduled for after the event loop's turn, with the time it was read, so measuring never delays a
   token of any stream;
3. reading from the upstream pauses while the client's write buffer is over its high-water mark.

Bytes that came with the upstream's headers go out with the client's headers, and the read that
ends the body goes out with the final chunk (one send each). How the stream counts (success,
``truncated_stream``, ``backend_error``, ``cancelled``) is written into the request's
:class:`~servelens.gateway.accounting.Outcome`; the request flow counts it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from servelens.core.state import FrontendState
from servelens.gateway.accounting import Outcome
from servelens.gateway.http import request_gone
from servelens.gateway.meter import StreamMeter
from servelens.gateway.upstream_response import UpstreamError, UpstreamResponse
from servelens.gateway.usage import STRIP_NONE

log = logging.getLogger("servelens.gateway")

_now = time.perf_counter_ns

CLOSING_CHECK_S = 0.05
"""While the relay waits for a slow client to drain, how often it checks that the client is still there
(seconds): a client gone with unread data is noticed within this, and the upstream request closed."""


class _Relayed(web.StreamResponse):
    """The relay's response: the relay sends its head (with the bytes that came with the upstream's
    headers, or alone at once, or with the whole body and the final chunk), not ``prepare()``: aiohttp's
    StreamResponse (3.14) sends its head at ``prepare()``, which made a head and a first read two sends."""

    _send_headers_immediately = False


async def relay_stream(
    request: web.Request, out: Outcome, up: UpstreamResponse, meter: StreamMeter, headers: CIMultiDict[str],
    state: FrontendState,
) -> web.StreamResponse:
    """Relay a 200 stream chunk by chunk, measuring it on the way.

    Each upstream read is metered and written to the client's transport inside the upstream
    connection's callback (no task switch per chunk); reading from the upstream pauses while the
    client's write buffer is over its high-water mark. Bytes that came with the upstream's headers
    go out with the client's headers, and the read that ends the body goes out with the final
    chunk (one send each).
    """
    resp = _Relayed(status=up.status, reason=up.reason, headers=headers)
    strip = meter.strip != STRIP_NONE
    feed = meter.feed

    def metered(t: int, data: bytes) -> bytes:
        """Meter ``data``; the bytes to send for it (injected usage cut out when stripping)."""
        stripped = feed(t, data)  # None when not stripping
        return data if stripped is None else stripped

    out.fail("cancelled", 499)  # until the stream ends one way or the other
    last: list[bytes] = []  # what the read that ended the body gave: sent with the final chunk
    if request.version == aiohttp.HttpVersion11:
        resp.enable_chunked_encoding()  # flush() below writes the chunk frames itself
    else:
        resp.force_close()  # HTTP/1.0: the body ends with the connection (even if keep-alive was asked)
    try:
        await resp.prepare(request)
        writer: Any = getattr(resp, "_payload_writer", None)
        # body bytes that came with the upstream's headers go out with ours, in one send; else
        # the headers go now (aiohttp would hold them until the first body write, and the upstream
        # sent its headers now, e.g. before a long prefill)
        held = up.take_held()
        first = b""
        if held:
            first = metered(_now(), held)
            if up.ended:  # the whole body came with the headers: all of it goes in one send at the end
                last.append(first)
            elif first:
                await resp.write(first)
        if not first and not up.ended:
            send_headers = getattr(writer, "send_headers", None)
            if send_headers is not None:
                send_headers()
    except ConnectionError:
        state.client_disconnected()
        request_gone(request)
        return resp
    except Exception:
        if not resp.prepared:
            raise  # nothing sent yet: the caller answers with a 500 error object
        return _cut_by_a_bug(request, resp, out)  # (metering the bytes that came with the upstream's headers)
    transport = request.transport
    if transport is None or transport.is_closing():
        state.client_disconnected()
        return resp
    # the framing aiohttp chose (chunked for HTTP/1.1; also for a request line saying "HTTP/2.0",
    # which aiohttp's server reads as a version above 1.1)
    chunked = bool(getattr(writer, "chunked", resp.chunked))
    high = transport.get_write_buffer_limits()[1]
    write = transport.write
    buffered = transport.get_write_buffer_size
    closing = transport.is_closing
    relay = meter.relay
    failure: list[BaseException] = []
    pending: list[bytes] = []
    call_soon = asyncio.get_running_loop().call_soon
    measure_due: list[bool] = []  # non-empty while a measurement is scheduled

    def measure() -> None:
        """Measure the reads sent since the last call: scheduled once the event loop's turn has
        written out all it read (every stream's bytes go out before any stream is measured)."""
        measure_due.clear()
        try:
            meter.measure()
        except Exception as exc:  # a bug of ours: the next read stops the relay, which reports it
            failure.append(exc)

    def flush() -> bool:
        """After each upstream read: write what it gave to the client in one send (injected usage
        cut out on the bytes), then schedule its measurement (with this read's time)."""
        try:
            if failure:
                return True
            data = pending[0] if len(pending) == 1 else b"".join(pending)
            pending.clear()
            t = _now()
            if closing():
                failure.append(ConnectionResetError("the client went away"))
                return True
            if up.ended:  # the body ended in this read: the relay sends it and the final chunk at once
                last.append(metered(t, data))
                return False
            if strip:
                data = relay(t, data) or b""
                if data:
                    write(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)
            else:
                write(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)
                relay(t, data)
            if not measure_due:
                measure_due.append(True)
                call_soon(measure)
            return buffered() > high
        except Exception as exc:  # a bug of ours: stop reading, let the relay coroutine report it
            failure.append(exc)
            return True

    async def drain() -> None:
        """Until the client's write buffer is below its low-water mark. A client that closed its
        side while not reading leaves a closing transport whose buffer never drains, and aiohttp
        reports no disconnect until it does: checked every CLOSING_CHECK_S while waiting."""
        if failure:
            raise failure[0]
        if writer is not None:
            await watched(writer.drain(), transport)

    cut: str | None = None
    try:
        try:
            await up.pump(pending.append, flush, drain)
        except UpstreamError as exc:
            # (backend_error: a compressed body that does not decode)
            cut = exc.error_type if exc.error_type in ("response_timeout", "backend_error") else "truncated_stream"
        finally:
            measure()  # what was sent is measured before the request is finished, on every path
        if failure:
            raise failure[0]
        if cut is None:
            last.append(meter.end(_now()) or b"")
    except ConnectionError:  # the client went away (a write failed)
        bug = next((f for f in failure if not isinstance(f, ConnectionError)), None)
        if bug is not None:  # the client left after a measurement failed: still said once
            log.error("internal error measuring a stream", exc_info=bug)
        state.client_disconnected()
        return resp
    except Exception:  # a bug of ours: cut the stream
        return _cut_by_a_bug(request, resp, out)
    out.osl = meter.osl
    out.osl_source = "usage" if meter.osl_from_usage else "chunks"
    out.cached_tokens = meter.cached_tokens
    if cut is not None:
        # an event left unfinished by the cut is not measured: an SSE client drops it too
        out.fail(cut, 200)
        request_gone(request)  # pass the cut on: no final chunk
        return resp
    end = b"".join(last)
    try:
        await watched(resp.write_eof(end), transport)  # the last data and the final chunk in one send
    except ConnectionError:
        if end:  # the end of the stream did not reach the client
            state.client_disconnected()
            return resp
    out.status, out.error_type = meter.outcome()
    out.http_status = 200
    return resp


def _cut_by_a_bug(request: web.Request, resp: web.StreamResponse, out: Outcome) -> web.StreamResponse:
    """A bug of ours once the response was prepared: logged with the exception being handled and counted
    ``internal``; the head goes out if it has not yet (a whole body that came with the upstream's headers
    waits for the end to go with it), then the stream is cut: the client sees a 200 stream cut short, as
    an upstream cut would show (an error response here would be written into the stream)."""
    log.exception("internal error relaying a stream")
    out.fail("internal", 200)
    writer = resp._payload_writer
    if writer is not None:
        with contextlib.suppress(ConnectionError):  # (the client may be gone too)
            writer.send_headers()  # a no-op once the head went out
    request_gone(request)
    return resp


async def watched(coro: Coroutine[Any, Any, None], transport: asyncio.BaseTransport) -> None:
    """Await ``coro`` (aiohttp's ``drain`` or ``write_eof``), run here without a task of its own; while
    it waits for the client to drain, check every CLOSING_CHECK_S that the client is still there:
    aiohttp's drain waits for ever on a client that closed its side and stopped reading, which would
    hold the request uncounted and in flight. Raises ConnectionResetError when the client is gone, and
    what ``coro`` raises."""
    try:
        waiting = coro.send(None)  # usually completes here: nothing to drain
    except StopIteration:
        return
    try:
        while True:
            while not waiting.done():
                await asyncio.wait({waiting}, timeout=CLOSING_CHECK_S)
                if not waiting.done() and transport.is_closing():
                    raise ConnectionResetError("the client went away")
            try:
                waiting = coro.send(None)  # resumes its await on the done future
            except StopIteration:
                return
    finally:
        if not waiting.done():  # given up: cancelled, so asyncio.shield marks aiohttp's inner waiter
            waiting.cancel()    # retrieved (its "Connection lost" would be logged as never retrieved)
        coro.close()


