"""Every request the gateway does not measure or answer itself (``/v1/embeddings``, vLLM's
``/tokenize``, ``/version``, ...): relayed to the engine unmeasured, so the gateway stays invisible.

The request target goes upstream exactly as the client sent it; a body naming a ``model`` is routed
by it when models are mapped to several upstreams; a redirect is relayed, not followed (its
``Location`` made relative to the gateway). A POST whose decoded path is a measured one
(``/v1/chat%2Fcompletions``: the engine's server decodes it so) is measured after all.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import aiohttp
import msgspec
from aiohttp import web
from yarl import URL

from servelens.core.openai import decode_json
from servelens.gateway.http import (
    ClientTooSlow,
    forward_request_headers,
    openai_error,
    read_body,
    request_gone,
    too_large,
    too_slow,
    unreadable,
)
from servelens.gateway.measured import MEASURED_PATHS

if TYPE_CHECKING:
    from servelens.gateway.app import Gateway


class Passthrough:
    """Relays unmeasured requests (see the module docstring)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.config = gateway.config

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Any other request (``/v1/*`` and the engine's own paths): forwarded unmeasured (routed by
        ``model`` when mapped). A POST whose decoded path is a measured one (``/v1/chat%2Fcompletions``:
        the engine's server decodes it so) is measured. A redirect is relayed, not followed."""
        if request.method == "POST":
            endpoint = MEASURED_PATHS.get(request.path)
            if endpoint is not None:
                return await self.gateway.measured.handle(request, endpoint)
        try:
            body = await read_body(request, self.config.max_body_bytes, self.config.client_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            return too_large(self.config.max_body_bytes)
        except web.RequestPayloadError as exc:
            return unreadable(request, exc)
        except ClientTooSlow as exc:
            return await too_slow(request, exc)
        upstream = self.config.upstream or self.config.upstreams[0]
        if body and len(self.config.upstreams) > 1:
            with contextlib.suppress(msgspec.DecodeError):
                obj = decode_json(body)
                if isinstance(obj, dict) and isinstance(obj.get("model"), str):
                    upstream = self.gateway.router.lookup(obj["model"]) or upstream
        headers = forward_request_headers(request.headers, measured=False)
        try:
            async with asyncio.timeout(self.config.response_timeout_s):
                # the request target exactly as the client sent it (no decoding, no dot-segment
                # resolution: the upstream sees the same path and query)
                up = await self.gateway.session.request(
                    request.method, URL(upstream + request.raw_path, encoded=True), data=body or None,
                    headers=headers, allow_redirects=False,
                )
        except TimeoutError:
            return openai_error(504, "upstream did not answer in time", "server_error", "upstream_timeout")
        except (aiohttp.ClientError, OSError) as exc:
            return openai_error(502, f"upstream unreachable: {type(exc).__name__}", "server_error",
                                "upstream_unavailable")
        try:
            resp = web.StreamResponse(status=up.status, reason=up.reason,
                                      headers=self.gateway.response_headers(up.headers))
            await resp.prepare(request)
            while True:
                try:
                    data = await up.content.readany()
                except (aiohttp.ClientError, OSError, TimeoutError):
                    request_gone(request)
                    return resp
                if not data:
                    break
                await resp.write(data)
            await resp.write_eof()
            return resp
        except ConnectionError:  # the client went away (a write failed)
            request_gone(request)
            return resp
        finally:
            up.close()
