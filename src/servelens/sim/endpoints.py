"""The sim's endpoints besides completions: ``GET /v1/models``, ``GET /health``, ``POST /tokenize``,
``GET /metrics`` and, with ``debug=True``, ``GET /debug/requests`` and ``GET /debug/stats``."""

from __future__ import annotations

import msgspec
from aiohttp import web

from servelens.core.openai import decode_json, error_body
from servelens.sim.request import prompt_ids
from servelens.sim.state import SIM_STATE
from servelens.sim.tokenizer import chat_prompt_tokens

_enc = msgspec.json.Encoder()


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
            ids = prompt_ids(obj.get("prompt"))
    except (ValueError, msgspec.DecodeError) as exc:
        return web.Response(status=400, body=error_body(str(exc), "BadRequestError", 400),
                            content_type="application/json")
    return web.json_response({"count": len(ids), "tokens": ids, "max_model_len": st.config.max_model_len})


async def metrics_handler(request: web.Request) -> web.Response:
    """``GET /metrics``: vLLM-named engine metrics."""
    st = request.app[SIM_STATE]
    es = st.engines  # data parallel: the replicas together (KV usage: of their capacity together)
    body = st.metrics.exposition(sum(len(e.running) for e in es), sum(len(e.waiting) for e in es),
                                 sum(e.kv_reserved for e in es) / sum(e.params.kv_capacity_tokens for e in es),
                                 sum(e.cache.query_tokens for e in es), sum(e.cache.hit_tokens for e in es))
    return web.Response(body=body, headers={"content-type": "text/plain; version=0.0.4; charset=utf-8"})


async def debug_requests(request: web.Request) -> web.Response:
    """``GET /debug/requests``: every kept truth record as ``{"data": [...]}`` (debug only)."""
    st = request.app[SIM_STATE]
    return web.Response(body=_enc.encode({"data": [r.to_dict() for r in st.truth.records()]}),
                        content_type="application/json")


async def debug_stats(request: web.Request) -> web.Response:
    """``GET /debug/stats``: step-loop lateness against the model and engine counters (debug only)."""
    st = request.app[SIM_STATE]
    es, stats = st.engines, st.loop.stats
    s = stats.summary()
    s.update(running=sum(len(e.running) for e in es), waiting=sum(len(e.waiting) for e in es),
             tokens_emitted=sum(e.tokens_emitted for e in es), busy_s=stats.busy_ns / 1e9,
             speedup=st.config.speedup, replicas=len(es))
    return web.json_response(s)
