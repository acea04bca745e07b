"""The simulated engine's HTTP server (aiohttp): OpenAI-compatible completions and chat
completions, streaming and not, driven by one :class:`~servelens.sim.steploop.StepLoop`.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
``GET /health``, ``POST /tokenize``, ``GET /metrics`` (vLLM names, see :mod:`servelens.prometheus.sim_engine`),
and, only with ``debug=True``, ``GET /debug/requests`` (truth records) and ``GET /debug/stats``.

See :mod:`servelens.sim.completions` for what a completion request does (its semantics), and
:mod:`servelens.sim.endpoints` for the rest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from servelens.serving import listen_error
from servelens.sim.completions import chat_completions, completions, post_only
from servelens.sim.config import SimConfig
from servelens.sim.endpoints import debug_requests, debug_stats, health, metrics_handler, models, tokenize_handler
from servelens.sim.state import SIM_STATE, SimState


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    st = app[SIM_STATE]
    st.loop.start()
    yield
    await st.loop.stop()
    st.truth.close()


def make_app(config: SimConfig | None = None) -> web.Application:
    """The aiohttp application of a sim. Run it with ``handler_cancellation=True`` (as
    :func:`start_server` does) so that a client disconnect cancels its request within one step.

    Raises OSError if the truth log cannot be opened.
    """
    config = config or SimConfig()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[SIM_STATE] = SimState(config)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    for path in ("/v1/chat/completions", "/v1/completions"):  # other methods: an OpenAI error, not text
        app.router.add_route("*", path, post_only)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/tokenize", tokenize_handler)
    app.router.add_get("/metrics", metrics_handler)
    if config.debug:
        app.router.add_get("/debug/requests", debug_requests)
        app.router.add_get("/debug/stats", debug_stats)
    app.cleanup_ctx.append(_lifecycle)
    return app


@dataclass
class RunningServer:
    """A started sim: its runner, bound port and state."""

    runner: web.AppRunner
    port: int
    state: SimState

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (no trailing slash)."""
        return f"http://{self.state.config.host}:{self.port}"

    async def stop(self) -> None:
        """Stop serving and clean up."""
        await self.runner.cleanup()


async def start_server(config: SimConfig) -> RunningServer:
    """Start a sim in the running event loop. Raises OSError if the port cannot be bound."""
    app = make_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           keepalive_timeout=config.keepalive_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise listen_error(config.host, config.port, exc) from None
    server = site._server
    assert server is not None
    port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
    return RunningServer(runner, port, app[SIM_STATE])


__all__ = ["SIM_STATE", "RunningServer", "SimConfig", "SimState", "make_app", "start_server"]
