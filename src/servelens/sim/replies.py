"""How the sim answers a request the engine has taken: a stream (SSE, token by token as the engine
steps) or one JSON body at the end, with the fault modes that act on the reply (slow start, stall,
malformed chunk, error or reset mid-stream, no ``[DONE]``). What became of the request is left in
an :class:`Outcome` for its truth record."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from servelens.core.openai import error_body
from servelens.sim.chunks import ChunkBuilder, usage_object
from servelens.sim.faults import FaultPlan
from servelens.sim.request import Parsed
from servelens.sim.scheduler import SimRequest
from servelens.sim.state import SimState
from servelens.sim.writer import SSEWriter

_enc = msgspec.json.Encoder()
PING_INTERVAL_S = 0.1


def error_response(status: int, message: str, type_: str, rid: str, param: str | None = None) -> web.Response:
    """An OpenAI error object with HTTP ``status`` and the request's ``x-request-id`` (429 also says
    ``retry-after: 1``)."""
    headers = {"x-request-id": rid}
    if status == 429:
        headers["retry-after"] = "1"
    return web.Response(status=status, body=error_body(message, type_, status, param),
                        content_type="application/json", headers=headers)


@dataclass
class Outcome:
    """What became of a request, filled in as it is answered: ``outcome`` (one of
    :data:`servelens.sim.truth.OUTCOMES`), the HTTP status, and the finish reason once it finished."""

    outcome: str = "ok"
    status: int = 200
    finish: str | None = None


@dataclass(frozen=True)
class Choice:
    """One choice of a request (``n`` > 1 gives several): its ``index``, its own engine request
    (own output length and token times), its words and its finish reason."""

    index: int
    sreq: SimRequest
    words: list[str]
    finish: str


def _submit(st: SimState, choices: list[Choice]) -> None:
    for c in choices:
        st.loop.submit(c.sreq)


def _cancel(st: SimState, choices: list[Choice]) -> None:
    for c in choices:
        st.loop.cancel(c.sreq)


async def stream_reply(request: web.Request, st: SimState, p: Parsed, plan: FaultPlan, choices: list[Choice],
                       ev: asyncio.Event, rid: str, out: Outcome, created: int) -> web.StreamResponse:
    """Submit the ``choices`` and stream their words as SSE chunks as the engine generates them
    (``ev`` is set after each step that moved one; each chunk carries one choice, interleaved as
    they come), each ending with its finish reason; then the usage chunk when asked for, and
    ``[DONE]``. ``plan``'s faults act on the way, timed by the first choice. A client that goes
    away is a cancellation."""
    resp = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8",
                                       "cache-control": "no-cache", "x-request-id": rid})
    try:
        return await _write_stream(request, resp, st, p, plan, choices, ev, rid, out, created)
    except ConnectionResetError:
        # the client closed its connection and a write noticed before aiohttp cancelled the
        # handler: a cancellation, not a handler error (aiohttp would log a traceback)
        if out.outcome == "ok":
            out.outcome = "cancelled"
        if request.transport is not None:
            request.transport.close()
        return resp


async def _write_stream(request: web.Request, resp: web.StreamResponse, st: SimState, p: Parsed, plan: FaultPlan,
                        choices: list[Choice], ev: asyncio.Event, rid: str, out: Outcome,
                        created: int) -> web.StreamResponse:
    await resp.prepare(request)
    w = SSEWriter(resp, plan)
    ch = ChunkBuilder(p, rid, st.config.model, created, plan, st.engine.cache.enabled)
    if ch.chat:
        for c in choices:
            await w.event(ch.role(c.index))
    if "slow_start" in plan:
        await w.flush()
        deadline = time.perf_counter_ns() + plan.delay_ms * 1_000_000
        while True:
            left = deadline - time.perf_counter_ns()
            if left <= 0:
                break
            await asyncio.sleep(min(PING_INTERVAL_S, left / 1e9))
            if deadline - time.perf_counter_ns() > 0:
                await w.comment(b"ping")
    _submit(st, choices)
    cut = max(1, choices[0].sreq.osl_target // 2)  # the faults act at the first choice's middle
    stop_mid = "error_mid_stream" in plan or "reset_mid_stream" in plan
    stall_pending = "stall_mid_stream" in plan
    malformed_pending = "malformed_chunk" in plan
    no_done = "no_done" in plan
    sent = [0] * len(choices)
    while any(sent[c.index] < c.sreq.osl_target for c in choices):
        moved = False
        for c in choices:
            sreq, i = c.sreq, c.index
            osl, times = sreq.osl_target, sreq.token_times_ns
            if sent[i] >= osl:
                continue
            if sreq.generated <= sent[i]:
                if sreq.finished:  # the engine let go of it (shut down, or a step failed): end with an error
                    _cancel(st, choices)
                    out.outcome, out.status = "error", 200
                    await w.event(error_body("Engine dropped the request (servelens sim)", "InternalServerError",
                                             500))
                    await w.flush()
                    await resp.write_eof()
                    return resp
                continue
            moved = True
            n = sreq.generated
            while sent[i] < n:
                k = 1
                t = times[sent[i]]
                while sent[i] + k < n and times[sent[i] + k] == t and "multi_token" in plan:
                    k += 1
                text = "".join([" " + x for x in c.words[sent[i] : sent[i] + k]])
                last = sent[i] + k >= osl
                fin = c.finish if last and not no_done else None
                await w.event(ch.tokens(text, sent[i] == 0, last, fin, sent[i] + k, sreq.cached_tokens, i))
                sent[i] += k
                if i != 0:
                    continue
                if malformed_pending and sent[0] >= cut:
                    malformed_pending = False
                    await w.event(ch.head + b'{"index":0,"delta":{"content":"broken')
                if stall_pending and sent[0] >= cut and sent[0] < osl:
                    # silence on the wire (the engine generates on); then the rest of the stream
                    stall_pending = False
                    await w.flush()
                    await asyncio.sleep(plan.delay_ms / 1000)
                    n = sreq.generated
                if stop_mid and sent[0] >= cut and sent[0] < osl:
                    _cancel(st, choices)
                    await w.flush()
                    if "reset_mid_stream" in plan:
                        out.outcome, out.status = "reset", 200
                        reset_connection(request)
                        return resp
                    out.outcome, out.status = "error", 200
                    await w.event(error_body("Engine error mid-stream (servelens sim fault error_mid_stream)",
                                             "InternalServerError", 500))
                    await w.flush()
                    await resp.write_eof()
                    return resp
        if not moved:
            await ev.wait()
            ev.clear()
    if no_done:
        out.outcome = "incomplete"
        await w.flush()
        await resp.write_eof()
        return resp
    out.finish = choices[0].finish
    if p.include_usage:
        await w.event(ch.usage_chunk(sum(c.sreq.osl_target for c in choices), choices[0].sreq.cached_tokens))
    await w.event(b"[DONE]", last=True)
    await w.flush()
    await resp.write_eof()
    return resp


def reset_connection(request: web.Request) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0 then close)."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def whole_reply(request: web.Request, st: SimState, p: Parsed, plan: FaultPlan, choices: list[Choice],
                      ev: asyncio.Event, rid: str, out: Outcome, created: int) -> web.StreamResponse:
    """Submit the ``choices``, wait until the engine has generated all their words, then answer one
    JSON completion (chat or text; tool calls or reasoning content with those faults) with one
    entry per choice and the usage (``completion_tokens``: the sum over the choices)."""
    if "slow_start" in plan:
        await asyncio.sleep(plan.delay_ms / 1000)
    _submit(st, choices)
    first = choices[0].sreq
    osl = first.osl_target
    stop_at = max(1, osl // 2) if ("error_mid_stream" in plan or "reset_mid_stream" in plan) else osl

    def waiting() -> bool:
        if stop_at < osl:
            return first.generated < stop_at
        return not all(c.sreq.finished for c in choices)

    while True:
        if any(c.sreq.finished and c.sreq.generated < min(c.sreq.osl_target, stop_at) for c in choices):
            # let go before its tokens were out (shut down, or a step failed)
            _cancel(st, choices)
            out.outcome, out.status = "error", 500
            return error_response(500, "Engine dropped the request (servelens sim)", "InternalServerError", rid)
        if not waiting():
            break
        await ev.wait()
        ev.clear()
    if stop_at < osl:
        _cancel(st, choices)
        if "reset_mid_stream" in plan:
            out.outcome = "reset"
            reset_connection(request)
            return web.Response(status=500)
        out.outcome, out.status = "error", 500
        return error_response(500, "Engine error (servelens sim fault error_mid_stream)", "InternalServerError", rid)
    isl = len(p.prompt_ids)
    cached = first.cached_tokens if st.engine.cache.enabled else None
    usage = usage_object(isl, sum(c.sreq.osl_target for c in choices), cached, "null_details" in plan)
    entries: list[dict[str, Any]] = []
    for c in choices:
        text = "".join([" " + x for x in c.words])
        if p.endpoint == "chat_completions":
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if "tool_calls" in plan:
                call_id = "call_" + rid[-12:] + (f"_{c.index}" if c.index else "")
                msg = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function",
                     "function": {"name": "lookup", "arguments": '{"text": "' + text + '"}'}}]}
            elif "reasoning" in plan:
                msg = {"role": "assistant", "content": None, "reasoning_content": text}
            entries.append({"index": c.index, "message": msg, "logprobs": None, "finish_reason": c.finish})
        else:
            entries.append({"index": c.index, "text": text, "logprobs": None, "finish_reason": c.finish,
                            "stop_reason": None})
    obj = "chat.completion" if p.endpoint == "chat_completions" else "text_completion"
    body = {"id": rid, "object": obj, "created": created, "model": st.config.model, "choices": entries,
            "usage": usage}
    out.finish = choices[0].finish
    return web.Response(body=_enc.encode(body), content_type="application/json", headers={"x-request-id": rid})
