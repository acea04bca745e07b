"""``POST /v1/chat/completions`` and ``POST /v1/completions``: one request from arrival to its
truth record. Read and validate the body (:mod:`~servelens.sim.request`), draw its faults, fix its
output length and text, hand it to the engine, reply (:mod:`~servelens.sim.replies`), record.

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
- ``n`` > 1 (at most :data:`~servelens.sim.request.MAX_N`): each choice is an engine request of its
  own (as vLLM v1's child requests: scheduled, prefilled and decoded on its own, sharing the prompt's
  prefix-cache blocks), with its own EOS point and words (choice 0 draws what ``n`` = 1 would), its
  own ``finish_reason``; streamed chunks carry one choice each (``index``), interleaved as the
  engine emits them, continuous usage counting that choice's tokens; the final usage (and a whole
  reply's) has ``completion_tokens`` summed over the choices. Faults act at the first choice's
  middle. The truth record is the first choice's timing with the summed ``osl``.
- ``created`` is the request's arrival time (unix s), as vLLM.
- Every response has ``x-request-id`` (the client's, if it sent one) joining it to its
  :class:`~servelens.sim.truth.TruthRecord`.
- Bad input gets an OpenAI error object: 400 (``BadRequestError``), 404 for an unknown model.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import zlib
from array import array

import msgspec
from aiohttp import web

from servelens.core.openai import decode_json, error_body
from servelens.serving import unreadable_body
from servelens.sim import faults as F
from servelens.sim.answers import answered
from servelens.sim.faults import FaultPlan
from servelens.sim.prefix_cache import block_hashes
from servelens.sim.replies import Choice, Outcome, error_response, stream_reply, whole_reply
from servelens.sim.request import BadRequest, parse_request
from servelens.sim.scheduler import SimRequest
from servelens.sim.state import SIM_STATE
from servelens.sim.tokenizer import generated_words
from servelens.sim.truth import TruthRecord

_HTTP_FAULT_TEXT = {
    429: ("Rate limit exceeded (servelens sim fault http_429)", "RateLimitError"),
    500: ("Internal server error (servelens sim fault http_500)", "InternalServerError"),
    503: ("Service unavailable (servelens sim fault http_503)", "ServiceUnavailableError"),
}


def _natural_length(seed: int, prompt_crc: int, lo: int, hi: int) -> int:
    return lo + zlib.crc32(f"eos:{seed}:{prompt_crc}".encode()) % (hi - lo + 1)


async def _handle(request: web.Request, endpoint: str) -> web.StreamResponse:
    st = request.app[SIM_STATE]
    cfg = st.config
    arrival = time.perf_counter_ns()
    created = int(time.time())  # the response's ``created``: the request's time (unix s), as vLLM
    rid = request.headers.get("x-request-id") or (
        ("chatcmpl-" if endpoint == "chat_completions" else "cmpl-") + uuid.uuid4().hex)
    out = Outcome()
    choices: list[Choice] = []
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
            return error_response(exc.status, str(exc), exc.type_, rid, exc.param)
        isl = len(p.prompt_ids)
        stream = p.stream
        status = plan.http_status
        if status is not None:
            out.outcome, out.status = "error", status
            msg, typ = _HTTP_FAULT_TEXT[status]
            return error_response(status, msg, typ, rid)
        prompt_crc = zlib.crc32(array("q", p.prompt_ids).tobytes())
        # an eval item with an answer key: the key's right or wrong reply instead of generated words
        answer = (answered(st.answers, st.answer_policy, obj.get("messages"), p.max_tokens)
                  if endpoint == "chat_completions" else None)
        ev = asyncio.Event()
        hashes = block_hashes(p.prompt_ids, cfg.params.block_size)
        for index in range(p.n):
            # choice 0 draws as a request with n=1 does; the others their own EOS point and words
            key = prompt_crc if index == 0 else zlib.crc32(f"{prompt_crc}:{index}".encode())
            if p.ignore_eos:
                osl, finish = p.max_tokens, "length"
            else:
                natural = max(p.min_tokens, _natural_length(p.seed, key, cfg.eos_min_tokens, cfg.eos_max_tokens))
                osl, finish = (natural, "stop") if natural < p.max_tokens else (p.max_tokens, "length")
            if "tool_calls" in plan and endpoint == "chat_completions":
                finish = "tool_calls"
            if answer is not None:
                words, finish = answer
                osl = len(words)
            sreq = SimRequest(rid if index == 0 else f"{rid}-{index}", hashes, isl, osl, arrival,
                              tokens_per_step=F.MULTI_TOKENS_PER_STEP if "multi_token" in plan else 1,
                              notify=ev.set)
            if sreq.kv_reserved > cfg.params.kv_capacity_tokens:
                out.outcome, out.status = "invalid", 400
                choices = []
                return error_response(400, f"prompt plus max_tokens exceeds the KV cache capacity of "
                                      f"{cfg.params.kv_capacity_tokens} tokens", "BadRequestError", rid)
            if answer is None:
                words = generated_words(osl, (p.seed, key), multibyte_only="split" in plan)
            choices.append(Choice(index, sreq, words, finish))
        if "slow_headers" in plan:  # nothing sent and no engine work until the delay is over
            await asyncio.sleep(plan.delay_ms / 1000)
        if p.stream:
            return await stream_reply(request, st, p, plan, choices, ev, rid, out, created)
        return await whole_reply(request, st, p, plan, choices, ev, rid, out, created)
    except (asyncio.CancelledError, ConnectionResetError):
        if out.outcome == "ok":
            out.outcome = "cancelled"
        raise
    finally:
        end = time.perf_counter_ns()
        final_outcome = out
        held = list(choices)

        def record() -> None:
            first = held[0].sreq if held else None
            times = tuple(first.token_times_ns) if first is not None else ()
            cached = first.cached_tokens if first is not None else 0
            o = final_outcome
            rec = TruthRecord(
                request_id=rid, endpoint=endpoint, stream=stream, arrival_ns=arrival,
                admitted_ns=first.admitted_ns if first is not None else None,
                first_token_ns=times[0] if times else None, token_times_ns=times, end_ns=end, isl=isl,
                cached_tokens=cached, osl=sum(len(c.sreq.token_times_ns) for c in held), outcome=o.outcome,
                finish_reason=o.finish if o.outcome == "ok" else None, http_status=o.status,
                faults=tuple(sorted(plan.modes)),
                cancel_ns=first.cancel_ns if first is not None else None,
                tokens_at_cancel=first.tokens_at_cancel if first is not None else None,
                choices=len(held) or 1,
            )
            st.truth.add(rec)
            for c in held:  # each choice is a request of the engine (vLLM v1: a child request each)
                r = c.sreq
                if r.admitted_ns is not None:
                    st.metrics.observe_request(arrival, tuple(r.token_times_ns), end, isl, r.cached_tokens,
                                               c.finish if o.outcome == "ok" else None, r.admitted_ns)

        pending = [c.sreq for c in held if c.sreq.submitted and not c.sreq.finished]
        if pending:
            # the record is written once the engine has dropped every choice (at its next step), so
            # it holds every token generated, including one from a step in flight at the cancel
            left = [len(pending)]

            def one_done() -> None:
                left[0] -= 1
                if left[0] == 0:
                    record()

            for r in pending:
                r.on_done = one_done
                st.loop.cancel(r)
        else:
            record()


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
