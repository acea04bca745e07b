"""servelens gateway: a streaming OpenAI-compatible reverse proxy that measures every request.

Library use::

    config = GatewayConfig(upstream="http://127.0.0.1:8000")
    running = await start_gateway(config)      # in a running event loop
    ...                                         # running.url, running.metrics
    await running.close()

Tests: :func:`servelens.gateway.testing.run_gateway`. CLI: ``servelens gateway --upstream URL``.
"""

from servelens.gateway.app import Gateway, build_app
from servelens.gateway.config import GatewayConfig, load_config_file
from servelens.gateway.server import RunningGateway, start_gateway

__all__ = ["Gateway", "GatewayConfig", "RunningGateway", "build_app", "load_config_file", "start_gateway"]
