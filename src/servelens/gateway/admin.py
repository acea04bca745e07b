"""The gateway's own endpoints: ``GET /health`` (the gateway is up), ``GET /ready`` (every upstream
answers), ``GET /v1/models`` (the upstream's list, merged over upstreams when models are mapped to
several), the 405 for other methods on a measured path (and on ``/metrics``, ``/health``, ``/ready``:
:func:`~.http.get_only`), and the 404 for ``/metrics`` on the API port
of a gateway with a metrics listener (the scrape itself: :mod:`.scrape`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec
from aiohttp import web

from servelens.core.openai import decode_json
from servelens.gateway.http import forward_request_headers, method_not_allowed, openai_error
from servelens.gateway.models import MAX_MODEL_LIST_BYTES, read_capped
from servelens.gateway.upstream import redacted_url

if TYPE_CHECKING:
    from servelens.gateway.app import Gateway

class AdminEndpoints:
    """Handlers of the gateway's own endpoints (see the module docstring)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health``: the gateway itself is up."""
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        """``GET /ready``: 200 when every upstream answers ``/v1/models`` below 500, else 503."""
        session = self.gateway.session

        async def probe(url: str) -> str:
            try:
                async with asyncio.timeout(2.0), session.get(f"{url}/v1/models") as resp:
                    # the status is the answer: the body is not read (the connection is not reused)
                    return "ok" if resp.status < 500 else f"HTTP {resp.status}"
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                return f"unreachable: {type(exc).__name__}"

        ups = self.gateway.config.upstreams
        states = await asyncio.gather(*(probe(u) for u in ups))
        ok = all(s == "ok" for s in states)
        return web.json_response(
            {"status": "ready" if ok else "not ready",
             "upstreams": {redacted_url(u): st for u, st in zip(ups, states, strict=True)}},
            status=200 if ok else 503,
        )

    async def metrics_elsewhere(self, request: web.Request) -> web.Response:
        """``/metrics`` on the API port of a gateway with a metrics listener: 404, so that the API port
        exposes no metrics (nor the engine's own ``/metrics``, which the gateway's shadows)."""
        return openai_error(404, "not found: this gateway serves /metrics on its metrics listener",
                            "invalid_request_error", "not_found")

    async def list_models(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/models``: passed through (one upstream) or merged (models on several)."""
        gw = self.gateway
        if len(gw.config.upstreams) == 1:
            return await gw.passthrough.handle(request)
        data: list[dict[str, Any]] = []
        seen: set[str] = set()
        headers = forward_request_headers(request.headers, measured=False)
        for url in gw.config.upstreams:
            try:
                async with asyncio.timeout(5.0), gw.session.get(f"{url}/v1/models", headers=headers) as resp:
                    obj = decode_json(await read_capped(resp, MAX_MODEL_LIST_BYTES)) if resp.status == 200 else {}
            except (aiohttp.ClientError, OSError, TimeoutError, msgspec.DecodeError, ValueError):
                obj = {}
            entries = obj.get("data") if isinstance(obj, dict) else None
            for e in entries if isinstance(entries, list) else []:
                mid = e.get("id") if isinstance(e, dict) else None
                if isinstance(mid, str) and gw.router.lookup(mid) == url and mid not in seen:
                    seen.add(mid)
                    data.append(e)
        for name in gw.router.routes:
            if name not in seen:
                data.append({"id": name, "object": "model", "owned_by": "servelens"})
        return web.json_response({"object": "list", "data": data})

    async def post_only(self, request: web.Request) -> web.Response:
        """Any method but POST on a measured path: 405 in the OpenAI error format."""
        return method_not_allowed(request, "POST")
