"""The relay (:func:`servelens.gateway.relay.relay_stream`) driven in-process, send by send (issue 21).

No socket and no server. The client's end of the connection is an in-memory transport under aiohttp's own
response writer and write flow control (:class:`ClientEnd`: each ``write`` is one send, kept; what was sent
stays in its write buffer until the test has the client read it; writing is paused over the high-water mark
and resumed at the low one, as asyncio's socket transports do). The upstream is a real
:class:`~servelens.gateway.upstream_response.UpstreamResponse`, fed read by read as the upstream connection
feeds it (:meth:`Upstream.arrives`), and the relay's clock is a fake one. So every assertion is exact: the
bytes of each send, which read paused the upstream, which measurement took which reads with which times, the
outcome, the counters and the log; nothing depends on timing. Each test takes milliseconds, so mutation
testing of ``relay.py`` runs these first (``scripts/mutation.py relay``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

import pytest
from aiohttp import HttpVersion, HttpVersion10, HttpVersion11, web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from servelens.gateway import relay
from servelens.gateway.accounting import Outcome
from servelens.gateway.meter import StreamMeter
from servelens.gateway.relay import relay_stream
from servelens.gateway.upstream_response import Flush, Sink, UpstreamError, UpstreamResponse
from servelens.gateway.usage import STRIP_ALL, STRIP_NONE
from servelens.prometheus import FrontendMetrics

MS = 1_000_000
GUARD_S = 10.0
"""Bound on every wait, for a hung relay only: each step the relay takes here needs microseconds."""

Trace = list[tuple[Any, ...]]

E1 = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
E2 = b'data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":null}]}\n\n'
E3 = b'data: {"choices":[{"index":0,"delta":{"content":"c"},"finish_reason":"stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"

# the upstream's response headers as the request flow passes them on (its own Date and Server kept)
HEADERS = (("Content-Type", "text/event-stream"), ("X-Custom", "kept"),
           ("Date", "Thu, 01 Jan 2026 00:00:00 GMT"), ("Server", "engine"))
HEAD_FIELDS = (b"Content-Type: text/event-stream\r\nX-Custom: kept\r\nDate: Thu, 01 Jan 2026 00:00:00 GMT\r\n"
               b"Server: engine\r\n")
HEAD = b"HTTP/1.1 200 Fine\r\n" + HEAD_FIELDS + b"Transfer-Encoding: chunked\r\n\r\n"
FINAL = b"0\r\n\r\n"


def frame(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk: its size in hex, CRLF, the data, CRLF."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def test_frame_is_http_chunk_framing() -> None:
    assert frame(E1) == b"4e\r\n" + E1 + b"\r\n" and len(E1) == 78


class ClientEnd(asyncio.Transport):
    """The client's end of the gateway's connection, in memory: each ``write`` is one send (in
    :attr:`sends` and the trace); what was sent stays in the write buffer until :meth:`client_reads`; the
    protocol's writing is paused when the buffer goes over ``high`` and resumed once it is at or below
    ``low``, as asyncio's socket transports do."""

    def __init__(self, trace: Trace, high: int, low: int) -> None:
        super().__init__()
        self.trace = trace
        self.sends: list[bytes] = []
        self.buffered = 0
        self.high = high
        self.low = low
        self.closing = False
        self.protocol: ClientProtocol | None = None
        self._paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        chunk = bytes(data)
        self.sends.append(chunk)
        self.trace.append(("send", chunk))
        self.buffered += len(chunk)
        if self.buffered > self.high and not self._paused and self.protocol is not None:
            self._paused = True
            self.protocol.pause_writing()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(list_of_data))

    def client_reads(self) -> None:
        """The client reads everything sent so far."""
        self.buffered = 0
        if self._paused and self.buffered <= self.low and self.protocol is not None:
            self._paused = False
            self.protocol.resume_writing()

    def close(self) -> None:
        self.trace.append(("close",))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.low, self.high

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class ClientProtocol(BaseProtocol):
    """aiohttp's write flow control (pause and resume writing, ``drain``) on a :class:`ClientEnd`, with what a
    request reads of its protocol; notes each drain that has to wait (``draining``)."""

    ssl_context = None
    peername = ("127.0.0.1", 40000)
    sockname = ("127.0.0.1", 8000)

    def __init__(self, loop: asyncio.AbstractEventLoop, trace: Trace) -> None:
        super().__init__(loop)
        self.trace = trace
        self.draining = asyncio.Event()

    async def _drain_helper(self) -> None:
        if self._paused and self.transport is not None:
            self.trace.append(("drain waits",))
            self.draining.set()
        await super()._drain_helper()


class UpstreamConnection:
    """What an :class:`UpstreamResponse` asks of its connection: the loop, and reading paused and resumed
    (noted in the trace)."""

    def __init__(self, trace: Trace) -> None:
        self.loop = asyncio.get_running_loop()
        self.trace = trace
        self.resumed = asyncio.Event()

    def pause_reading(self) -> None:
        self.trace.append(("upstream paused",))

    def resume_reading(self) -> None:
        self.trace.append(("upstream resumed",))
        self.resumed.set()

    def close(self) -> None:
        self.trace.append(("upstream closed",))

    def release(self, reusable: bool) -> None:
        self.trace.append(("upstream released", reusable))


class Upstream(UpstreamResponse):
    """A real upstream response (200, reason ``Fine``), fed by the test as its connection would feed it; says
    when the relay starts pumping it."""

    __slots__ = ("pumping",)

    def __init__(self, conn: UpstreamConnection) -> None:
        super().__init__(cast(Any, conn))
        self.pumping = asyncio.Event()
        self._header_pairs.extend(HEADERS)
        self._on_headers(200, "Fine")

    async def pump(self, sink: Sink, flush: Flush, drain: Callable[[], Awaitable[None]]) -> None:
        self.pumping.set()
        await super().pump(sink, flush, drain)

    def arrives(self, *pieces: bytes, end: bool = False) -> None:
        """One read from the upstream, as the connection hands it over: each body piece parsed from it (one
        per HTTP chunk), the end of the body when the read held it, then the read's flush."""
        for piece in pieces:
            self._on_body(piece)
        if end:
            self._on_end()
        self._after_read()


class Meter(StreamMeter):
    """A real :class:`StreamMeter` that notes each measurement of queued reads (how many) in the trace.
    ``breaks``: the measurement (1 = the first that had reads to measure) that raises :attr:`bug` after
    measuring, as a bug of ours would; ``broken``: ``"feed"``, ``"relay"`` or ``"end"`` raise it at once instead."""

    __slots__ = ("breaks", "broken", "bug", "failed", "measured", "trace")

    def __init__(self, live: Any, strip: int, trace: Trace, breaks: int = 0, broken: str = "") -> None:
        super().__init__(live, strip)
        self.trace = trace
        self.breaks = breaks
        self.broken = broken
        self.measured = 0
        self.bug = RuntimeError("a bug of ours")
        self.failed = asyncio.Event()

    def measure(self) -> None:
        queued = len(self._queue)
        super().measure()
        if queued:
            self.trace.append(("measure", queued))
            self.measured += 1
            if self.measured == self.breaks:
                self.failed.set()
                raise self.bug

    def feed(self, t_ns: int, data: bytes) -> bytes | None:
        if self.broken == "feed":
            raise self.bug
        return super().feed(t_ns, data)

    def relay(self, t_ns: int, data: bytes) -> bytes | None:
        if self.broken == "relay":
            raise self.bug
        return super().relay(t_ns, data)

    def end(self, t_ns: int) -> bytes | None:
        if self.broken == "end":
            raise self.bug
        return super().end(t_ns)


class Clock:
    """The relay's clock (``relay._now``): returns :attr:`now`, set by the test."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(relay, "_now", c)
    return c


class Relay:
    """One relayed stream: the client's end, the upstream, the meter and the outcome, and the relay running
    between them once :meth:`start` is called. ``held``: body pieces that came with the upstream's
    headers (``ended``: the whole body)."""

    def __init__(self, *, held: tuple[bytes, ...] = (), ended: bool = False,
                 version: HttpVersion = HttpVersion11, strip: int = STRIP_NONE, high: int = 1 << 16,
                 low: int = 0, breaks: int = 0, broken: str = "",
                 headers: tuple[tuple[str, str], ...] = HEADERS) -> None:
        loop = asyncio.get_running_loop()
        self.trace: Trace = []
        self.client = ClientEnd(self.trace, high, low)
        self.protocol = ClientProtocol(loop, self.trace)
        self.protocol.connection_made(self.client)
        self.client.protocol = self.protocol
        self.request = make_mocked_request("POST", "/v1/chat/completions", version=version, protocol=self.protocol,
                                           transport=self.client, writer=StreamWriter(self.protocol, loop))
        self.metrics = FrontendMetrics(isl_buckets="512,1024")
        self.metrics.register_model("m")
        live = self.metrics.begin("m", "chat_completions", "stream", arrival_ns=0)
        self.meter = Meter(live, strip, self.trace, breaks, broken)
        self.conn = UpstreamConnection(self.trace)
        self.upstream = Upstream(self.conn)
        for piece in held:
            self.upstream._on_body(piece)
        if ended:
            self.upstream._on_end()
        self.headers = CIMultiDict(headers)
        self.out = Outcome()
        self.task: asyncio.Task[web.StreamResponse] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(relay_stream(self.request, self.out, self.upstream, self.meter, self.headers,
                                                     self.metrics.state))

    async def until(self, event: asyncio.Event) -> None:
        """Until ``event`` is set; fails at once when the relay ended first (with its error, if it raised)."""
        assert self.task is not None
        waiter = asyncio.ensure_future(event.wait())
        try:
            async with asyncio.timeout(GUARD_S):
                await asyncio.wait({waiter, self.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not event.is_set():
            self.task.result()
            raise AssertionError("the relay returned before the awaited step")

    async def pumping(self) -> None:
        """Until the relay pumps the upstream (it sent what it had to before)."""
        await self.until(self.upstream.pumping)

    async def done(self) -> web.StreamResponse:
        assert self.task is not None
        async with asyncio.timeout(GUARD_S):
            return await self.task

    @property
    def disconnected(self) -> int:
        return self.metrics.state.disconnected_clients

    @property
    def times_ns(self) -> list[int]:
        """The output chunks' arrival times as measured."""
        return list(self.meter.live.timer.times_ns)


async def loop_turn() -> None:
    """Until the callbacks scheduled so far have run (the loop runs them in order: ours comes after them)."""
    turned = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(turned.set_result, None)
    async with asyncio.timeout(GUARD_S):
        await turned


def success(osl: int) -> Outcome:
    """A stream counted success, its OSL from the output chunks counted (no usage in it)."""
    return Outcome(status="success", error_type="", http_status=200, osl=osl, osl_source="chunks")


CANCELLED = Outcome(status="error", error_type="cancelled", http_status=499)


# -- the head, the reads, the end --------------------------------------------------------------------------


async def test_head_goes_out_at_once_then_each_read_is_one_chunk_and_the_last_goes_with_the_final_chunk(
        clock: Clock) -> None:
    r = Relay()
    r.start()
    await r.pumping()
    assert r.client.sends == [HEAD]  # no body byte came yet: the head goes now (a long prefill may follow)
    clock.now = 5 * MS
    r.upstream.arrives(E1)
    assert r.client.sends[-1] == frame(E1)  # sent within the read, before any measurement
    await loop_turn()
    clock.now = 7 * MS
    r.upstream.arrives(E2[:30], E2[30:])  # two pieces parsed from one read (two HTTP chunks): one send
    await loop_turn()
    clock.now = 9 * MS
    r.upstream.arrives(E3, DONE, end=True)
    await r.done()
    assert r.trace == [("send", HEAD), ("send", frame(E1)), ("measure", 1), ("send", frame(E2)), ("measure", 1),
                       ("measure", 1), ("send", frame(E3 + DONE) + FINAL)]
    assert r.out == success(3)
    assert r.times_ns == [5 * MS, 7 * MS, 9 * MS]
    assert r.disconnected == 0 and not r.client.closing


async def test_bytes_that_came_with_the_headers_go_out_with_the_head_in_one_send(clock: Clock) -> None:
    clock.now = 3 * MS
    r = Relay(held=(E1[:20], E1[20:]))
    r.start()
    await r.pumping()
    assert r.client.sends == [HEAD + frame(E1)]
    clock.now = 8 * MS
    r.upstream.arrives(E3 + DONE, end=True)
    await r.done()
    assert r.trace == [("measure", 1), ("send", HEAD + frame(E1)), ("measure", 1),
                       ("send", frame(E3 + DONE) + FINAL)]
    assert r.out == success(2)
    assert r.times_ns == [3 * MS, 8 * MS]


@pytest.mark.parametrize(("held", "outcome"), [
    ((E1, E3, DONE), success(2)),
    ((), Outcome(status="error", error_type="truncated_stream", http_status=200, osl=0, osl_source="chunks")),
])
async def test_a_whole_body_that_came_with_the_headers_goes_out_in_one_send(
        clock: Clock, held: tuple[bytes, ...], outcome: Outcome) -> None:
    clock.now = 4 * MS
    r = Relay(held=held, ended=True)
    r.start()
    await r.done()
    body = b"".join(held)
    assert r.client.sends == [HEAD + (frame(body) if body else b"") + FINAL]
    assert r.out == outcome
    assert r.times_ns == ([4 * MS, 4 * MS] if held else [])
    assert ("upstream paused",) not in r.trace


async def test_last_event_without_its_blank_line_is_measured_at_the_end(clock: Clock) -> None:
    r = Relay()
    r.start()
    await r.pumping()
    clock.now = 2 * MS
    r.upstream.arrives(E1)
    clock.now = 6 * MS
    r.upstream.arrives(E3[:-1], end=True)  # the body ends one line end short: the event is still read
    await r.done()
    assert r.client.sends == [HEAD, frame(E1), frame(E3[:-1]) + FINAL]
    assert r.out == success(2)
    assert r.times_ns == [2 * MS, 6 * MS]


@pytest.mark.parametrize("strip", [STRIP_NONE, STRIP_ALL])
async def test_http10_client_gets_the_body_unframed_and_its_end_by_close(clock: Clock, strip: int) -> None:
    r = Relay(version=HttpVersion10, strip=strip)
    r.start()
    await r.pumping()
    clock.now = 1 * MS
    r.upstream.arrives(E1)
    await loop_turn()
    clock.now = 2 * MS
    r.upstream.arrives(E3 + DONE, end=True)
    resp = await r.done()
    assert r.client.sends == [b"HTTP/1.0 200 Fine\r\n" + HEAD_FIELDS + b"\r\n", E1, E3 + DONE]
    assert resp.keep_alive is False  # HTTP/1.0 without a length: the body ends with the connection
    assert r.out == success(2)


async def test_request_line_saying_http_2_gets_the_chunked_framing_aiohttp_chose(clock: Clock) -> None:
    r = Relay(version=HttpVersion(2, 0))
    r.start()
    await r.pumping()
    r.upstream.arrives(E1)
    await loop_turn()
    r.upstream.arrives(E3 + DONE, end=True)
    await r.done()
    head = b"HTTP/2.0 200 Fine\r\n" + HEAD_FIELDS + b"Transfer-Encoding: chunked\r\n\r\n"
    assert r.client.sends == [head, frame(E1), frame(E3 + DONE) + FINAL]
    assert r.out == success(2)


# injected usage (STRIP_ALL: the client asked for none): cut out of each chunk, the usage-only chunk dropped
U1 = (b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],'
      b'"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}\n\n')
U2 = (b'data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}],'
      b'"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}\n\n')
U_ONLY = (b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,'
          b'"prompt_tokens_details":{"cached_tokens":4}}}\n\n')
U1_SENT = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
U2_SENT = b'data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}\n\n'


async def test_injected_usage_is_cut_out_and_a_split_event_goes_out_whole(clock: Clock) -> None:
    clock.now = 1 * MS
    r = Relay(strip=STRIP_ALL, held=(U1,))
    r.start()
    await r.pumping()
    assert r.client.sends == [HEAD + frame(U1_SENT)]
    clock.now = 3 * MS
    r.upstream.arrives(U2[:40])  # half an event: nothing to send yet
    await loop_turn()
    assert len(r.client.sends) == 1
    clock.now = 5 * MS
    r.upstream.arrives(U2[40:])
    await loop_turn()
    assert r.client.sends[-1] == frame(U2_SENT)
    clock.now = 6 * MS
    r.upstream.arrives(U_ONLY + DONE[:-2], end=True)  # [DONE] one blank line short: held until the end
    await r.done()
    assert r.client.sends == [HEAD + frame(U1_SENT), frame(U2_SENT), frame(DONE[:-2]) + FINAL]
    assert r.out == Outcome(status="success", error_type="", http_status=200, osl=2, osl_source="usage",
                            cached_tokens=4)
    assert r.times_ns == [1 * MS, 5 * MS]


# -- the client going away --------------------------------------------------------------------------------


async def test_client_gone_before_the_head_is_cancelled_and_its_connection_closed() -> None:
    r = Relay()
    r.client.closing = True
    r.start()
    await r.done()
    assert r.client.sends == [] and r.trace == [("close",)]
    assert r.out == CANCELLED and r.disconnected == 1


async def test_client_connection_lost_before_a_whole_body_is_sent_is_cancelled(clock: Clock) -> None:
    r = Relay(held=(E1, E3, DONE), ended=True)
    r.protocol.connection_lost(None)
    r.start()
    await r.done()
    assert r.client.sends == [] and ("close",) not in r.trace
    assert r.out == CANCELLED and r.disconnected == 1


async def test_client_gone_mid_stream_stops_the_relay_at_the_next_read(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    r = Relay()
    r.start()
    await r.pumping()
    r.upstream.arrives(E1)
    await loop_turn()
    r.client.close()  # the client went away
    r.upstream.arrives(E2)
    assert r.trace[-2:] == [("close",), ("upstream paused",)]  # E2 not sent, reading stopped in that read
    await r.done()
    assert r.trace == [("send", HEAD), ("send", frame(E1)), ("measure", 1), ("close",), ("upstream paused",)]
    assert r.out == CANCELLED and r.disconnected == 1
    assert [rec for rec in caplog.records if rec.levelno >= logging.WARNING] == []


# -- back-pressure -----------------------------------------------------------------------------------------


async def test_reading_pauses_only_over_the_high_water_mark_and_resumes_once_the_client_read(clock: Clock) -> None:
    r = Relay(high=len(frame(E1)))
    r.start()
    await r.pumping()
    r.client.client_reads()  # the head
    r.upstream.arrives(E1)  # the buffer at the mark exactly: not over it
    await loop_turn()
    r.upstream.arrives(E2)  # over it
    await r.until(r.protocol.draining)
    assert r.trace == [("send", HEAD), ("send", frame(E1)), ("measure", 1), ("send", frame(E2)), ("upstream paused",),
                       ("measure", 1), ("drain waits",)]
    r.client.client_reads()
    await r.until(r.conn.resumed)
    r.upstream.arrives(DONE, end=True)  # under the mark again
    await r.done()
    assert r.trace[7:] == [("upstream resumed",), ("measure", 1), ("send", frame(DONE) + FINAL)]
    assert r.out == success(2)


async def test_client_that_stops_reading_and_closes_is_noticed_while_the_relay_waits(clock: Clock) -> None:
    reported: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))
    try:
        r = Relay(high=10)
        r.start()
        await r.pumping()
        r.upstream.arrives(E1)
        await r.until(r.protocol.draining)
        r.client.close()  # closed its side, its buffer never drains: noticed within CLOSING_CHECK_S
        await r.done()
        assert r.out == CANCELLED and r.disconnected == 1
        assert r.trace[-2:] == [("drain waits",), ("close",)]
        # the connection then goes: aiohttp fails its drain waiter, which the relay gave up on (retrieved)
        r.protocol.connection_lost(ConnectionResetError("reset"))
        await loop_turn()
        gc.collect()
        assert reported == []
    finally:
        loop.set_exception_handler(None)


async def test_final_send_waiting_for_the_client_completes_when_it_reads_everything_and_closes(clock: Clock) -> None:
    r = Relay(high=10)
    r.start()
    await r.pumping()
    r.client.client_reads()
    r.upstream.arrives(E1 + E3 + DONE, end=True)
    await r.until(r.protocol.draining)
    r.client.client_reads()  # it got the end of the stream, then closed
    r.client.close()
    await r.done()
    assert r.client.sends == [HEAD, frame(E1 + E3 + DONE) + FINAL]
    assert r.out == success(2) and r.disconnected == 0


async def test_client_that_closes_while_the_final_send_waits_is_counted_gone(clock: Clock) -> None:
    r = Relay(high=10)
    r.start()
    await r.pumping()
    r.client.client_reads()
    r.upstream.arrives(E1 + E3 + DONE, end=True)
    await r.until(r.protocol.draining)
    r.client.close()  # closed its side without reading the end: noticed within CLOSING_CHECK_S
    await r.done()
    assert r.client.sends == [HEAD, frame(E1 + E3 + DONE) + FINAL] and r.trace[-2:] == [("drain waits",), ("close",)]
    # counted cancelled, with the OSL the stream had when its end was sent
    assert r.out == Outcome(status="error", error_type="cancelled", http_status=499, osl=2, osl_source="chunks")
    assert r.disconnected == 1


# -- the upstream cutting the stream -----------------------------------------------------------------------


@pytest.mark.parametrize(("error_type", "counted"), [
    ("truncated_stream", "truncated_stream"),
    ("unavailable", "truncated_stream"),  # (a head over its bound in the trailers) a cut all the same
    ("response_timeout", "response_timeout"),
    ("backend_error", "backend_error"),
])
async def test_upstream_cut_is_passed_on_without_the_final_chunk(clock: Clock, error_type: str, counted: str) -> None:
    r = Relay()
    r.start()
    await r.pumping()
    r.upstream.arrives(E1)
    r.upstream._on_fail(UpstreamError(error_type, "cut"))
    await r.done()
    assert r.client.sends == [HEAD, frame(E1)] and r.trace[-1] == ("close",)
    assert r.out == Outcome(status="error", error_type=counted, http_status=200, osl=1, osl_source="chunks")
    assert r.disconnected == 0


# -- bugs of ours ------------------------------------------------------------------------------------------


def internal_errors(caplog: pytest.LogCaptureFixture) -> list[tuple[str, BaseException | None]]:
    """The gateway's error records: (message, the exception logged with it)."""
    return [(rec.getMessage(), rec.exc_info[1] if rec.exc_info else None)
            for rec in caplog.records if rec.name == "servelens.gateway" and rec.levelno >= logging.ERROR]


INTERNAL = Outcome(status="error", error_type="internal", http_status=200)


async def test_measurement_bug_stops_the_relay_at_the_next_read(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    r = Relay(breaks=1)
    r.start()
    await r.pumping()
    r.upstream.arrives(E1)
    await loop_turn()  # its measurement fails
    r.upstream.arrives(E2)
    assert r.trace[-1] == ("upstream paused",)  # E2 not sent, reading stopped in that read
    await r.done()
    assert r.trace == [("send", HEAD), ("send", frame(E1)), ("measure", 1), ("upstream paused",), ("close",)]
    assert r.out == INTERNAL and r.disconnected == 0
    assert internal_errors(caplog) == [("internal error relaying a stream", r.meter.bug)]


async def test_measurement_bug_found_once_the_body_ended_cuts_the_stream(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    r = Relay(breaks=1)
    r.start()
    await r.pumping()
    r.upstream.arrives(E1)
    r.upstream.arrives(end=True)  # the body's end in a read of its own (a last empty chunk): no flush
    await r.done()
    assert r.client.sends == [HEAD, frame(E1)] and r.trace[-1] == ("close",)
    assert r.out == INTERNAL
    assert internal_errors(caplog) == [("internal error relaying a stream", r.meter.bug)]


async def test_bug_relaying_a_read_stops_reading_in_that_read(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    r = Relay(broken="relay")
    r.start()
    await r.pumping()
    r.upstream.arrives(E1)
    assert r.trace == [("send", HEAD), ("send", frame(E1)), ("upstream paused",)]
    await r.done()
    assert r.trace[3:] == [("close",)]
    assert r.out == INTERNAL
    assert internal_errors(caplog) == [("internal error relaying a stream", r.meter.bug)]


@pytest.mark.parametrize("client_gone", [False, True])
async def test_bug_metering_the_bytes_that_came_with_the_headers_sends_the_head_and_cuts_the_stream(
        clock: Clock, caplog: pytest.LogCaptureFixture, client_gone: bool) -> None:
    r = Relay(held=(E1,), broken="feed")
    r.client.closing = client_gone
    r.start()
    await r.done()
    # the head had not gone out (it waited for those bytes): the client sees a 200 stream cut short
    assert r.trace == ([] if client_gone else [("send", HEAD)]) + [("close",)]
    assert r.out == INTERNAL and r.disconnected == 0
    assert internal_errors(caplog) == [("internal error relaying a stream", r.meter.bug)]


async def test_bug_at_the_end_of_a_whole_body_that_came_with_the_headers_sends_the_head_and_cuts_the_stream(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    r = Relay(held=(E1, E3, DONE), ended=True, broken="end")
    r.start()
    await r.done()
    assert r.trace == [("measure", 1), ("send", HEAD), ("close",)]
    assert r.out == INTERNAL
    assert internal_errors(caplog) == [("internal error relaying a stream", r.meter.bug)]


async def test_measurement_bug_then_the_client_leaving_is_logged_once(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    # the only way to both: a first read over aiohttp's 64 KiB write limit waits for the client inside the
    # response's write; a read arriving meanwhile is pumped as held, its measurement comes after the relay
    # started to wait for the client, and the client then leaves
    big = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 70_000 + b'"},"finish_reason":null}]}\n\n'
    r = Relay(held=(big,), high=1000, breaks=2)
    r.start()
    await r.until(r.protocol.draining)
    r.protocol.draining.clear()
    r.upstream.arrives(E2 * 20)
    r.client.client_reads()
    await r.until(r.meter.failed)
    r.client.close()
    await r.done()
    assert r.client.sends == [HEAD + frame(big), frame(E2 * 20)]
    assert r.out == CANCELLED and r.disconnected == 1
    assert internal_errors(caplog) == [("internal error measuring a stream", r.meter.bug)]
