"""The streaming client: one request in, one :class:`BenchRecord` out.

Hot path per read: one ``time.perf_counter_ns()`` stamp when the bytes arrive, the shared SSE decoder
(:class:`servelens.core.sse.SSEDecoder`), :func:`servelens.core.openai.parse_chunk` per event, and two
list appends per output chunk. Everything else (ITL, percentiles) happens after the run.

Tokens per chunk, and how a stream ended, are read as the gateway reads them
(:mod:`servelens.core.stream`): from the first choice's cumulative ``usage.completion_tokens`` when the
server sends continuous usage (a chunk whose count did not move carries no token, one whose count
moved carries tokens even with empty text), else one per output chunk.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
from aiohttp.http_exceptions import ContentLengthError, TransferEncodingError

from servelens.core.openai import parse_chunk, parse_response
from servelens.core.sse import SSEDecoder
from servelens.core.status import error_type_for_status
from servelens.core.stream import FirstChoiceTokens, cut_mid_event, stream_outcome
from servelens.formats.results import BenchRecord

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_ERR_BODY_LIMIT = 4096


@dataclass(frozen=True)
class RequestSpec:
    """One request of the workload.

    Attributes:
        index: position in the workload.
        scheduled_ns: due time as an offset from the run start (ns; 0 in a closed loop).
        isl_target, osl_target: intended prompt and output lengths (tokens).
        body: the encoded JSON request body.
    """

    index: int
    scheduled_ns: int
    isl_target: int
    osl_target: int
    body: bytes


def build_body(
    endpoint: str,
    model: str,
    prompt: str,
    osl_tokens: int,
    *,
    continuous_usage: bool = True,
    ignore_eos: bool = True,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """The JSON body of a streaming request asking for usage (continuous where accepted).

    ``ignore_eos``/``min_tokens`` (vLLM, SGLang, Dynamo and the sim accept them) make the output length
    equal ``osl_tokens``. Raises ValueError for an unknown endpoint.
    """
    body: dict[str, Any] = {"model": model, "max_tokens": osl_tokens, "stream": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    elif endpoint == "completions":
        body["prompt"] = prompt
    else:
        raise ValueError(f"unknown endpoint {endpoint!r}; expected chat or completions")
    so: dict[str, Any] = {"include_usage": True}
    if continuous_usage:
        so["continuous_usage_stats"] = True
    body["stream_options"] = so
    if ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = osl_tokens
    if extra:
        body.update(extra)
    return msgspec.json.encode(body)


def error_message(body: bytes) -> str:
    """The message of an error reply, at most 300 characters: OpenAI's ``error.message`` (read by the
    core's :func:`~servelens.core.openai.parse_response`), a top-level ``message`` (as Dynamo writes),
    else the start of the body as text (``(empty body)`` for none)."""
    info = parse_response(body)
    msg = info.error or (info.obj.get("message") if isinstance(info.obj, dict) else None)
    if isinstance(msg, str) and msg:
        return msg[:300]
    text = body.decode("utf-8", "replace").strip()
    return text[:300] if text else "(empty body)"


def payload_error_text(exc: aiohttp.ClientPayloadError) -> str:
    """What a body cut short means, in words: aiohttp's text ("Response payload is not completed:
    <TransferEncodingError: 400, message='Not enough data to satisfy transfer length header.'>") carries
    its parser's internal code 400, which reads as an HTTP status on a response whose status was 200.
    The parser error is the exception's cause (aiohttp sets it); its message is kept without the code."""
    cause = exc.__cause__
    if isinstance(cause, TransferEncodingError):
        return "connection closed mid-stream: the response ended before its last chunk (chunked encoding)"
    if isinstance(cause, ContentLengthError):
        got = re.search(r"received \d+ of \d+ bytes", str(cause.message))
        return ("connection closed mid-stream: the response ended before its Content-Length"
                + (f" ({got.group(0)})" if got else ""))
    detail = getattr(cause, "message", None) or str(exc)
    return f"connection closed mid-stream: {str(detail).rstrip('.')}"


async def send_request(
    session: aiohttp.ClientSession,
    url: str,
    spec: RequestSpec,
    headers: dict[str, str] | None = None,
) -> BenchRecord:
    """Send ``spec`` to ``url`` (the full endpoint URL) and measure it. Never raises for
    request failures (they become error records); cancellation propagates."""
    clock = time.perf_counter_ns
    chunk_ns: list[int] = []
    chunk_tok: list[int] = []
    request_id: str | None = None
    http_status: int | None = None
    usage_pt: int | None = None
    usage_ct: int | None = None
    cached: int | None = None
    tokens_from_usage = False
    error = ""
    error_type = ""
    wall = time.time_ns()
    send = clock()
    try:
        async with session.post(url, data=spec.body, headers=headers) as resp:
            http_status = resp.status
            request_id = resp.headers.get("x-request-id")
            if resp.status != 200:
                body = await resp.content.read(_ERR_BODY_LIMIT)
                error_type = error_type_for_status(resp.status)
                error = f"HTTP {resp.status}: {error_message(body)}"
            else:
                decoder = SSEDecoder()
                counter = FirstChoiceTokens()
                done = False
                finished = False
                produced = False
                cut = False
                append_t = chunk_ns.append
                append_k = chunk_tok.append
                reads = resp.content.iter_any().__aiter__()
                last = False
                while not last:
                    try:
                        data = await reads.__anext__()
                    except StopAsyncIteration:  # the end: a last event without its blank line, if any
                        last = True
                        t = clock()
                        blocks = decoder.flush()
                    else:
                        t = clock()
                        blocks = decoder.decode(data)
                    for blk in blocks:
                        d = blk.data
                        if d is None:
                            continue
                        info = parse_chunk(d, blk.event)
                        if info.done:
                            done = True
                            continue
                        if info.error is not None:
                            error_type, error = "backend_error", f"error in stream: {info.error}"
                            continue
                        if info.malformed:
                            if last and cut_mid_event(info):
                                cut = True
                            elif not error:
                                error_type, error = "backend_error", f"malformed chunk: {d[:120]!r}"
                            continue
                        u = info.usage
                        if u is not None:
                            if u.prompt_tokens is not None:
                                usage_pt = u.prompt_tokens
                            if u.cached_tokens is not None:
                                cached = u.cached_tokens
                            if u.completion_tokens is not None:
                                usage_ct = u.completion_tokens
                                produced = produced or u.completion_tokens > 0
                        produced = produced or info.has_output
                        k = counter.step(info)
                        if k:
                            append_k(k)
                            append_t(t - send)
                        if info.finish_reason is not None:
                            finished = True
                tokens_from_usage = counter.counted_from_usage
                if not error:
                    error_type = stream_outcome(failed=False, complete=done or finished, produced=produced, cut=cut)
                    if cut:
                        error = "stream cut inside an event (its last event has no end and does not parse)"
                    elif error_type == "truncated_stream":
                        error = "stream ended with neither finish_reason nor [DONE]"
                    elif error_type:
                        error = "stream produced no output"
    except asyncio.CancelledError:
        raise
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        error_type, error = "response_timeout", f"timeout: {exc or type(exc).__name__}"
    except aiohttp.ClientPayloadError as exc:
        error_type, error = "truncated_stream", payload_error_text(exc)
    except aiohttp.ClientConnectionError as exc:
        error_type = "truncated_stream" if chunk_ns else "unavailable"
        error = f"connection error: {exc}"
    except aiohttp.ClientError as exc:
        error_type, error = "unavailable", f"client error: {exc}"
    end = clock()
    counted = sum(chunk_tok)
    return BenchRecord(
        index=spec.index,
        request_id=request_id,
        scheduled_ns=spec.scheduled_ns,
        send_ns=send,
        wall_send_ns=wall,
        first_output_ns=(send + chunk_ns[0]) if chunk_ns else None,
        end_ns=end,
        chunk_offsets_ns=tuple(chunk_ns),
        chunk_tokens=tuple(chunk_tok),
        tokens_from_usage=tokens_from_usage,
        isl_target=spec.isl_target,
        isl_server=usage_pt,
        osl_target=spec.osl_target,
        osl=usage_ct if usage_ct is not None else (counted if chunk_ns else None),
        cached_tokens=cached,
        status="error" if error else "success",
        error_type=error_type,
        error=error,
        http_status=http_status,
    )
