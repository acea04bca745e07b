"""Test helper: a small OpenAI-compatible chat endpoint that answers eval items from their answer key
(:mod:`servelens.sim.answers`) with a set accuracy, and fails, hangs or calls tools on demand.

Example::

    async with answering_endpoint() as ep:
        ep.key = answer_key_of("gsm8k", items)
        ep.policy = AnswerPolicy(0.8, seed=1)
        await run_eval(EvalConfig(url=ep.url, suite="gsm8k"))
        len(ep.bodies)  # what it received

Binds 127.0.0.1 on a free port; stopped on exit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from servelens.sim.answers import AnswerEntry, AnswerKey, AnswerPolicy


@dataclass
class Endpoint:
    """Knobs and a log of what the endpoint received."""

    url: str = ""
    model: str = "fake-model"
    key: AnswerKey = field(default_factory=lambda: AnswerKey([]))
    policy: AnswerPolicy = field(default_factory=lambda: AnswerPolicy(1.0))
    fail_first: int = 0  # the first N requests answer 503
    fail_status: int | None = None  # every request answers this status
    fail_prompts: set[str] = field(default_factory=set)  # requests whose last message contains one: 500
    hang_prompts: set[str] = field(default_factory=set)  # never answered (the client times out)
    error_200_prompts: set[str] = field(default_factory=set)  # answered 200 with an error object, no choices
    context_chars: int | None = None  # a request whose messages' JSON is longer: 400, context length
    stop_after: int | None = None  # requests after the first N answer 500 (an endpoint that went away)
    tool_reply: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # the reply message for a tools request
    bodies: list[dict[str, Any]] = field(default_factory=list)
    never: asyncio.Event = field(default_factory=asyncio.Event)


def _last(body: dict[str, Any]) -> str:
    return str(body["messages"][-1].get("content") or "")


def key_of(lines: list[dict[str, str]]) -> AnswerKey:
    """An answer key from :func:`servelens.eval.suites.answer_key` lines."""
    return AnswerKey(AnswerEntry(**e) for e in lines)


@asynccontextmanager
async def answering_endpoint() -> AsyncIterator[Endpoint]:
    """Start the endpoint (``ep.url``); stop it on exit."""
    ep = Endpoint()

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": ep.model, "object": "model"}]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        ep.bodies.append(body)
        n = len(ep.bodies)
        last = _last(body)
        if ep.fail_status is not None or n <= ep.fail_first or any(p in last for p in ep.fail_prompts) or (
                ep.stop_after is not None and n > ep.stop_after):
            status = ep.fail_status or (503 if n <= ep.fail_first else 500)
            return web.json_response({"error": {"message": "engine unavailable", "type": "err", "code": status}},
                                     status=status)
        if ep.context_chars is not None and len(json.dumps(body["messages"])) > ep.context_chars:
            return web.json_response({"error": {"message": "This model's maximum context length is 2048 tokens",
                                                "type": "BadRequestError", "code": 400}}, status=400)
        if any(p in last for p in ep.error_200_prompts):
            return web.json_response({"error": {"message": "model overloaded", "type": "server_error"}})
        if any(p in last for p in ep.hang_prompts):
            await ep.never.wait()
        if body.get("tools") and ep.tool_reply is not None:
            message = ep.tool_reply(body)
        else:
            message = {"role": "assistant", "content": ep.key.reply(body["messages"], ep.policy) or "no idea"}
        return web.json_response({
            "id": f"c{n}", "object": "chat.completion", "model": ep.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(json.dumps(body["messages"])) // 4, "completion_tokens": 7},
        })

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    ep.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield ep
    finally:
        ep.never.set()
        await runner.cleanup()
