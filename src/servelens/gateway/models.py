"""Which model names exist and where they are served (the only source of ``model`` label values).

Names come from the configuration, or, when none are named there, from the default upstream's
``GET /v1/models`` (``data[].id``), polled at start, every ``models_refresh_s`` and on a request
for an unknown name (at most once per ``repoll_min_interval_s``, one poll at a time). Every name
is registered with :class:`~servelens.prometheus.FrontendMetrics` (so its series exist at zero)
up to ``max_models``; a request can never add a label value.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import aiohttp
import msgspec

from servelens.core.openai import decode_json
from servelens.gateway.config import GatewayConfig
from servelens.gateway.upstream import redacted_url
from servelens.prometheus import FrontendMetrics
from servelens.serving import client_error_reason

log = logging.getLogger("servelens.gateway")

MAX_MODEL_LIST_BYTES = 4 * 1024 * 1024
"""Largest ``/v1/models`` answer read (bytes; a list of thousands of models is well under it)."""


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body of ``resp``, read as it comes; raises ValueError once it is over ``limit`` bytes
    (an upstream whose answer never ends must not fill the gateway's memory)."""
    parts: list[bytes] = []
    size = 0
    async for part in resp.content.iter_any():
        size += len(part)
        if size > limit:
            raise ValueError(f"answer over {limit} bytes")
        parts.append(part)
    return b"".join(parts)


@dataclass(frozen=True)
class PollResult:
    """One ``/v1/models`` poll: ``ok`` when the upstream answered 200 with a model list."""

    ok: bool
    names: tuple[str, ...] = ()
    error: str = ""


async def fetch_models(session: aiohttp.ClientSession, upstream: str, timeout_s: float = 5.0) -> PollResult:
    """``GET {upstream}/v1/models`` -> the advertised model ids (never raises)."""
    try:
        async with asyncio.timeout(timeout_s), session.get(f"{upstream}/v1/models") as resp:
            if resp.status != 200:
                return PollResult(False, error=f"HTTP {resp.status}")
            body = await read_capped(resp, MAX_MODEL_LIST_BYTES)
    except ValueError as exc:
        return PollResult(False, error=str(exc))
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return PollResult(False, error=client_error_reason(exc))
    try:
        obj = decode_json(body)
    except msgspec.DecodeError:
        return PollResult(False, error="not JSON")
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        return PollResult(False, error="no data list")
    names = [d.get("id") for d in data if isinstance(d, dict)]
    return PollResult(True, tuple(n for n in names if isinstance(n, str) and n))


class ModelRouter:
    """Model name -> upstream base URL, backed by the metrics' registered models.

    Args:
        config: the gateway configuration (models, default upstream, poll periods, max_models).
        metrics: where names are registered.
    """

    def __init__(self, config: GatewayConfig, metrics: FrontendMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.routes: dict[str, str] = {}
        self.last_poll: PollResult | None = None
        self._last_poll_at = -1e18
        self._poll_lock = asyncio.Lock()
        self._full_warned = False
        for name, url in config.models:
            self._add(name, url)

    def _add(self, name: str, upstream: str) -> bool:
        if name in self.routes:
            return True
        try:
            self.metrics.register_model(name)
        except ValueError as exc:
            if not self._full_warned:
                log.warning("model %r not registered: %s", name, exc)
                self._full_warned = True
            return False
        self.routes[name] = upstream
        return True

    def lookup(self, name: str) -> str | None:
        """The upstream serving ``name``, or None when it is not registered."""
        return self.routes.get(name)

    @property
    def upstream_down(self) -> bool:
        """True when discovery is on and its latest poll could not reach the upstream."""
        return self.config.discover and self.last_poll is not None and not self.last_poll.ok

    async def poll(self, session: aiohttp.ClientSession) -> PollResult | None:
        """Poll the default upstream's model list now (discovery mode only; one at a time)."""
        if not self.config.discover or self.config.upstream is None:
            return None
        async with self._poll_lock:
            return await self._poll_locked(session)

    async def _poll_locked(self, session: aiohttp.ClientSession) -> PollResult:
        upstream = self.config.upstream
        assert upstream is not None
        self._last_poll_at = time.monotonic()
        result = await fetch_models(session, upstream, min(5.0, self.config.connect_timeout_s))
        self.last_poll = result
        if result.ok:
            for name in result.names:
                self._add(name, upstream)
        return result

    async def _poll_since(self, session: aiohttp.ClientSession, since: float) -> None:
        """Wait for a poll that started at or after ``since`` (``time.monotonic()``), starting one when
        none did: a poll already in flight may have started before the upstream came up, and its
        failure must not be this request's answer. Polls stay one at a time; requests that arrive
        together share one (at most two polls per wave of requests)."""
        async with self._poll_lock:
            if self._last_poll_at < since:
                await self._poll_locked(session)

    async def resolve(self, name: str, session: aiohttp.ClientSession) -> str | None:
        """Like :meth:`lookup`, but an unknown name triggers a re-poll: at most once per
        ``repoll_min_interval_s`` while the upstream answers; while it does not (the latest poll failed, or
        none ended yet: a gateway started before its engine), always, with a poll that started after this
        request arrived, so requests are served as soon as the upstream answers."""
        up = self.routes.get(name)
        if up is not None or not self.config.discover or self.config.upstream is None:
            return up
        now = time.monotonic()
        down = self.last_poll is None or not self.last_poll.ok
        if down or now - self._last_poll_at >= self.config.repoll_min_interval_s:
            await self._poll_since(session, now)
        return self.routes.get(name)

    async def refresh_forever(self, session: aiohttp.ClientSession) -> None:
        """Re-poll every ``models_refresh_s`` seconds until cancelled."""
        period = self.config.models_refresh_s
        if period <= 0 or not self.config.discover:
            return
        while True:
            await asyncio.sleep(period)
            result = await self.poll(session)
            if result is not None and not result.ok:
                log.warning("cannot list models at %s: %s",
                            ", ".join(map(redacted_url, self.config.upstreams)), result.error)
