"""Prometheus export: the only package of servelens that imports ``prometheus_client``.

- :mod:`.names`: metric names, help texts and the default ``le`` edges (Dynamo's for its prefix).
- :mod:`.frontend`: :class:`FrontendMetrics`, the library entry point (a registry, models, ``begin``).
- :mod:`.collector`: the custom Collector exporting :class:`~servelens.core.state.FrontendState`
  (for a user's ``CollectorRegistry``).
- :mod:`.exposition`: the same text written directly from a :mod:`~servelens.core.snapshot` (what
  ``FrontendMetrics.exposition()`` and the gateway's ``/metrics`` serve; ~25x faster).
- :mod:`.parse`: Prometheus text exposition read into flat samples.
- :mod:`.sim_engine`: the simulated engine's vLLM-named engine metrics.

May import: :mod:`servelens.core` (and prometheus_client); nothing else of servelens.
"""

from prometheus_client import REGISTRY, CollectorRegistry

from servelens.prometheus.collector import FrontendCollector
from servelens.prometheus.frontend import FrontendMetrics
from servelens.prometheus.names import MetricNames

# REGISTRY, CollectorRegistry: prometheus_client's, for the packages that may not import it (servelens.asgi)
__all__ = ["REGISTRY", "CollectorRegistry", "FrontendCollector", "FrontendMetrics", "MetricNames"]
