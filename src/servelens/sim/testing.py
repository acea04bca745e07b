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

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from servelens.sim.scheduler import Engine, StepLoop
from servelens.sim.server import RunningServer, SimConfig, start_server
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
    def loop(self) -> StepLoop:
        """The step loop (``loop.stats`` has step lateness)."""
        return self._server.state.loop

    def truth(self) -> list[TruthRecord]:
        """Every finished request's truth record, oldest first."""
        return self._server.state.truth.records()

    def get_truth(self, request_id: str) -> TruthRecord | None:
        """The record of ``request_id`` if finished, else None."""
        return self._server.state.truth.get(request_id)

    async def wait_truth(self, request_id: str, timeout: float = 5.0) -> TruthRecord:
        """The record of ``request_id``, waiting for the request to end. Raises TimeoutError."""
        return await self._server.state.truth.wait(request_id, timeout)


@asynccontextmanager
async def run_sim(**overrides: Any) -> AsyncIterator[SimHandle]:
    """Start a sim on a free 127.0.0.1 port; stop it on exit.

    Args:
        overrides: any :class:`~servelens.sim.server.SimConfig` field (``preset``, ``speedup``,
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
