"""A tiny OpenAI-compatible streaming upstream for the bench client's tests (no sim needed)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web


@dataclass
class Upstream:
    """Knobs and a log of what the tiny upstream received."""

    url: str = ""
    model: str = "tiny"
    continuous_usage_ok: bool = True
    gap_s: float = 0.0
    fail_status: int | None = None  # every request answers this status
    truncate_after: int | None = None  # end the stream after N output chunks, without [DONE]
    tokens_per_chunk: int = 1
    prompt_extra_tokens: int = 0  # added to usage.prompt_tokens (as a chat template would)
    context_limit: int | None = None  # prompt tokens (with the extra) + max_tokens above it: a 400, as vLLM's
    more_models: tuple[str, ...] = ()  # listed after ``model`` by /v1/models
    metrics_ok_scrapes: int | None = None  # /metrics answers 500 after this many scrapes
    hold_until: int | None = None  # completions answer only once this many have arrived (the probe not held)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)  # notified as each one arrives
    scrapes: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)


def _is_probe(body: dict[str, Any]) -> bool:
    """The bench's probe request (its one-token prompt), sent before a run when a context is known."""
    from servelens.bench.control import PROBE_PROMPT
    msgs = body.get("messages")
    text = msgs[-1].get("content") if isinstance(msgs, list) and msgs else body.get("prompt")
    return text == PROBE_PROMPT


def _words(body: dict[str, Any]) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    return len(str(body.get("prompt", "")).split())


@pytest.fixture
def open_loop_starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``t_start`` (perf_counter ns) of each open loop the runner starts: the clock its due times
    count from, so that a test can check no request was sent before its due time."""
    from servelens.bench import runner

    starts: list[int] = []
    real = runner.open_loop

    async def spy(items: Any, one: Any, t_start: int, *args: Any, **kwargs: Any) -> None:
        starts.append(t_start)
        await real(items, one, t_start, *args, **kwargs)

    monkeypatch.setattr(runner, "open_loop", spy)
    return starts


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    ids = itertools.count()

    async def models(_: web.Request) -> web.Response:
        listed = [{"id": m, "object": "model", "max_model_len": 4096} for m in (up.model, *up.more_models)]
        return web.json_response({"object": "list", "data": listed})

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        so = body.get("stream_options") or {}
        if so.get("continuous_usage_stats") and not up.continuous_usage_ok:
            return web.json_response({"error": {"message": "continuous_usage_stats not supported",
                                                "type": "invalid_request_error", "param": None, "code": 400}},
                                     status=400)
        up.bodies.append(body)
        async with up.arrived:
            up.arrived.notify_all()
            if up.hold_until is not None and not _is_probe(body):
                await up.arrived.wait_for(
                    lambda: sum(not _is_probe(b) for b in up.bodies) >= (up.hold_until or 0))
        rid = f"req-{next(ids)}"
        if up.fail_status is not None:
            return web.json_response({"error": {"message": "no capacity", "type": "overloaded", "param": None,
                                                "code": up.fail_status}}, status=up.fail_status,
                                     headers={"x-request-id": rid})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-request-id": rid})
        await resp.prepare(request)
        chat = "messages" in body
        pt = _words(body) + up.prompt_extra_tokens
        n = int(body.get("max_tokens", 4))
        if up.context_limit is not None and pt + n > up.context_limit:
            return web.json_response({"error": {"message": f"{pt} prompt + {n} output tokens exceed the context "
                                                f"{up.context_limit}", "type": "BadRequestError", "param": None,
                                                "code": 400}}, status=400, headers={"x-request-id": rid})
        cont = bool(so.get("continuous_usage_stats"))

        def usage(ct: int) -> dict[str, Any]:
            return {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct,
                    "prompt_tokens_details": {"cached_tokens": 0}}

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        if chat:
            await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "usage": None})
        done = 0
        chunks = 0
        while done < n:
            k = min(up.tokens_per_chunk, n - done)
            done += k
            chunks += 1
            if up.gap_s:
                await asyncio.sleep(up.gap_s)
            text = " w" * k
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            if done == n:
                choice["finish_reason"] = "length"
            await send({"choices": [choice], "usage": usage(done) if cont else None})
            if up.truncate_after is not None and chunks >= up.truncate_after:
                return resp  # no [DONE], no finish_reason
        await send({"choices": [], "usage": usage(n)})
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def metrics(_: web.Request) -> web.Response:
        # an engine's /metrics without servelens by-ISL families
        up.scrapes += 1
        if up.metrics_ok_scrapes is not None and up.scrapes > up.metrics_ok_scrapes:
            return web.Response(status=500, text="scrape failed")
        text = ('# HELP vllm:num_requests_running Running\n# TYPE vllm:num_requests_running gauge\n'
                'vllm:num_requests_running{model_name="tiny"} 0.0\n')
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    up.url = f"http://127.0.0.1:{port}"
    try:
        yield up
    finally:
        await runner.cleanup()
