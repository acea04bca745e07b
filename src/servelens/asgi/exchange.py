"""One measured request inside the app: the ``send`` the app answers through, measuring on the way.

The app's messages go to the server as they come, each at once; what the middleware added to the
request (usage) is cut out of the bytes first, by the gateway's own
:class:`~servelens.gateway.meter.StreamMeter`, so the client gets the bytes the app would have sent
it. The time of a chunk is when the app hands it to ``send``, the in-process twin of the gateway's
read time; the request's arrival is when the middleware was called with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from servelens.core.openai import parse_response
from servelens.core.state import LiveRequest
from servelens.core.status import UNKNOWN_MODEL, error_type_for_status
from servelens.gateway.accounting import Accounting, Outcome
from servelens.gateway.meter import StreamMeter
from servelens.gateway.usage import STRIP_NONE, Injection
from servelens.prometheus import FrontendMetrics

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

_now = time.perf_counter_ns
REJECTED = (400, 422)
"""Statuses of an app refusing a request's content (OpenAI's and vLLM's 400, FastAPI's 422)."""


class Exchange:
    """The ``send`` of one measured request (:meth:`send`), and how it ended (:meth:`finish`).

    Args:
        metrics, accounting: where the request is counted (once, by :meth:`finish`).
        endpoint: ``chat_completions`` or ``completions``.
        model: the request's ``model`` (None: the body named none; counted as ``unknown_model``).
        stream_asked: the request asked for a stream (its ``stream`` true as pydantic reads it: ``"true"``, ``1``).
        arrival_ns: when the middleware was called (``time.perf_counter_ns``).
        inj: what was added to the request (its ``strip`` says what to cut from the stream).
        send: the server's ``send``.
        hold_rejection: hold a 400/422 answer back (the caller may resend without what it added).
        register: register ``model`` before counting a 2xx answer (the model is then known to serve).
    """

    def __init__(
        self, metrics: FrontendMetrics, accounting: Accounting, endpoint: str, model: str | None,
        stream_asked: bool, arrival_ns: int, inj: Injection, send: Send, hold_rejection: bool,
        register: Callable[[str], None],
    ) -> None:
        self.metrics = metrics
        self.accounting = accounting
        self.endpoint = endpoint
        self.model = model
        self.stream_asked = stream_asked
        self.arrival_ns = arrival_ns
        self.inj = inj
        self._send = send
        self._hold = hold_rejection
        self._register = register
        self.out = Outcome()
        self.live: LiveRequest | None = None
        self.meter: StreamMeter | None = None
        self.status: int | None = None
        self.ended = False
        """The app sent its last body message."""
        self.disconnected = False
        """The server told the app that the client went away."""
        self.left_before_end = False
        """The client went away before the app's last body message (:class:`ClientWatch` heard it)."""
        self._ending = False  # the app's last body message is being sent
        self.held: list[Message] | None = None
        """A held 400/422 answer: its messages, not sent yet."""
        self._body: list[bytes] | None = None  # a whole 200 reply, for its usage
        self.request_type = "stream" if stream_asked else "unary"

    async def send(self, message: Message) -> None:
        """The app's ``send``: measure, cut injected usage, pass on."""
        t = _now()
        meter = self.meter
        if meter is not None and message["type"] == "http.response.body":  # the per-token path
            data = message.get("body", b"")
            more = message.get("more_body", False)
            self._ending = not more
            if meter.strip != STRIP_NONE:
                cut = meter.relay(t, data) or b""
                if not more:
                    cut += meter.end(t) or b""
                if cut or not more:
                    await self._out({"type": "http.response.body", "body": cut, "more_body": more})
                self.ended = not more
                meter.measure()
                return
            await self._out(message)
            meter.relay(t, data)
            if more:
                meter.measure()
            else:
                meter.end(t)
                self.ended = True
            return
        kind = message["type"]
        if kind == "http.response.start":
            self._start(message)
        elif kind == "http.response.body":
            if not message.get("more_body", False):
                self.ended = self._ending = True
            if self._body is not None:
                self._body.append(message.get("body", b""))
        if self.held is not None:
            self.held.append(message)
            return
        await self._out(message)

    def client_left(self) -> None:
        """The server said the client went away (``http.disconnect``, heard by :class:`ClientWatch`):
        before the app's last body message, the request is ``cancelled`` however the app's answer ends
        (uvicorn drops what an app sends after the client left, without an error)."""
        self.disconnected = True
        if not self._ending and not self.ended:
            self.left_before_end = True

    async def _out(self, message: Message) -> None:
        """The server's ``send``; one that raises (the client went away: uvicorn's ``ClientDisconnected``,
        an ``OSError``) marks the request :attr:`disconnected` (Starlette may turn it into its own error)."""
        try:
            await self._send(message)
        except (Exception, asyncio.CancelledError):
            self.disconnected = True
            raise

    def _start(self, message: Message) -> None:
        status = int(message["status"])
        self.status = status
        if self._hold and status in REJECTED:
            self.held = []
            return
        headers = message.get("headers") or []
        ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"").lower()
        stream = ctype.startswith(b"text/event-stream")
        self._begin("stream" if stream or (self.stream_asked and status != 200) else "unary", status)
        if status == 200 and stream and self.live is not None:
            self.meter = StreamMeter(self.live, self.inj.strip)
            if self.inj.strip != STRIP_NONE:  # bytes will be cut: no length (an event stream has none anyway)
                message["headers"] = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        elif status == 200:
            self._body = []

    def _begin(self, request_type: str, status: int) -> None:
        self.request_type = request_type
        if self.model is not None and 200 <= status < 300:
            self._register(self.model)
        # a model not registered (none named, one the app does not serve, past the models learned):
        # measured all the same and counted under unknown_model, with its outcome
        self.live = self.metrics.begin(self.model or UNKNOWN_MODEL, self.endpoint, request_type, self.arrival_ns)

    async def release(self) -> None:
        """Send a held answer as it came (the resend was not needed, or not possible)."""
        held, self.held = self.held, None
        self._hold = False
        if held:
            self._start(held[0])
            for m in held:
                await self._out(m)

    def finish(self, error: BaseException | None = None) -> None:
        """Count the request once: how the app's answer ended (``error``: what the app or the server's
        ``send`` raised, if anything)."""
        out = self.out
        if self.status is None:  # no answer started: the client left, or the app raised
            if self.disconnected or isinstance(error, OSError | asyncio.CancelledError):
                self.metrics.state.client_disconnected()
                self._count_without_answer("cancelled", 499)
            else:
                self._count_without_answer("internal", 500)
            return
        meter = self.meter
        if meter is not None:
            out.osl = meter.osl
            out.osl_source = "usage" if meter.osl_from_usage else "chunks"
            out.cached_tokens = meter.cached_tokens
            if self.ended and not self.left_before_end:
                out.status, out.error_type = meter.outcome()
                out.http_status = 200
            elif self.disconnected or isinstance(error, OSError | asyncio.CancelledError):
                self.metrics.state.client_disconnected()
                out.fail("cancelled", 499)
            else:
                out.fail("internal" if error is not None else "truncated_stream", 200)
        elif self.status == 200 and self.left_before_end:
            self.metrics.state.client_disconnected()
            out.fail("cancelled", 499)
        elif self.status == 200 and self._body is not None:
            info = parse_response(b"".join(self._body))
            if not self.ended or info.error is not None or info.malformed:
                out.fail("backend_error" if self.ended else "truncated_stream", 200)
            else:
                out.status, out.error_type, out.http_status = "success", "", 200
                usage = info.usage
                if usage is not None and self.live is not None:
                    if usage.prompt_tokens is not None:
                        self.live.set_isl(usage.prompt_tokens, "final_usage")
                    out.osl = usage.completion_tokens
                    out.cached_tokens = usage.cached_tokens
        else:
            out.fail(error_type_for_status(self.status), self.status)
        if self.live is not None:
            self.accounting.finish(self.live, out)
        else:
            self.accounting.rejected(self.endpoint, self.request_type, out.error_type or "validation",
                                     self.arrival_ns)

    def _count_without_answer(self, error_type: str, http_status: int) -> None:
        self._begin("stream" if self.stream_asked else "unary", http_status)
        self.out.fail(error_type, http_status)
        if self.live is not None:
            self.accounting.finish(self.live, self.out)
        else:
            self.accounting.rejected(self.endpoint, self.request_type, error_type, self.arrival_ns)



class ClientWatch:
    """The client's side of one measured request once its body was read: hears ``http.disconnect``
    whether or not the app asks for it.

    After the request body, the only message an ASGI server sends is ``http.disconnect`` (uvicorn also
    answers it once the response is complete). An app that streams without reading ``receive`` (a raw
    ASGI app; Starlette's ``StreamingResponse`` does read it) never learns that the client left, and
    uvicorn drops what it sends then without an error: the stream would end as a success. So the
    middleware reads the server's ``receive`` itself, in a task started once the body was read
    (:meth:`start`), and tells the current :class:`Exchange` (:meth:`Exchange.client_left`). The app's
    own calls after its body (:meth:`receive`) get the message that task read, the same one to every
    call (after ``http.disconnect`` every ``receive`` answers it again), so the server's ``receive`` is
    never awaited twice at once. The app is not stopped: one that does not listen runs to its end,
    counted ``cancelled``.

    Args:
        receive: the server's ``receive``, its body already read.
    """

    def __init__(self, receive: Callable[[], Awaitable[Message]]) -> None:
        self._receive = receive
        self._task: asyncio.Future[Message] | None = None
        self.exchange: Exchange | None = None
        """Told when the client leaves (the request's current call of the app)."""

    def start(self) -> None:
        """Begin listening (once, after the body was read)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._receive())
            self._task.add_done_callback(self._heard)

    def _heard(self, task: asyncio.Future[Message]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        if task.result().get("type") == "http.disconnect" and self.exchange is not None:
            self.exchange.client_left()

    async def receive(self) -> Message:
        """What the server said after the body (the app's ``receive`` then). Raises what the server's
        ``receive`` raised."""
        self.start()
        task = self._task
        assert task is not None
        message = await asyncio.shield(task)  # an app cancelling its own wait leaves the listener running
        if message.get("type") != "http.disconnect":  # not expected after the body: handed on once
            self._task = None
        return message

    def close(self) -> None:
        """The request is over: stop listening (a listener still waiting is cancelled)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
