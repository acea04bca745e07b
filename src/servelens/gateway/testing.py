"""Test helper: a gateway in the current event loop on a free loopback port.

Example::

    async with run_sim() as sim, run_gateway(sim.url, request_log=str(tmp_path / "log.jsonl")) as gw:
        ...  # talk to gw.url; read gw.metrics
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from servelens.gateway.app import Gateway
from servelens.gateway.config import GatewayConfig
from servelens.gateway.server import start_gateway
from servelens.prometheus import FrontendMetrics


@dataclass(frozen=True)
class GatewayHandle:
    """A running test gateway.

    Attributes:
        url: ``http://127.0.0.1:<port>`` (append ``/v1`` for an OpenAI SDK ``base_url``).
        metrics: the :class:`~servelens.prometheus.FrontendMetrics` it records into.
        gateway: the :class:`~servelens.gateway.app.Gateway` (config, router, session).
        port: the bound port.
    """

    url: str
    metrics: FrontendMetrics
    gateway: Gateway
    port: int


@asynccontextmanager
async def run_gateway(
    upstream_url: str | None = None, *, metrics: FrontendMetrics | None = None, **config: Any
) -> AsyncIterator[GatewayHandle]:
    """Run a gateway in front of ``upstream_url`` until the block ends.

    ``config``: any :class:`~servelens.gateway.config.GatewayConfig` field (``isl_buckets``,
    ``models``, ``continuous_usage``, ``request_log``, ``read_timeout_s``, ...). Binds
    127.0.0.1 on a free port unless ``host``/``port`` are given. Raises ValueError for bad config.
    """
    values = {"host": "127.0.0.1", "port": 0, **config}
    if upstream_url is not None:
        values["upstream"] = upstream_url
    cfg = GatewayConfig.from_mapping(values)
    running = await start_gateway(cfg, metrics)
    try:
        yield GatewayHandle(running.url, running.metrics, running.gateway, running.port)
    finally:
        await running.close()
