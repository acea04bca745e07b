"""Test helper: run a simulated engine in the current event loop.

Example::

    async with run_sim(speedup=50, max_num_seqs=4) as sim:
        async with aiohttp.ClientSession() as s:
            async with s.post(sim.url + "/v1/completions", json={...}) as r:
                rid = r.headers["x-request-id"]
                ...
        rec = await sim.wait_truth(rid, timeout=5)

The truth clock is ``time.perf_counter_ns()`` of this process, so timestamps taken by the test
(or by a gateway running in the same loop) compare directly with the truth records.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from servelens.core.sse import SSEBlock, SSEDecoder
from servelens.sim.config import SimConfig
from servelens.sim.replicas import Replicas
from servelens.sim.scheduler import Engine
from servelens.sim.server import RunningServer, start_server
from servelens.sim.steploop import StepLoop
from servelens.sim.truth import TruthRecord

TEST_SPEEDUP = 10.0
"""Default ``speedup`` of :func:`run_sim` (the CLI's default is 1)."""


@dataclass
class SimHandle:
    """A running sim.

    Attributes:
        url: base URL ``http://127.0.0.1:PORT`` (no trailing slash).
        model: the served model name.
        config: the effective configuration.
    """

    url: str
    model: str
    config: SimConfig
    _server: RunningServer

    @property
    def port(self) -> int:
        """The bound port."""
        return self._server.port

    @property
    def engine(self) -> Engine:
        """The engine (read its ``running``/``waiting``/``cache`` in assertions)."""
        return self._server.state.engine

    @property
    def loop(self) -> StepLoop | Replicas:
        """The step loop, or the replicas' loops (``loop.stats`` has step lateness)."""
        return self._server.state.loop

    def truth(self) -> list[TruthRecord]:
        """Every finished request's truth record, oldest first."""
        return self._server.state.truth.records()

    def get_truth(self, request_id: str) -> TruthRecord | None:
        """The record of ``request_id`` if finished, else None."""
        return self._server.state.truth.get(request_id)

    async def wait_truth(self, request_id: str, timeout: float = 30.0) -> TruthRecord:
        """The record of ``request_id``, waiting for the request to end. Raises TimeoutError."""
        return await self._server.state.truth.wait(request_id, timeout)

    async def wait_truth_count(self, n: int, timeout: float = 30.0) -> None:
        """Until ``n`` requests in all have ended (their truth recorded). Raises TimeoutError."""
        await self._server.state.truth.wait_count(n, timeout)


@asynccontextmanager
async def run_sim(**overrides: Any) -> AsyncIterator[SimHandle]:
    """Start a sim on a free 127.0.0.1 port; stop it on exit.

    Args:
        overrides: any :class:`~servelens.sim.config.SimConfig` field (``preset``, ``speedup``,
            ``model``, ``seed``, ``fault_rate``, ``fault_modes``, ``debug``, ...) or any
            :class:`~servelens.sim.model.ModelParams` field (``max_num_seqs``, ``block_size``, ...).
            ``speedup`` defaults to :data:`TEST_SPEEDUP`, ``port`` to 0.

    Raises ValueError for unknown or bad overrides.
    """
    overrides.setdefault("speedup", TEST_SPEEDUP)
    overrides.setdefault("port", 0)
    overrides.setdefault("host", "127.0.0.1")
    config = SimConfig.build(**overrides)
    server = await start_server(config)
    try:
        yield SimHandle(server.url, config.model, config, server)
    finally:
        await server.stop()


@dataclass(frozen=True)
class StreamCapture:
    """A whole HTTP response as the client received it.

    Attributes:
        status: HTTP status.
        headers: response headers (lower-case names).
        reads: the body as delivered to the client, one entry per read (dechunked).
        blocks: the SSE blocks of the body (decoded with :class:`~servelens.core.sse.SSEDecoder`).
        headers_ns, read_ns: ``perf_counter_ns`` when the headers and each read arrived.
    """

    status: int
    headers: dict[str, str]
    reads: tuple[bytes, ...]
    blocks: tuple[SSEBlock, ...]
    headers_ns: int
    read_ns: tuple[int, ...]

    @property
    def body(self) -> bytes:
        """All reads joined."""
        return b"".join(self.reads)

    @property
    def data(self) -> list[str]:
        """The ``data`` of every block that has one."""
        return [b.data for b in self.blocks if b.data is not None]


async def capture(url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
                  timeout: float = 10.0) -> StreamCapture:
    """POST ``body`` as JSON to ``url`` and record the response read by read (bounded by ``timeout``)."""
    import aiohttp

    reads: list[bytes] = []
    read_ns: list[int] = []
    dec = SSEDecoder()
    blocks: list[SSEBlock] = []
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s,
        s.post(url, json=body, headers=headers or {}) as r,
    ):
        headers_ns = time.perf_counter_ns()
        async for data in r.content.iter_any():
            read_ns.append(time.perf_counter_ns())
            reads.append(data)
            blocks.extend(dec.decode(data))
        blocks.extend(dec.flush())
        return StreamCapture(r.status, {k.lower(): v for k, v in r.headers.items()}, tuple(reads),
                             tuple(blocks), headers_ns, tuple(read_ns))
