"""servelens gateway: a streaming OpenAI-compatible reverse proxy that measures every request.

Where to read what:

* ``app``: the application, its routes and lifecycle; ``server``: listening on a port, shutdown.
* ``workers``: ``--workers N``, a supervisor and N worker processes on one port; ``published``: each
  worker's state in a file, and the ``/metrics`` summed over the workers.
* ``measured``: what happens to a chat or completions request, top to bottom; ``relay``: a stream,
  chunk by chunk; ``meter``: what a stream's bytes say (TTFT, ITL, usage, outcome); ``usage``: the
  usage injected into requests and cut from streams; ``accounting``: how a request is counted, once.
* ``admin``: ``/health``, ``/ready``, ``/v1/models``; ``scrape``: ``/metrics`` (in slices, gzip, the
  metrics listener of ``metrics_port``); ``passthrough``: every other path.
* ``upstream``, ``upstream_response``, ``inflate``: the HTTP/1.1 client of measured requests.
* ``http``: forwarded headers, error replies, request bodies; ``models``: model discovery and routing;
  ``prompt``: prompt tokens at arrival (``--tokenizer``); ``requestlog``: the JSONL request log;
  ``config``: the configuration; ``testing``: a gateway and scripted upstreams for tests.

May import: ``servelens.core``, ``servelens.prometheus``, ``servelens.serving`` (and aiohttp,
httptools, msgspec); nothing above it (``bench``, ``report``, ``cli``, ...).

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
