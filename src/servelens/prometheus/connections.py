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
UPSTREAM_RETRIES = "servelens_gateway_upstream_retries"
"""Counter (``_total``): measured requests sent upstream a second time, on a fresh connection, because
the reused keep-alive connection they went out on closed before any response byte
(:class:`~servelens.gateway.upstream.UpstreamClient`; llama-server closes after every stream)."""


class ConnectionsCollector(Collector):
    """Exports ``failures()`` (reason -> count since start), the connection cap ``max_connections`` and
    ``retries()`` (upstream requests resent on a fresh connection since start; 0 when not given)."""

    def __init__(self, failures: Callable[[], Mapping[str, int]], max_connections: int,
                 retries: Callable[[], int] = lambda: 0) -> None:
        self._failures = failures
        self._max = max_connections
        self._retries = retries

    def describe(self) -> Iterator[Metric]:
        """Families without samples."""
        yield CounterMetricFamily(ACCEPT_FAILURES, _HELP_FAILURES, labels=["reason"])
        yield GaugeMetricFamily(MAX_CONNECTIONS, _HELP_MAX)
        yield CounterMetricFamily(UPSTREAM_RETRIES, _HELP_RETRIES)

    def collect(self) -> Iterator[Metric]:
        """The three families, every reason present (at 0 until it happens)."""
        failures = CounterMetricFamily(ACCEPT_FAILURES, _HELP_FAILURES, labels=["reason"])
        for reason, count in sorted(self._failures().items()):
            failures.add_metric([reason], count)
        yield failures
        yield GaugeMetricFamily(MAX_CONNECTIONS, _HELP_MAX, value=self._max)
        yield CounterMetricFamily(UPSTREAM_RETRIES, _HELP_RETRIES, value=self._retries())


_HELP_FAILURES = ("Client connections not taken: refused with a 503 at the connection budget (connection_limit) "
                  "or accept() out of file descriptors (open_files)")
_HELP_MAX = "Client connections the gateway takes at once (from its open-files limit, two per stream)"
_HELP_RETRIES = ("Measured requests sent upstream again on a fresh connection: the reused keep-alive connection "
                 "closed before any response byte")


def connections_exposition(failures: Mapping[str, int], max_connections: int, retries: int) -> bytes:
    """The text exposition of the three families for these values (what the gateway's workers serve
    summed over all of them, :mod:`servelens.gateway.workers`)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(ConnectionsCollector(lambda: failures, max_connections, lambda: retries))
    return generate_latest(reg)
