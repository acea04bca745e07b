"""servelens inside an ASGI server: per-ISL-bucket metrics with no gateway and no extra hop.

``vllm serve MODEL --middleware servelens.asgi.MetricsMiddleware`` puts the gateway's families
(``servelens_*``, by-ISL included) on vLLM's own ``/metrics``. Where to read what: ``middleware``: the
class, its lifecycle and bad input; ``exchange``: one request's answer, measured on the way;
``settings``: the ``SERVELENS_*`` variables and the metrics shared per registry.

May import: ``servelens.core``, ``servelens.prometheus``, ``servelens.gateway`` (its meter and usage
plan); nothing above it.
"""

from servelens.asgi.middleware import MEASURED_KEY, MetricsMiddleware, has_measured_route, served_models
from servelens.asgi.settings import AsgiSettings

__all__ = ["MEASURED_KEY", "AsgiSettings", "MetricsMiddleware", "has_measured_route", "served_models"]
