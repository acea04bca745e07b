"""The simulated engine's HTTP server (aiohttp): OpenAI-compatible completions and chat
completions, streaming and not, driven by one :class:`~servelens.sim.steploop.StepLoop`.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
``GET /health``, ``POST /tokenize``, ``GET /metrics`` (vLLM names, see :mod:`servelens.prometheus.sim_engine`),
and, only with ``debug=True``, ``GET /debug/requests`` (truth records) and ``GET /debug/stats``.

Request semantics (vLLM-like):

- ``prompt_tokens``: see :mod:`servelens.sim.tokenizer` (chat: sum of message contents' tokens).
- Output length: ``max_tokens`` (or ``max_completion_tokens``; default ``default_max_tokens``). Unless
  ``ignore_eos``, the request stops early at its natural EOS point, a deterministic draw in
  ``[eos_min_tokens, eos_max_tokens]`` from (seed, prompt), but never before ``min_tokens``.
  ``finish_reason`` is ``stop`` then, ``length`` when ``max_tokens`` ended it.
- Generated text: token ``i`` is ``" " + word_i``, the words a deterministic function of the seed
  (request ``seed``, else the server's) and the prompt tokens.
- Streaming: ``data: {json}\\n\\n`` events, ``data: [DONE]`` last. Chat streams start with a role-only
  chunk (``{"role": "assistant", "content": ""}``) sent at once, before prefill, as vLLM does. The
  last token's chunk carries ``finish_reason``. With ``stream_options.include_usage`` every chunk
  has ``"usage": null`` and a final chunk with ``choices: []`` carries the whole usage; with
  ``include_usage`` *and* ``continuous_usage_stats`` (vLLM requires both) every chunk carries the
  cumulative usage. ``prompt_tokens_details.cached_tokens`` is in the final usage (and in the
  continuous usage once the request is admitted) when the prefix cache is on.
- Every response has ``x-request-id`` (the client's, if it sent one) joining it to its
  :class:`~servelens.sim.truth.TruthRecord`.
- Bad input gets an OpenAI error object: 400 (``BadRequestError``), 404 for an unknown model.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import struct
import time
import uuid
import zlib
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from typing import Any

import msgspec
from aiohttp import web

from servelens.core.openai import decode_json, error_body
from servelens.prometheus.sim_engine import SimMetrics
from servelens.serving import listen_error, unreadable_body
from servelens.sim import faults as F
from servelens.sim.faults import FaultInjector, FaultPlan
from servelens.sim.model import MIN_SPEEDUP, ModelParams
from servelens.sim.prefix_cache import block_hashes
from servelens.sim.presets import DEFAULT_PRESET, get_preset
from servelens.sim.scheduler import Engine, SimRequest
from servelens.sim.steploop import MonotonicClock, StepLoop
from servelens.sim.tokenizer import (
    chat_prompt_tokens,
    generated_words,
    tokenize,
)
from servelens.sim.truth import TruthLog, TruthRecord

_enc = msgspec.json.Encoder()
SPLIT_GAP_S = 0.002
"""Pause between the two writes of a ``split`` event, so they reach the client as two reads."""
PING_INTERVAL_S = 0.1


@dataclass(frozen=True)
class SimConfig:
    """Everything a sim server needs (CLI flags map 1:1).

    Attributes:
        host, port: where to listen (``port=0``: a free port).
        model: served model name (``/v1/models``, the ``model`` field; others get 404).
        preset: name of the :mod:`~servelens.sim.presets` entry the timing starts from.
        params: timing-model parameters (default: the preset's); see :meth:`build` for overrides.
        speedup: simulated seconds per wall second (all modelled times are divided by it).
        seed: default generation seed and the fault-draw seed.
        default_max_tokens: output budget when the request sets none.
        eos_min_tokens, eos_max_tokens: range of the natural EOS point (see module docstring).
        max_model_len: prompt + max_tokens limit (400 beyond it).
        truth_log: JSONL path for truth records (None: memory only).
        debug: enable ``/debug/requests`` and ``/debug/stats``.
        fault_rate, fault_modes: global fault injection (see :mod:`~servelens.sim.faults`).
        spin_us: the step loop yields instead of sleeping for the last ``spin_us`` before a deadline.
        keepalive_timeout_s: an idle keep-alive connection, or one without a whole request head, is
            closed after this many seconds (nginx's default, 75; aiohttp's own would be an hour).
            vLLM's API server (uvicorn) closes idle connections after 5 s.
    """

    host: str = "127.0.0.1"
    port: int = 0
    model: str = "sim-model"
    preset: str = DEFAULT_PRESET
    params: ModelParams = field(default_factory=lambda: get_preset(DEFAULT_PRESET).params)
    speedup: float = 1.0
    seed: int = 0
    default_max_tokens: int = 128
    eos_min_tokens: int = 64
    eos_max_tokens: int = 2048
    max_model_len: int = 131072
    truth_log: str | None = None
    debug: bool = False
    fault_rate: float = 0.0
    fault_modes: tuple[str, ...] = ()
    spin_us: int = 1000
    keepalive_timeout_s: float = 75.0

    def __post_init__(self) -> None:
        if not self.speedup >= MIN_SPEEDUP:
            raise ValueError(f"speedup must be >= {MIN_SPEEDUP:g} (inf: no waiting), got {self.speedup!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        if not 1 <= self.eos_min_tokens <= self.eos_max_tokens:
            raise ValueError("need 1 <= eos_min_tokens <= eos_max_tokens")
        if not self.model:
            raise ValueError("model name must not be empty")
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.spin_us < 0:
            raise ValueError(f"spin_us must be >= 0, got {self.spin_us}")
        if not 0 < self.keepalive_timeout_s < math.inf:
            raise ValueError(f"keepalive_timeout_s must be > 0 and finite, got {self.keepalive_timeout_s!r}")
        F.parse_modes(self.fault_modes)
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError(f"fault rate must be in [0, 1], got {self.fault_rate!r}")

    @classmethod
    def build(cls, **overrides: Any) -> SimConfig:
        """A config from keyword overrides: any :class:`SimConfig` field, or any
        :class:`~servelens.sim.model.ModelParams` field (applied on top of ``preset``'s parameters).
        None values are ignored. Raises ValueError for unknown names or bad values."""
        own = {f.name for f in fields(cls)}
        model_kw = {k: v for k, v in overrides.items() if k not in own}
        kw = {k: v for k, v in overrides.items() if k in own and v is not None}
        preset = get_preset(kw.get("preset", DEFAULT_PRESET))
        base = kw.pop("params", preset.params)
        kw["params"] = base.with_overrides(**model_kw)
        if "fault_modes" in kw and isinstance(kw["fault_modes"], str):
            kw["fault_modes"] = tuple(m for m in kw["fault_modes"].split(",") if m.strip())
        return cls(**kw)


class SimState:
    """Per-app state: engine, loop, truth log, metrics, faults."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.engine = Engine(config.params)
        self.loop = StepLoop(self.engine, MonotonicClock(config.spin_us * 1000), config.speedup)
        self.truth = TruthLog(config.truth_log)
        self.metrics = SimMetrics(config.model, config.max_model_len)
        self.faults = FaultInjector(config.fault_rate, config.fault_modes, config.seed)
        self.created = int(time.time())


SIM_STATE: web.AppKey[SimState] = web.AppKey("servelens_sim_state", SimState)


class BadRequest(Exception):
    """Client error with an OpenAI error object."""

    def __init__(self, message: str, status: int = 400, type_: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type_ = type_
        self.param = param


@dataclass
class Parsed:
    """A validated request."""

    endpoint: str
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous: bool
    seed: int


def _int_field(obj: dict[str, Any], name: str, lo: int, default: int | None) -> int | None:
    v = obj.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"'{name}' must be an integer", param=name)
    if v < lo:
        raise BadRequest(f"'{name}' must be >= {lo}, got {v}", param=name)
    return v


def parse_request(obj: Any, endpoint: str, config: SimConfig) -> Parsed:
    """Validate an OpenAI request body. Raises :class:`BadRequest`."""
    if not isinstance(obj, dict):
        raise BadRequest("request body must be a JSON object")
    model = obj.get("model")
    if model is not None and model != config.model:
        raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
    n = obj.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise BadRequest("only n=1 is supported", param="n")
    try:
        if endpoint == "chat_completions":
            messages = obj.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("'messages' must be a non-empty list", param="messages")
            ids = chat_prompt_tokens(messages)
        else:
            ids = _prompt_ids(obj.get("prompt"))
    except ValueError as exc:
        raise BadRequest(str(exc), param="messages" if endpoint == "chat_completions" else "prompt") from None
    if not ids:  # as vLLM: "The decoder prompt cannot be empty"
        raise BadRequest("the prompt cannot be empty (0 tokens)",
                         param="messages" if endpoint == "chat_completions" else "prompt")
    max_tokens = _int_field(obj, "max_completion_tokens", 1, None)
    if max_tokens is None:
        max_tokens = _int_field(obj, "max_tokens", 1, config.default_max_tokens)
    assert max_tokens is not None
    min_tokens = _int_field(obj, "min_tokens", 0, 0)
    assert min_tokens is not None
    if min_tokens > max_tokens:
        raise BadRequest(f"min_tokens ({min_tokens}) must be <= max_tokens ({max_tokens})", param="min_tokens")
    if len(ids) + max_tokens > config.max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {config.max_model_len} tokens. However, you requested "
            f"{len(ids) + max_tokens} tokens ({len(ids)} in the messages, {max_tokens} in the completion).",
            param="max_tokens")
    stream = obj.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    so = obj.get("stream_options")
    if so is not None and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.", param="stream_options")
    if so is not None and not isinstance(so, dict):
        raise BadRequest("'stream_options' must be an object", param="stream_options")
    include_usage = bool(so and so.get("include_usage"))
    continuous = include_usage and bool(so and so.get("continuous_usage_stats"))
    seed = _int_field(obj, "seed", -(2**63), config.seed)
    assert seed is not None
    ignore_eos = obj.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("'ignore_eos' must be a boolean", param="ignore_eos")
    return Parsed(endpoint, ids, max_tokens, min_tokens, ignore_eos, stream, include_usage, continuous, seed)


_MAX_TOKEN_ID = 2**63 - 1  # ids are hashed as int64


def _prompt_ids(prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if any(t < 0 or t > _MAX_TOKEN_ID for t in prompt):
                raise ValueError(f"token ids must be in [0, {_MAX_TOKEN_ID}]")
            return list(prompt)
        if len(prompt) == 1:
            return _prompt_ids(prompt[0])
        raise ValueError("'prompt' must be a string, a list of token ids, or a list with one of those")
    raise ValueError("'prompt' must be a string or a list of token ids")


def _error_response(status: int, message: str, type_: str, rid: str, param: str | None = None) -> web.Response:
    headers = {"x-request-id": rid}
    if status == 429:
        headers["retry-after"] = "1"
    return web.Response(status=status, body=error_body(message, type_, status, param),
                        content_type="application/json", headers=headers)


_HTTP_FAULT_TEXT = {
    429: ("Rate limit exceeded (servelens sim fault http_429)", "RateLimitError"),
    500: ("Internal server error (servelens sim fault http_500)", "InternalServerError"),
    503: ("Service unavailable (servelens sim fault http_503)", "ServiceUnavailableError"),
}


class _Writer:
    """Writes SSE events with the transport-level fault modes (crlf, split, coalesce, keepalive)."""

    def __init__(self, resp: web.StreamResponse, plan: FaultPlan) -> None:
        self.resp = resp
        self.nl = b"\r\n" if "crlf" in plan else b"\n"
        self.split = "split" in plan
        self.coalesce = "coalesce" in plan
        self.keepalive = "keepalive" in plan
        self.pending = b""
        self.n = 0

    async def _write(self, data: bytes) -> None:
        if self.split:
            cut = _split_point(data)
            await self.resp.write(data[:cut])
            await asyncio.sleep(SPLIT_GAP_S)
            await self.resp.write(data[cut:])
        else:
            await self.resp.write(data)

    async def event(self, payload: bytes, last: bool = False) -> None:
        """One ``data:`` event (plus keep-alive blocks after it in ``keepalive`` mode, except after
        the ``last`` one)."""
        data = b"data: " + payload + self.nl + self.nl
        self.n += 1
        if self.keepalive and not last:
            nl = self.nl
            extra = b": keep-alive" + nl + nl
            if self.n % 2 == 0:
                extra += b"id: " + str(self.n).encode() + nl + b"retry: 3000" + nl + nl
            data += extra
        if self.coalesce:
            if self.pending:
                data, self.pending = self.pending + data, b""
                await self.resp.write(data)
            else:
                self.pending = data
            return
        await self._write(data)

    async def comment(self, text: bytes) -> None:
        """A comment line block (``: text``)."""
        await self.flush()
        await self.resp.write(b": " + text + self.nl + self.nl)

    async def flush(self) -> None:
        """Write what ``coalesce`` holds back."""
        if self.pending:
            data, self.pending = self.pending, b""
            await self.resp.write(data)


def _split_point(data: bytes) -> int:
    """Inside the first multi-byte UTF-8 character if any (after its lead byte), else the middle."""
    for i, b in enumerate(data):
        if b >= 0xC0:
            return i + 1
    return max(1, len(data) // 2)


def _usage(isl: int, osl: int, cached: int | None, null_details: bool = False) -> dict[str, Any]:
    """A usage object; ``prompt_tokens_details`` is ``null`` with ``null_details``, absent when
    ``cached`` is None (prefix cache off, or not admitted yet)."""
    u: dict[str, Any] = {"prompt_tokens": isl, "total_tokens": isl + osl, "completion_tokens": osl}
    if null_details:
        u["prompt_tokens_details"] = None
    elif cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return u


class _Chunks:
    """Builds chunk payloads (bytes) for one streamed request with pre-encoded pieces."""

    def __init__(self, p: Parsed, rid: str, model: str, created: int, plan: FaultPlan, cache_on: bool) -> None:
        self.chat = p.endpoint == "chat_completions"
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        self.head = (b'{"id":' + _enc.encode(rid) + b',"object":"' + obj.encode() + b'","created":'
                     + str(created).encode() + b',"model":' + _enc.encode(model) + b',"choices":[')
        self.p = p
        self.isl = len(p.prompt_ids)
        self.cache_on = cache_on
        self.reasoning = self.chat and "reasoning" in plan
        self.tools = self.chat and "tool_calls" in plan
        self.null_details = "null_details" in plan
        self.call_id = "call_" + rid[-12:]

    def _usage_tail(self, osl: int, cached: int | None, final: bool = False) -> bytes:
        if not self.p.include_usage:
            return b"}"
        if self.p.continuous or final:
            usage = _usage(self.isl, osl, cached if self.cache_on else None, self.null_details)
            return b',"usage":' + _enc.encode(usage) + b"}"
        return b',"usage":null}'

    def role(self) -> bytes:
        """The role-only first chat chunk."""
        return (self.head + b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
                b'"finish_reason":null}]' + self._usage_tail(0, None))

    def tokens(self, text: str, first: bool, last: bool, finish: str | None, osl: int, cached: int) -> bytes:
        """A chunk carrying ``text`` (one or more tokens); ``finish`` on the last one."""
        fr = b"null" if finish is None else _enc.encode(finish)
        if not self.chat:
            choice = (b'{"index":0,"text":' + _enc.encode(text) + b',"logprobs":null,"finish_reason":' + fr
                      + b',"stop_reason":null}]')
        else:
            if self.tools:
                args = ('{"text": "' if first else "") + text + ('"}' if last else "")
                call: dict[str, Any] = {"index": 0, "function": {"arguments": args}}
                if first:
                    call = {"index": 0, "id": self.call_id, "type": "function",
                            "function": {"name": "lookup", "arguments": args}}
                delta = b'{"tool_calls":' + _enc.encode([call]) + b"}"
            elif self.reasoning:
                delta = b'{"reasoning_content":' + _enc.encode(text) + b"}"
            else:
                delta = b'{"content":' + _enc.encode(text) + b"}"
            choice = b'{"index":0,"delta":' + delta + b',"logprobs":null,"finish_reason":' + fr + b"}]"
        return self.head + choice + self._usage_tail(osl, cached)

    def usage_chunk(self, osl: int, cached: int) -> bytes:
        """The final ``choices: []`` chunk with the whole usage."""
        return self.head + b"]" + self._usage_tail(osl, cached, final=True)


@dataclass
class _Outcome:
    outcome: str = "ok"
    status: int = 200
    finish: str | None = None


def _natural_length(seed: int, prompt_crc: int, lo: int, hi: int) -> int:
    return lo + zlib.crc32(f"eos:{seed}:{prompt_crc}".encode()) % (hi - lo + 1)


async def _handle(request: web.Request, endpoint: str) -> web.StreamResponse:
    st = request.app[SIM_STATE]
    cfg = st.config
    arrival = time.perf_counter_ns()
    rid = request.headers.get("x-request-id") or (
        ("chatcmpl-" if endpoint == "chat_completions" else "cmpl-") + uuid.uuid4().hex)
    out = _Outcome()
    sreq: SimRequest | None = None
    isl = 0
    plan = FaultPlan()
    stream = False
    try:
        try:
            try:
                raw = await request.read()
            except web.RequestPayloadError as exc:  # e.g. a Content-Encoding the body does not match
                raise BadRequest(f"cannot read the request body: {unreadable_body(request, exc)}") from None
            try:
                obj = decode_json(raw)  # DecodeError also for nesting too deep
            except msgspec.DecodeError:
                raise BadRequest("request body is not valid JSON") from None
            p = parse_request(obj, endpoint, cfg)
            try:
                plan = st.faults.plan(request.headers.get(F.FAULT_HEADER), request.headers.get(F.DELAY_HEADER))
            except ValueError as exc:
                param = F.DELAY_HEADER if F.DELAY_HEADER in str(exc) else F.FAULT_HEADER
                raise BadRequest(str(exc), param=param) from None
        except BadRequest as exc:
            out.outcome, out.status = "invalid", exc.status
            return _error_response(exc.status, str(exc), exc.type_, rid, exc.param)
        isl = len(p.prompt_ids)
        stream = p.stream
        status = plan.http_status
        if status is not None:
            out.outcome, out.status = "error", status
            msg, typ = _HTTP_FAULT_TEXT[status]
            return _error_response(status, msg, typ, rid)
        prompt_crc = zlib.crc32(array("q", p.prompt_ids).tobytes())
        if p.ignore_eos:
            osl, finish = p.max_tokens, "length"
        else:
            natural = max(p.min_tokens, _natural_length(p.seed, prompt_crc, cfg.eos_min_tokens, cfg.eos_max_tokens))
            osl, finish = (natural, "stop") if natural < p.max_tokens else (p.max_tokens, "length")
        if "tool_calls" in plan and endpoint == "chat_completions":
            finish = "tool_calls"
        ev = asyncio.Event()
        sreq = SimRequest(rid, block_hashes(p.prompt_ids, cfg.params.block_size), isl, osl, arrival,
                          tokens_per_step=F.MULTI_TOKENS_PER_STEP if "multi_token" in plan else 1,
                          notify=ev.set)
        if sreq.kv_reserved > cfg.params.kv_capacity_tokens:
            out.outcome, out.status = "invalid", 400
            sreq = None
            return _error_response(400, f"prompt plus max_tokens exceeds the KV cache capacity of "
                                   f"{cfg.params.kv_capacity_tokens} tokens", "BadRequestError", rid)
        words = generated_words(osl, (p.seed, prompt_crc), multibyte_only="split" in plan)
        if "slow_headers" in plan:  # nothing sent and no engine work until the delay is over
            await asyncio.sleep(plan.delay_ms / 1000)
        if p.stream:
            return await _stream(request, st, p, plan, sreq, ev, words, finish, rid, out)
        return await _whole(request, st, p, plan, sreq, ev, words, finish, rid, out)
    except (asyncio.CancelledError, ConnectionResetError):
        if out.outcome == "ok":
            out.outcome = "cancelled"
        raise
    finally:
        end = time.perf_counter_ns()
        final_outcome = out
        req = sreq

        def record() -> None:
            times = tuple(req.token_times_ns) if req is not None else ()
            cached = req.cached_tokens if req is not None else 0
            o = final_outcome
            rec = TruthRecord(
                request_id=rid, endpoint=endpoint, stream=stream, arrival_ns=arrival,
                admitted_ns=req.admitted_ns if req is not None else None,
                first_token_ns=times[0] if times else None, token_times_ns=times, end_ns=end, isl=isl,
                cached_tokens=cached, osl=len(times), outcome=o.outcome,
                finish_reason=o.finish if o.outcome == "ok" else None, http_status=o.status,
                faults=tuple(sorted(plan.modes)),
                cancel_ns=req.cancel_ns if req is not None else None,
                tokens_at_cancel=req.tokens_at_cancel if req is not None else None,
            )
            st.truth.add(rec)
            if req is not None and req.admitted_ns is not None:
                st.metrics.observe_request(arrival, times, end, isl, cached, rec.finish_reason)

        if req is not None and req.submitted and not req.finished:
            # the record is written once the engine has dropped the request (at its next step), so
            # it holds every token generated, including one from a step in flight at the cancel
            req.on_done = record
            st.loop.cancel(req)
        else:
            record()


def _submit(st: SimState, sreq: SimRequest) -> None:
    st.loop.submit(sreq)


async def _stream(request: web.Request, st: SimState, p: Parsed, plan: FaultPlan, sreq: SimRequest,
                  ev: asyncio.Event, words: list[str], finish: str, rid: str, out: _Outcome) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8",
                                       "cache-control": "no-cache", "x-request-id": rid})
    try:
        return await _write_stream(request, resp, st, p, plan, sreq, ev, words, finish, rid, out)
    except ConnectionResetError:
        # the client closed its connection and a write noticed before aiohttp cancelled the
        # handler: a cancellation, not a handler error (aiohttp would log a traceback)
        if out.outcome == "ok":
            out.outcome = "cancelled"
        if request.transport is not None:
            request.transport.close()
        return resp


async def _write_stream(request: web.Request, resp: web.StreamResponse, st: SimState, p: Parsed, plan: FaultPlan,
                        sreq: SimRequest, ev: asyncio.Event, words: list[str], finish: str, rid: str,
                        out: _Outcome) -> web.StreamResponse:
    await resp.prepare(request)
    w = _Writer(resp, plan)
    ch = _Chunks(p, rid, st.config.model, st.created, plan, st.engine.cache.enabled)
    if ch.chat:
        await w.event(ch.role())
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
    _submit(st, sreq)
    osl = sreq.osl_target
    cut = max(1, osl // 2)
    stop_mid = "error_mid_stream" in plan or "reset_mid_stream" in plan
    stall_pending = "stall_mid_stream" in plan
    malformed_pending = "malformed_chunk" in plan
    no_done = "no_done" in plan
    sent = 0
    times = sreq.token_times_ns
    while sent < osl:
        if sreq.generated <= sent:
            if sreq.finished:  # the engine let go of it (shut down, or a step failed): end with an error
                out.outcome, out.status = "error", 200
                await w.event(error_body("Engine dropped the request (servelens sim)", "InternalServerError", 500))
                await w.flush()
                await resp.write_eof()
                return resp
            await ev.wait()
            ev.clear()
            continue
        n = sreq.generated
        while sent < n:
            k = 1
            t = times[sent]
            while sent + k < n and times[sent + k] == t and "multi_token" in plan:
                k += 1
            text = "".join([" " + x for x in words[sent : sent + k]])
            last = sent + k >= osl
            fin = finish if last and not no_done else None
            await w.event(ch.tokens(text, sent == 0, last, fin, sent + k, sreq.cached_tokens))
            sent += k
            if malformed_pending and sent >= cut:
                malformed_pending = False
                await w.event(ch.head + b'{"index":0,"delta":{"content":"broken')
            if stall_pending and sent >= cut and sent < osl:
                # silence on the wire (the engine generates on); then the rest of the stream
                stall_pending = False
                await w.flush()
                await asyncio.sleep(plan.delay_ms / 1000)
                n = sreq.generated
            if stop_mid and sent >= cut and sent < osl:
                st.loop.cancel(sreq)
                await w.flush()
                if "reset_mid_stream" in plan:
                    out.outcome, out.status = "reset", 200
                    _reset(request)
                    return resp
                out.outcome, out.status = "error", 200
                await w.event(error_body("Engine error mid-stream (servelens sim fault error_mid_stream)",
                                         "InternalServerError", 500))
                await w.flush()
                await resp.write_eof()
                return resp
    if no_done:
        out.outcome = "incomplete"
        await w.flush()
        await resp.write_eof()
        return resp
    out.finish = finish
    if p.include_usage:
        await w.event(ch.usage_chunk(osl, sreq.cached_tokens))
    await w.event(b"[DONE]", last=True)
    await w.flush()
    await resp.write_eof()
    return resp


def _reset(request: web.Request) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0 then close)."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def _whole(request: web.Request, st: SimState, p: Parsed, plan: FaultPlan, sreq: SimRequest,
                 ev: asyncio.Event, words: list[str], finish: str, rid: str, out: _Outcome) -> web.StreamResponse:
    if "slow_start" in plan:
        await asyncio.sleep(plan.delay_ms / 1000)
    _submit(st, sreq)
    osl = sreq.osl_target
    stop_at = max(1, osl // 2) if ("error_mid_stream" in plan or "reset_mid_stream" in plan) else osl
    while sreq.generated < min(osl, stop_at) or (stop_at == osl and not sreq.finished):
        if sreq.finished:  # let go before its tokens were out (shut down, or a step failed)
            out.outcome, out.status = "error", 500
            return _error_response(500, "Engine dropped the request (servelens sim)", "InternalServerError", rid)
        await ev.wait()
        ev.clear()
    if stop_at < osl:
        st.loop.cancel(sreq)
        if "reset_mid_stream" in plan:
            out.outcome = "reset"
            _reset(request)
            return web.Response(status=500)
        out.outcome, out.status = "error", 500
        return _error_response(500, "Engine error (servelens sim fault error_mid_stream)", "InternalServerError", rid)
    text = "".join([" " + x for x in words])
    isl = len(p.prompt_ids)
    cached = sreq.cached_tokens if st.engine.cache.enabled else None
    nd = "null_details" in plan
    if p.endpoint == "chat_completions":
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if "tool_calls" in plan:
            msg = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_" + rid[-12:], "type": "function",
                 "function": {"name": "lookup", "arguments": '{"text": "' + text + '"}'}}]}
        elif "reasoning" in plan:
            msg = {"role": "assistant", "content": None, "reasoning_content": text}
        body: dict[str, Any] = {"id": rid, "object": "chat.completion", "created": st.created,
                                "model": st.config.model,
                                "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
                                "usage": _usage(isl, osl, cached, nd)}
    else:
        body = {"id": rid, "object": "text_completion", "created": st.created, "model": st.config.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                             "stop_reason": None}],
                "usage": _usage(isl, osl, cached, nd)}
    out.finish = finish
    return web.Response(body=_enc.encode(body), content_type="application/json", headers={"x-request-id": rid})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    return await _handle(request, "chat_completions")


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``."""
    return await _handle(request, "completions")


async def post_only(request: web.Request) -> web.Response:
    """Any method but POST on a completions path: 405 with an OpenAI error object and ``Allow: POST``."""
    return web.Response(status=405, content_type="application/json", headers={"Allow": "POST"},
                        body=error_body(f"{request.method} is not allowed on {request.path}; use POST",
                                        "MethodNotAllowedError", 405))


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``."""
    st = request.app[SIM_STATE]
    return web.json_response({"object": "list", "data": [
        {"id": st.config.model, "object": "model", "created": st.created, "owned_by": "servelens-sim",
         "root": st.config.model, "max_model_len": st.config.max_model_len}]})


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 with an empty body."""
    return web.Response(status=200)


async def tokenize_handler(request: web.Request) -> web.Response:
    """``POST /tokenize``: ``{"prompt": str}`` or ``{"messages": [...]}`` -> ``{"count", "tokens",
    "max_model_len"}`` (vLLM's shape)."""
    st = request.app[SIM_STATE]
    try:
        obj = decode_json(await request.read())
        if not isinstance(obj, dict):
            raise ValueError("request body must be a JSON object")
        if "messages" in obj:
            if not isinstance(obj["messages"], list):
                raise ValueError("'messages' must be a list")
            ids = chat_prompt_tokens(obj["messages"])
        else:
            ids = _prompt_ids(obj.get("prompt"))
    except (ValueError, msgspec.DecodeError) as exc:
        return web.Response(status=400, body=error_body(str(exc), "BadRequestError", 400),
                            content_type="application/json")
    return web.json_response({"count": len(ids), "tokens": ids, "max_model_len": st.config.max_model_len})


async def metrics_handler(request: web.Request) -> web.Response:
    """``GET /metrics``: vLLM-named engine metrics."""
    st = request.app[SIM_STATE]
    e = st.engine
    body = st.metrics.exposition(len(e.running), len(e.waiting), e.kv_reserved / e.params.kv_capacity_tokens,
                                 e.cache.query_tokens, e.cache.hit_tokens)
    return web.Response(body=body, headers={"content-type": "text/plain; version=0.0.4; charset=utf-8"})


async def debug_requests(request: web.Request) -> web.Response:
    """``GET /debug/requests``: every kept truth record as ``{"data": [...]}`` (debug only)."""
    st = request.app[SIM_STATE]
    return web.Response(body=_enc.encode({"data": [r.to_dict() for r in st.truth.records()]}),
                        content_type="application/json")


async def debug_stats(request: web.Request) -> web.Response:
    """``GET /debug/stats``: step-loop lateness against the model and engine counters (debug only)."""
    st = request.app[SIM_STATE]
    e = st.engine
    s = st.loop.stats.summary()
    s.update(running=len(e.running), waiting=len(e.waiting), tokens_emitted=e.tokens_emitted,
             busy_s=st.loop.stats.busy_ns / 1e9, speedup=st.config.speedup)
    return web.json_response(s)


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    st = app[SIM_STATE]
    st.loop.start()
    yield
    await st.loop.stop()
    st.truth.close()


def make_app(config: SimConfig | None = None) -> web.Application:
    """The aiohttp application of a sim. Run it with ``handler_cancellation=True`` (as
    :func:`start_server` does) so that a client disconnect cancels its request within one step.

    Raises OSError if the truth log cannot be opened.
    """
    config = config or SimConfig()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[SIM_STATE] = SimState(config)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    for path in ("/v1/chat/completions", "/v1/completions"):  # other methods: an OpenAI error, not text
        app.router.add_route("*", path, post_only)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/tokenize", tokenize_handler)
    app.router.add_get("/metrics", metrics_handler)
    if config.debug:
        app.router.add_get("/debug/requests", debug_requests)
        app.router.add_get("/debug/stats", debug_stats)
    app.cleanup_ctx.append(_lifecycle)
    return app


@dataclass
class RunningServer:
    """A started sim: its runner, bound port and state."""

    runner: web.AppRunner
    port: int
    state: SimState

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (no trailing slash)."""
        return f"http://{self.state.config.host}:{self.port}"

    async def stop(self) -> None:
        """Stop serving and clean up."""
        await self.runner.cleanup()


async def start_server(config: SimConfig) -> RunningServer:
    """Start a sim in the running event loop. Raises OSError if the port cannot be bound."""
    app = make_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           keepalive_timeout=config.keepalive_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise listen_error(config.host, config.port, exc) from None
    server = site._server
    assert server is not None
    port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
    return RunningServer(runner, port, app[SIM_STATE])


__all__ = ["SIM_STATE", "RunningServer", "SimConfig", "SimState", "make_app", "parse_request", "start_server"]
