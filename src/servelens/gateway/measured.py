"""What happens to a measured request (``POST /v1/chat/completions``, ``POST /v1/completions``), top
to bottom.

1. :meth:`MeasuredEndpoints.handle`: the request is answered while it counts as
   :attr:`~servelens.gateway.accounting.Accounting.active`.
2. ``_measured``: the arrival time is taken; the body is read (:func:`~servelens.gateway.http.read_body`)
   and checked (a JSON object, ``stream`` a boolean as pydantic reads one, a ``model`` string); the model
   is resolved to an upstream (:class:`~servelens.gateway.models.ModelRouter`). A request failing here is
   counted with no model (:meth:`~servelens.gateway.accounting.Accounting.rejected`). Otherwise it is begun as a
   :class:`~servelens.core.state.LiveRequest` (prompt tokens counted meanwhile in a thread with
   ``--tokenizer``), and whatever happens next it is counted once, at the end
   (:meth:`~servelens.gateway.accounting.Accounting.finish`).
3. A stream (``_stream``): plan what to add to the request so the upstream reports token counts
   (``_plan``: :func:`~servelens.gateway.usage.plan_learned`, with what was learned of this upstream);
   send it; an upstream that refuses it (400 or 422) gets it again without what the error blames, or as
   the client sent it when the error shows what was added, and a refusal of the field is remembered only
   when the request without it was accepted (``_resend_rejected``, :mod:`.rejection`); a 200 event
   stream goes to the relay (:func:`~servelens.gateway.relay.relay_stream`), which measures it on the way.
4. A unary request (``_unary``), or a whole JSON reply to a stream request: read whole, its usage read
   (``_unary_reply``), relayed unchanged.
5. An upstream error status is relayed as it came (``_error_reply``); an upstream that cannot be
   reached or does not answer in time gets the client an OpenAI error object (502/504).

How each outcome is counted: :mod:`servelens.gateway.accounting`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from servelens.core.openai import decode_json_strictness, parse_response
from servelens.core.state import LiveRequest
from servelens.core.status import error_type_for_status
from servelens.gateway.accounting import Outcome
from servelens.gateway.http import (
    ClientTooSlow,
    forward_request_headers,
    openai_error,
    read_body,
    too_large,
    too_slow,
    unreadable,
)
from servelens.gateway.meter import StreamMeter
from servelens.gateway.rejection import CONTINUOUS, RESEND_WITHOUT_CONTINUOUS, read_rejection
from servelens.gateway.relay import relay_stream
from servelens.gateway.upstream import redacted_url
from servelens.gateway.upstream_response import UpstreamError, UpstreamResponse
from servelens.gateway.usage import Injection, plan_learned, stream_asked

if TYPE_CHECKING:
    from servelens.gateway.app import Gateway

log = logging.getLogger("servelens.gateway")

_now = time.perf_counter_ns

MEASURED_PATHS = {"/v1/chat/completions": "chat_completions", "/v1/completions": "completions"}
"""The measured paths and their ``endpoint`` label."""
COUNT_GRACE_S = 1.0
"""After a reply that came before the prompt count (``--tokenizer``) ended, how long the request waits
for the count to set its bucket (seconds); the reply has gone out and the request's time has ended."""
_REJECTED = (400, 422)
"""Statuses of an upstream that refuses a request's content: OpenAI's and vLLM's 400, and 422, which
FastAPI answers for a field its model forbids (``extra="forbid"``)."""


class _UpstreamFailed(Exception):
    """The upstream could not be reached or did not answer in time (before any response)."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


class MeasuredEndpoints:
    """The handlers of the measured endpoints, and what they learned of each upstream.

    Args:
        gateway: the gateway whose config, metrics, router, upstream client and accounting serve
            these requests.
    """

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.config = gateway.config
        self.metrics = gateway.metrics
        self.router = gateway.router
        self.accounting = gateway.accounting
        self.prompt_counter = gateway.prompt_counter
        self.response_headers = gateway.response_headers
        # per upstream, learned in "auto" mode: may stream_options / continuous_usage_stats be sent
        self.stream_options_ok: dict[str, bool] = {}
        self.continuous_ok: dict[str, bool] = {}
        # per upstream: sends "usage": null on chunks of an include_usage stream (None: not known yet)
        self.usage_null: dict[str, bool] = {}
        self._urls: dict[tuple[str, str], URL] = {}

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions`` (measured)."""
        return await self.handle(request, "chat_completions")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions`` (measured)."""
        return await self.handle(request, "completions")

    async def handle(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        """Answer one request to a measured ``endpoint`` (``chat_completions`` or ``completions``) and
        count it once."""
        with self.accounting.answering():
            return await self._measured(request, endpoint)

    async def _measured(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        arrival_ns = _now()
        state = self.metrics.state
        try:
            body = await read_body(request, self.config.max_body_bytes, self.config.client_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            self.accounting.rejected(endpoint, "unary", "validation", arrival_ns)
            return too_large(self.config.max_body_bytes)
        except web.RequestPayloadError as exc:
            self.accounting.rejected(endpoint, "unary", "validation", arrival_ns)
            return unreadable(request, exc)
        except ClientTooSlow as exc:
            self.accounting.rejected(endpoint, "unary", "validation", arrival_ns)
            return await too_slow(request, exc)
        except (asyncio.CancelledError, ConnectionError):
            # the client went away while sending its body: counted once, model unknown
            self.accounting.rejected(endpoint, "unary", "cancelled", arrival_ns)
            state.client_disconnected()
            raise
        try:
            obj, strict = decode_json_strictness(body)
        except msgspec.DecodeError as exc:
            self.accounting.rejected(endpoint, "unary", "validation", arrival_ns)
            return openai_error(400, f"invalid JSON in the request body: {exc}", "invalid_request_error",
                                "invalid_json")
        if not isinstance(obj, dict):
            self.accounting.rejected(endpoint, "unary", "validation", arrival_ns)
            return openai_error(400, "request body must be a JSON object", "invalid_request_error", "invalid_json")
        stream = stream_asked(obj)  # "true" and 1 are a stream, as vLLM and SGLang (pydantic) read them
        if stream is None:  # a value they refuse too
            self.accounting.rejected(endpoint, "unary", "validation", arrival_ns)
            return openai_error(400, f"'stream' must be a boolean, got {type(obj.get('stream')).__name__}",
                                "invalid_request_error", "invalid_type", "stream")
        request_type = "stream" if stream else "unary"
        model = obj.get("model")
        if not isinstance(model, str) or not model:
            self.accounting.rejected(endpoint, request_type, "validation", arrival_ns)
            return openai_error(400, "'model' is required (a string)", "invalid_request_error", "missing_model")
        try:
            upstream = await self.router.resolve(model, self.gateway.session)  # awaits only for unknown names
        except asyncio.CancelledError:
            self.accounting.rejected(endpoint, request_type, "cancelled", arrival_ns)
            state.client_disconnected()
            raise
        if upstream is None:
            if self.router.upstream_down:
                self.accounting.rejected(endpoint, request_type, "unavailable", arrival_ns)
                return openai_error(502, "upstream unreachable: cannot list its models", "server_error",
                                    "upstream_unavailable")
            self.accounting.rejected(endpoint, request_type, "not_found", arrival_ns)
            return openai_error(404, f"The model '{model}' does not exist.", "invalid_request_error",
                                "model_not_found")
        live = self.metrics.begin(model, endpoint, request_type, arrival_ns)
        self.accounting.begun()
        out = Outcome()
        counting = self._count_prompt(obj, live) if self.prompt_counter is not None else None
        end_ns: int | None = None
        try:
            url = self._url(upstream, request.path, request.raw_path)
            if stream:
                resp = await self._stream(request, live, out, obj, body, upstream, url, strict)
            else:
                resp = await self._unary(request, live, out, body, url)
            if counting is not None and not counting.done():
                # a reply faster than the tokenizer: send it and end the request's timing now, then
                # give the count a moment to set the bucket (a client leaving meanwhile changes nothing)
                if not resp.prepared:
                    with contextlib.suppress(ConnectionError):
                        await resp.prepare(request)
                        await resp.write_eof()
                end_ns = _now()
                await asyncio.wait({counting}, timeout=COUNT_GRACE_S)
            return resp
        except asyncio.CancelledError:
            if end_ns is None:
                out.fail("cancelled", 499)
                state.client_disconnected()
            raise
        except _UpstreamFailed as exc:
            if exc.error_type == "response_timeout":
                out.fail("response_timeout", 504)
                return openai_error(504, str(exc), "server_error", "upstream_timeout")
            if exc.error_type == "backend_error":
                out.fail("backend_error", 502)
                return openai_error(502, str(exc), "server_error", "upstream_error")
            out.fail("unavailable", 502)
            return openai_error(502, str(exc), "server_error", "upstream_unavailable")
        except Exception:
            log.exception("internal error relaying %s request", endpoint)
            out.fail("internal", 500)
            return openai_error(500, "internal error in the servelens gateway", "server_error", "internal")
        finally:
            self.accounting.finish(live, out, end_ns)

    def _count_prompt(self, obj: dict[str, Any], live: LiveRequest) -> asyncio.Future[int | None]:
        """Count the prompt's tokens in a worker thread, concurrently with the upstream request;
        the bucket is set (source ``tokenizer``) as soon as the count is known."""
        counter = self.prompt_counter
        assert counter is not None
        fut = asyncio.get_running_loop().run_in_executor(None, counter.count, obj)

        def done(f: asyncio.Future[int | None]) -> None:
            if f.cancelled() or f.exception() is not None:
                return
            n = f.result()
            if n is not None and not live.finished:
                live.set_isl(n, "tokenizer")

        fut.add_done_callback(done)
        return fut

    async def _stream(
        self, request: web.Request, live: LiveRequest, out: Outcome, obj: dict[str, Any], body: bytes,
        upstream: str, url: URL, strict: bool,
    ) -> web.StreamResponse:
        headers = forward_request_headers(request.headers, measured=True)
        inj, learn = self._plan(obj, body, upstream, strict)
        up = await self._send(url, inj.body, headers)
        try:
            if up.status in _REJECTED and inj.body is not body and self.config.continuous_usage != "on":
                # (each response is closed by the resend or, on any failure, by the finally below)
                inj, learn, up = await self._resend_rejected(obj, body, upstream, url, headers, inj, learn, up,
                                                             strict)
            out.upstream_request_id = up.headers.get("x-request-id")
            if up.status != 200:
                return await self._error_reply(up, out)
            if up.headers.get("Content-Type", "").lower().startswith(("application/json", "text/html")):
                # a whole JSON reply to a stream request (an engine that ignores "stream"): measured as such;
                # an HTML page (a proxy's or a login page in front of the engine) too: backend_error, as unary
                return await self._unary_reply(up, live, out)
            meter = StreamMeter(live, inj.strip)
            resp = await relay_stream(request, out, up, meter, self.response_headers(up.headers), self.metrics.state)
            if learn and out.status == "success" and meter.usage_key_on_chunks is not None:
                self.usage_null[upstream] = meter.usage_key_on_chunks
            return resp
        finally:
            up.close()

    def _plan(self, obj: dict[str, Any], body: bytes, upstream: str, strict: bool, drop_continuous: bool = False,
              drop_all: bool = False) -> tuple[Injection, bool]:
        """What to add to a stream request, and whether this request teaches ``usage_null``.
        ``strict``: the body is strict UTF-8 JSON (see :func:`~servelens.gateway.usage.plan_injection`);
        ``drop_continuous``, ``drop_all``: this request is sent again without ``continuous_usage_stats``,
        or without anything added (see :meth:`_resend_rejected`)."""
        cfg = self.config
        return plan_learned(obj, body, inject_usage=cfg.inject_usage, continuous_usage=cfg.continuous_usage,
                            stream_options_ok=self.stream_options_ok.get(upstream, True) and not drop_all,
                            continuous_ok=self.continuous_ok.get(upstream, True) and not drop_continuous,
                            usage_null=self.usage_null.get(upstream), strict=strict)

    async def _resend_rejected(
        self, obj: dict[str, Any], body: bytes, upstream: str, url: URL, headers: CIMultiDict[str],
        inj: Injection, learn: bool, up: UpstreamResponse, strict: bool,
    ) -> tuple[Injection, bool, UpstreamResponse]:
        """An upstream refused (400, or FastAPI's 422) a request the gateway added usage to: read why
        (:func:`~servelens.gateway.rejection.read_rejection`) and send it again without the field the
        error blames, or as the client sent it when the error shows what was added without blaming it;
        relay any other answer. Learn that the upstream refuses the field only when the error blamed it
        and the request sent without it was not refused. Each resend drops more, so this ends after at
        most two resends, with the client's own body. Returns the injection sent last, whether it
        teaches ``usage_null``, and the answer to relay (its body read when it is a refusal)."""
        drop_continuous = drop_all = False
        while up.status in _REJECTED and inj.body is not body:
            try:
                text = await self._read_body(up)
            except _UpstreamFailed:
                break  # relayed as it is (the error reply fails the same way)
            rej = read_rejection(inj, text)
            if rej.resend is None:
                break  # an ordinary client error: relayed (body already read, still readable)
            if rej.resend == RESEND_WITHOUT_CONTINUOUS:
                drop_continuous = True
            else:
                drop_all = True
            up.close()
            inj, learn = self._plan(obj, body, upstream, strict, drop_continuous, drop_all)
            up = await self._send(url, inj.body, headers)
            if rej.blamed is not None and up.status not in _REJECTED:  # sent without it: accepted
                flags = self.continuous_ok if rej.blamed == CONTINUOUS else self.stream_options_ok
                flags[upstream] = False
                log.info("upstream %s rejects %s; not sending it again", redacted_url(upstream), rej.blamed)
        return inj, learn, up

    async def _unary(
        self, request: web.Request, live: LiveRequest, out: Outcome, body: bytes, url: URL
    ) -> web.StreamResponse:
        headers = forward_request_headers(request.headers, measured=True)
        up = await self._send(url, body, headers)
        try:
            out.upstream_request_id = up.headers.get("x-request-id")
            if up.status != 200:
                return await self._error_reply(up, out)
            return await self._unary_reply(up, live, out)
        finally:
            up.close()

    async def _unary_reply(self, up: UpstreamResponse, live: LiveRequest, out: Outcome) -> web.Response:
        """Read a whole 200 reply, measure it (usage), relay it unchanged."""
        data = await self._read_body(up)
        info = parse_response(data)
        if info.error is not None or info.malformed:
            out.fail("backend_error", 200)
        else:
            out.status, out.error_type, out.http_status = "success", "", 200
            usage = info.usage
            if usage is not None:
                if usage.prompt_tokens is not None:
                    live.set_isl(usage.prompt_tokens, "final_usage")
                out.osl = usage.completion_tokens
                out.cached_tokens = usage.cached_tokens
        return web.Response(status=up.status, reason=up.reason, body=data,
                            headers=self.response_headers(up.headers))

    async def _error_reply(self, up: UpstreamResponse, out: Outcome) -> web.Response:
        """Relay an upstream error response (status, headers, body) unchanged."""
        body = await self._read_body(up)
        out.fail(error_type_for_status(up.status), up.status)
        return web.Response(status=up.status, reason=up.reason, body=body,
                            headers=self.response_headers(up.headers))

    async def _send(self, url: URL, body: bytes, headers: CIMultiDict[str]) -> UpstreamResponse:
        """POST upstream and wait for the response headers (``response_timeout_s``)."""
        try:  # the client's own timer bounds the wait for headers (no asyncio.timeout per request)
            return await self.gateway.upstream.request("POST", url, headers, body)
        except UpstreamError as exc:
            raise self._failed(exc, "upstream unreachable") from None

    async def _read_body(self, up: UpstreamResponse) -> bytes:
        """The whole upstream body within ``response_timeout_s``; raises _UpstreamFailed otherwise."""
        try:
            async with asyncio.timeout(self.config.response_timeout_s):
                return await up.read()
        except TimeoutError:
            raise _UpstreamFailed("response_timeout", "upstream did not answer in time") from None
        except UpstreamError as exc:
            raise self._failed(exc, "upstream failed") from None

    @staticmethod
    def _failed(exc: UpstreamError, what: str) -> _UpstreamFailed:
        if exc.error_type == "response_timeout":
            return _UpstreamFailed("response_timeout", "upstream did not answer in time")
        if exc.error_type == "backend_error":  # a body too large to hold
            return _UpstreamFailed("backend_error", f"{what}: {exc}")
        return _UpstreamFailed("unavailable", f"{what}: {exc}")

    def _url(self, upstream: str, path: str, raw_target: str) -> URL:
        """The upstream URL for a measured path (parsed once per upstream and path); a request
        target with a query string keeps it exactly as sent (not cached: clients choose it)."""
        if "?" in raw_target:
            return URL(upstream + raw_target, encoded=True)
        key = (upstream, path)
        url = self._urls.get(key)
        if url is None:
            url = self._urls[key] = URL(upstream + path, encoded=True)
        return url
