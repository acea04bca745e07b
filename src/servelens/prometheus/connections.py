"""The gateway's connection metrics (names fixed, whatever the metric prefix: they are the gateway
process's own, not a frontend's that Dynamo also exports)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

ACCEPT_FAILURES = "servelens_gateway_accept_failures"
"""Counter (``_total``), label ``reason``: client connections refused at the gateway's connection budget
(``connection_limit``) or whose ``accept()`` failed for want of file descriptors (``open_files``)."""
MAX_CONNECTIONS = "servelens_gateway_max_connections"
"""Gauge: client connections the gateway takes at once (its open-files limit, two per stream)."""


class ConnectionsCollector(Collector):
    """Exports ``failures()`` (reason -> count since start) and the connection cap ``max_connections``."""

    def __init__(self, failures: Callable[[], Mapping[str, int]], max_connections: int) -> None:
        self._failures = failures
        self._max = max_connections

    def describe(self) -> Iterator[Metric]:
        """Families without samples."""
        yield CounterMetricFamily(ACCEPT_FAILURES, _HELP_FAILURES, labels=["reason"])
        yield GaugeMetricFamily(MAX_CONNECTIONS, _HELP_MAX)

    def collect(self) -> Iterator[Metric]:
        """The two families, every reason present (at 0 until it happens)."""
        failures = CounterMetricFamily(ACCEPT_FAILURES, _HELP_FAILURES, labels=["reason"])
        for reason, count in sorted(self._failures().items()):
            failures.add_metric([reason], count)
        yield failures
        yield GaugeMetricFamily(MAX_CONNECTIONS, _HELP_MAX, value=self._max)


_HELP_FAILURES = ("Client connections not taken: refused with a 503 at the connection budget (connection_limit) "
                  "or accept() out of file descriptors (open_files)")
_HELP_MAX = "Client connections the gateway takes at once (from its open-files limit, two per stream)"
