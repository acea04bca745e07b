"""HTTP pieces every gateway handler uses: which headers are forwarded, OpenAI-format error replies,
reading a request body with a bound on a stalled client, and closing a failed client connection.

Request and response headers are forwarded except hop-by-hop ones (and a request's
``Content-Encoding``: aiohttp decodes the body, which goes upstream decoded); ``Authorization`` passes
through and is never logged. Measured requests ask the upstream for an uncompressed body.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, MultiMapping

from servelens.core.openai import error_body
from servelens.serving import unreadable_body

HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
        "te", "trailer", "trailers", "transfer-encoding", "upgrade",
    }
)
# aiohttp hands the gateway a request body already decoded (gzip, deflate, br): it goes upstream as is
_REQ_DROP = HOP_BY_HOP | {"host", "content-length", "expect", "content-encoding"}
_RESP_DROP = HOP_BY_HOP | {"content-length"}


def _dropped(headers: MultiMapping[str], base: frozenset[str]) -> frozenset[str]:
    conn = headers.get("Connection")
    if not conn:
        return base
    return base | {t.strip().lower() for t in conn.split(",") if t.strip()}


def forward_request_headers(headers: CIMultiDictProxy[str], measured: bool) -> CIMultiDict[str]:
    """Client request headers to send upstream: hop-by-hop, Host and Content-Length removed.

    ``measured``: also ask for an uncompressed body (the gateway reads the stream).
    """
    drop = _dropped(headers, _REQ_DROP)
    out: CIMultiDict[str] = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)
    if measured:
        out["Accept-Encoding"] = "identity"
        if "Content-Type" not in out:
            out["Content-Type"] = "application/json"
    return out


def forward_response_headers(headers: MultiMapping[str]) -> CIMultiDict[str]:
    """Upstream response headers to send to the client: hop-by-hop and Content-Length removed."""
    drop = _dropped(headers, _RESP_DROP)
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


def response_headers(headers: MultiMapping[str], upstream_bases: tuple[str, ...]) -> CIMultiDict[str]:
    """:func:`forward_response_headers`, with a ``Location`` into one of ``upstream_bases`` (base URLs
    without a trailing slash) made relative to the gateway, as nginx's ``proxy_redirect default``
    does: a redirect (FastAPI's 307 for a trailing slash) sends the client back through the gateway,
    not straight to the engine. An event stream (``text/event-stream``) gets ``X-Accel-Buffering: no``
    unless the upstream sent its own (an nginx in front of the gateway would otherwise buffer it, its
    default ``proxy_buffering on``)."""
    out = forward_response_headers(headers)
    if "X-Accel-Buffering" not in out and out.get("Content-Type", "").lower().startswith("text/event-stream"):
        # an event stream must not be held by a buffering proxy in front of the gateway (nginx's default
        # proxy_buffering: tokens arrive in bursts and ITL reads near 0); an engine's own value is kept
        out["X-Accel-Buffering"] = "no"
    loc = out.get("Location")
    if loc:
        for base in upstream_bases:
            if loc.startswith(base) and loc[len(base):len(base) + 1] in ("", "/", "?"):
                out["Location"] = loc[len(base):] or "/"
                break
    return out


def openai_error(
    status: int, message: str, type_: str, code: str | int | None = None, param: str | None = None
) -> web.Response:
    """An OpenAI-format error response ``{"error": {"message", "type", "param", "code"}}``."""
    return web.Response(
        status=status, body=error_body(message, type_, code, param), content_type="application/json"
    )


def method_not_allowed(request: web.Request, allow: str) -> web.Response:
    """405 in the OpenAI error format for a method a path of the gateway's own does not take; ``allow``:
    the ``Allow`` header (``POST``; ``GET, HEAD``)."""
    resp = openai_error(405, f"{request.method} is not allowed on {request.path}; use {allow.split(',')[0]}",
                        "invalid_request_error", "method_not_allowed")
    resp.headers["Allow"] = allow
    return resp


async def get_only(request: web.Request) -> web.Response:
    """Any method but GET and HEAD on ``/metrics``, ``/health`` or ``/ready`` (the gateway's own, never
    relayed): 405 in the OpenAI error format (aiohttp's own answer is a plain-text 404 or 405)."""
    return method_not_allowed(request, "GET, HEAD")


class ClientTooSlow(Exception):
    """The client's request body stopped arriving (see :func:`read_body`)."""


async def read_body(request: web.Request, max_bytes: int, silence_s: float) -> bytes:
    """The whole request body, as ``request.read()`` gives it, with a bound on a stalled client.

    A body already received whole (the common case: it came with the request head) is returned at
    once. Otherwise the client may be silent at most ``silence_s`` seconds between two reads (nginx's
    ``client_body_timeout`` semantics, not a bound on the whole transfer). Progress is counted in the
    body's bytes as received (before ``Content-Encoding`` decoding: gzip headers count; such bytes
    that decode to nothing yet restart the wait when it runs out, so the silence allowed is then up
    to twice ``silence_s``), not in chunked framing: size lines trickled without data are silence. A
    chunked body whose framing breaks after the head also ends here (aiohttp neither fails nor feeds
    the body then). ``max_bytes`` bounds the body both decoded and as sent.

    Raises :class:`ClientTooSlow` when a wait runs out; ``web.HTTPRequestEntityTooLarge`` past
    ``max_bytes``; ``web.RequestPayloadError`` for a body that cannot be read (broken chunked framing,
    a bad ``Content-Encoding``); ``ConnectionError``/``CancelledError`` when the client goes away.
    """
    content = request.content
    if content.is_eof():
        return await request.read()
    parts: list[bytes] = []
    size = 0
    while True:
        seen = content.total_raw_bytes
        if max(size, seen) > max_bytes:  # decoded, or as sent (compressed)
            raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=max(size, seen))
        try:
            async with asyncio.timeout(silence_s):
                part = await content.readany()
        except TimeoutError:
            if content.total_raw_bytes == seen:
                raise ClientTooSlow(f"the request body stopped arriving for {silence_s:g} s") from None
            continue  # compressed bytes came that decode to nothing yet: wait on
        if not part:
            return b"".join(parts)
        size += len(part)
        parts.append(part)


def too_large(max_bytes: int) -> web.Response:
    """413 for a request body over ``max_bytes``."""
    return openai_error(413, f"request body is larger than {max_bytes} bytes", "invalid_request_error",
                        "request_too_large")


async def too_slow(request: web.Request, exc: ClientTooSlow) -> web.Response:
    """408 for a stalled request body, sent now; then the connection is closed at once (aiohttp
    would first wait up to 10 s more for the rest of the body, its "lingering close")."""
    resp = openai_error(408, str(exc), "invalid_request_error", "request_timeout")
    resp.force_close()
    with contextlib.suppress(ConnectionError):
        await resp.prepare(request)
        await resp.write_eof()
    request.protocol.force_close()  # closes the transport once what was written has gone out
    return resp


def unreadable(request: web.Request, exc: web.RequestPayloadError) -> web.Response:
    """400 for a request body that could not be read (a bad Content-Encoding, a broken chunked body)."""
    return openai_error(400, f"cannot read the request body: {unreadable_body(request, exc)}",
                        "invalid_request_error", "invalid_body")


def request_gone(request: web.Request) -> None:
    """Close what is left of a client connection that failed."""
    if request.transport is not None:
        request.transport.close()
