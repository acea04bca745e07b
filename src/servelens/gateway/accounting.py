"""How the gateway counts a measured request: once, in ``requests_total``, with its outcome.

Every request to a measured endpoint (``POST /v1/chat/completions``, ``POST /v1/completions``) ends
in exactly one of two calls:

* :meth:`Accounting.rejected`: it failed before its model was known (an unreadable or invalid body,
  an unknown model, the client leaving while sending its body): counted under
  ``model="unknown_model"`` with its duration, as Dynamo's frontend does; it gets no ISL bucket.
* :meth:`Accounting.finish`: it had a model, so it was begun as a
  :class:`~servelens.core.state.LiveRequest`; the :class:`Outcome` filled in along the way says how it
  ended, and the request's record is merged into the histograms once, here (and written to the
  request log, when one is kept).

Outcomes, counted once each in ``requests_total`` (Dynamo's ``error_type`` vocabulary): a body that cannot be
read (a gzip or deflate ``Content-Encoding`` the body does not match, broken chunked framing), invalid JSON
(nesting too deep included), a missing ``model`` or a ``stream`` that pydantic would not read as a boolean
(``"true"`` and ``1`` are one) -> 400 ``validation``; body over ``max_body_bytes`` -> 413 ``validation``; a
body that stops arriving for ``client_timeout_s`` -> 408 ``validation``; unknown model -> 404 ``not_found``
under ``model="unknown_model"`` (502 ``unavailable`` there when the upstream's model list cannot be fetched);
upstream unreachable -> 502 ``unavailable``; no response headers (or body, for unary) within
``response_timeout_s``, or silence over ``read_timeout_s`` -> 504 ``response_timeout``; a unary or error body
over :data:`~servelens.gateway.upstream_response.MAX_BODY_BYTES` -> 502 ``backend_error``; upstream 400/4xx ->
``validation``, 404 -> ``not_found``, 429 and 503 -> ``overload``, other 5xx -> ``backend_error`` (the
upstream's status and body are relayed); an in-stream error (an ``error`` object, ``"object": "error"``, an
SSE ``event: error``) or a malformed chunk inside a 200 stream, a 200 stream that produced nothing (``[DONE]``
alone, a role-only chunk; docs/counting.md), or a body in a content coding other than gzip or deflate (which
are decoded) or that does not decode -> ``backend_error`` (a whole ``application/json`` or ``text/html`` reply
to a stream request is measured as a unary reply); a stream ending with neither ``finish_reason`` nor
``[DONE]``, or cut by the upstream -> ``truncated_stream`` (a cut is passed on: the client connection is
closed without the final chunk); the client going away -> ``cancelled`` (the upstream request is closed at
once, so the engine stops generating); a bug of ours -> 500 ``internal``. A request head aiohttp cannot read
(414, 431, 400: :mod:`.connections`; a ``Content-Encoding`` it cannot decode at all, ``br`` without the Brotli
package or ``zstd``, is refused with the head too, 400 ``bad_request``) and a connection over the open-files
budget (503) are answered before any route, so they name no endpoint and are not in ``requests_total``: the
latter are counted in ``servelens_gateway_accept_failures_total``.

Also here: how many measured requests are being answered now (:attr:`Accounting.active`, waited on
at shutdown) and a waiter on the count (:meth:`Accounting.wait_finished`, for tests).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from servelens.core.state import LiveRequest
from servelens.core.timing import RequestRecord
from servelens.gateway.requestlog import RequestLog, RequestLogEntry
from servelens.prometheus import FrontendMetrics

log = logging.getLogger("servelens.gateway")

_now = time.perf_counter_ns


@dataclass
class Outcome:
    """Mutable result of one measured request, filled in as it goes (the one value that is not
    frozen: the request flow and the relay write it, :meth:`Accounting.finish` reads it once)."""

    status: str = "error"
    error_type: str = "internal"
    http_status: int = 500
    upstream_request_id: str | None = None
    osl: int | None = None
    osl_source: str = "usage"
    cached_tokens: int | None = None
    isl_source: str = "unknown"

    def fail(self, error_type: str, http_status: int) -> None:
        """Mark the request failed with Dynamo's ``error_type`` and the HTTP status the client got."""
        self.status = "error"
        self.error_type = error_type
        self.http_status = http_status


class Accounting:
    """Counts the gateway's measured requests: each once, with its outcome.

    Args:
        metrics: where requests are counted and their records merged.
        request_log: one JSON line per finished request (None: no log).
    """

    def __init__(self, metrics: FrontendMetrics, request_log: RequestLog | None) -> None:
        self.metrics = metrics
        self.request_log = request_log
        self.finished_total = 0
        """Requests to the measured endpoints counted in ``requests_total`` so far."""
        self.active = 0
        """Requests to the measured endpoints being answered now."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._finished_event: asyncio.Event | None = None
        self.on_change: Callable[[bool], None] | None = None
        """Called with True once a request is counted (after its record is merged), with False once one
        is begun (``inflight`` + 1): a gateway worker publishes its state then (:mod:`.published`)."""

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Around the answer to one measured request: it is :attr:`active` meanwhile."""
        self.active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.active -= 1
            if not self.active:
                self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Wait until no request to a measured endpoint is being answered, at most ``timeout`` seconds;
        True when none is (used on shutdown, see ``shutdown_timeout_s``)."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def wait_finished(self, n: int, timeout: float = 30.0) -> None:
        """Wait until at least ``n`` requests to the measured endpoints were counted in
        ``requests_total`` (rejected ones included). Raises TimeoutError. The default bound only stops a
        hung test: far beyond what counting needs, even on a busy 2-core machine."""
        async with asyncio.timeout(timeout):
            while self.finished_total < n:
                if self._finished_event is None:
                    self._finished_event = asyncio.Event()
                await self._finished_event.wait()

    def begun(self) -> None:
        """A measured request was begun (its model known): ``inflight`` moved."""
        if self.on_change is not None:
            self.on_change(False)

    def _counted(self) -> None:
        if self.on_change is not None:
            self.on_change(True)
        self.finished_total += 1
        ev = self._finished_event
        if ev is not None:
            self._finished_event = None
            ev.set()

    def rejected(self, endpoint: str, request_type: str, error_type: str, arrival_ns: int) -> None:
        """Count a request that failed before its model was known (``model="unknown_model"``), with its
        duration, as Dynamo's frontend does."""
        self.metrics.state.count_unknown_model(endpoint, request_type, error_type,
                                               duration_s=max(0, _now() - arrival_ns) / 1e9)
        self._counted()

    def finish(self, live: LiveRequest, out: Outcome, end_ns: int | None = None) -> None:
        """Count the request once; ``end_ns``: when it ended (default: now)."""
        rec = live.finish(
            _now() if end_ns is None else end_ns, out.status, "" if out.status == "success" else out.error_type,
            osl=out.osl, cached_tokens=out.cached_tokens, isl_source=out.isl_source,
        )
        self._counted()
        if self.request_log is not None:
            self._log_request(live, out, rec)

    def _log_request(self, live: LiveRequest, out: Outcome, rec: RequestRecord) -> None:
        assert self.request_log is not None
        src = live.isl_source
        offsets: tuple[int, ...] | None = None
        tokens: tuple[int, ...] | None = None
        if self.request_log.chunks:
            timer = live.timer
            offsets = tuple(t - rec.arrival_ns for t in timer.times_ns)
            tokens = tuple(timer.chunk_tokens.get(i, 1) for i in range(len(offsets)))
        try:
            self.request_log.write(RequestLogEntry(
                upstream_request_id=out.upstream_request_id,
                model=live.model,
                endpoint=live.endpoint,
                request_type=live.request_type,
                isl=rec.isl,
                isl_source=src,
                bucket=live.bucket_label,
                ttft_s=rec.ttft_s,
                duration_s=rec.duration_s,
                osl=rec.osl,
                osl_source=out.osl_source if rec.osl is not None else "unknown",
                cached_tokens=rec.cached_tokens,
                output_chunks=rec.output_chunks,
                status=rec.status,
                error_type=rec.error_type,
                http_status=out.http_status,
                arrival_ns=rec.arrival_ns,
                first_output_ns=rec.first_output_ns,
                chunk_offsets_ns=offsets,
                chunk_tokens=tokens,
            ))
        except OSError as exc:  # a full disk must not fail requests: stop logging, say so once
            log.warning("request log %s disabled: %s", self.request_log.path, exc)
            self.request_log.close()
