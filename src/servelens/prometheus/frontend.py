"""The library entry point: frontend metrics bound to a prometheus_client registry."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry

from servelens.core.buckets import IslBuckets
from servelens.core.snapshot import ModelSnapshot, StateSnapshot, take_snapshot
from servelens.core.state import DEFAULT_MAX_MODELS, FrontendState, LiveRequest, MetricEdges
from servelens.prometheus.collector import FrontendCollector
from servelens.prometheus.exposition import TextExposition
from servelens.prometheus.names import DEFAULT_PREFIX, MetricNames


class FrontendMetrics:
    """Per-request metrics of an OpenAI-compatible frontend, exported to Prometheus.

    Example::

        registry = CollectorRegistry()
        metrics = FrontendMetrics(registry=registry, isl_buckets="512,1024,2048,4096,8192,16384")
        metrics.register_model("llama-3-8b")
        req = metrics.begin("llama-3-8b", "chat_completions", "stream")
        req.output(time.perf_counter_ns(), tokens=1)   # per output-bearing chunk
        req.set_isl(812, "final_usage")               # when usage.prompt_tokens is known
        req.finish(time.perf_counter_ns(), "success", osl=42, cached_tokens=512)

    Args:
        registry: the prometheus_client registry to register the collector with (None: do not
            register; call :meth:`exposition` or register :attr:`collector` yourself).
        prefix: metric name prefix (``dynamo_frontend`` gives NVIDIA Dynamo's names).
        isl_buckets: boundaries in tokens (``"512,1024"``, a sequence, or :class:`IslBuckets`);
            None or the empty string disables the by-ISL families entirely (an empty sequence
            raises ValueError, as any invalid boundaries do).
        edges: histogram ``le`` edges (Dynamo 1.6.1's by default).
        max_models: cardinality guard for :meth:`register_model`.
        stock, by_isl: which families to export (``stock=False`` is the sidecar mode that adds
            only the by-ISL series to an engine that already exports the stock ones).

    Raises:
        ValueError: bad boundaries, edges or prefix; ``by_isl`` export without buckets is ignored.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        prefix: str = DEFAULT_PREFIX,
        isl_buckets: IslBuckets | str | Iterable[int] | None = None,
        edges: MetricEdges | None = None,
        max_models: int = DEFAULT_MAX_MODELS,
        stock: bool = True,
        by_isl: bool = True,
    ) -> None:
        buckets: IslBuckets | None
        if isl_buckets is None or isl_buckets == "":
            buckets = None
        elif isinstance(isl_buckets, IslBuckets):
            buckets = isl_buckets
        else:
            buckets = IslBuckets.parse(isl_buckets)
        if not stock and buckets is None:
            raise ValueError("exporting only the by-ISL families needs ISL bucket boundaries")
        self.names = MetricNames(prefix)
        self.state = FrontendState(buckets, edges, max_models)
        self.collector = FrontendCollector(self.state, self.names, stock=stock, by_isl=by_isl)
        self.text = TextExposition(self.names, self.state.edges, stock=stock, by_isl=self.collector.by_isl)
        """Writes the exposition of :meth:`snapshot` (what :meth:`exposition` and the gateway serve)."""
        self._last: StateSnapshot | None = None
        self.registry = registry
        if registry is not None:
            registry.register(self.collector)

    @property
    def isl_buckets(self) -> IslBuckets | None:
        """The configured buckets, or None when by-ISL metrics are off."""
        return self.state.isl_buckets

    def register_model(self, name: str) -> None:
        """Create every series of ``name`` at zero. Raises ValueError past ``max_models``."""
        self.state.register_model(name)

    def begin(
        self, model: str, endpoint: str, request_type: str, arrival_ns: int | None = None
    ) -> LiveRequest:
        """Start a request now (or at ``arrival_ns``, int ns from ``time.perf_counter_ns()``).

        ``endpoint``: ``chat_completions`` or ``completions``; ``request_type``: ``stream`` or
        ``unary``; anything else raises ValueError. An unregistered ``model`` counts as ``unknown_model``.
        """
        return self.state.begin(
            model, endpoint, request_type, time.perf_counter_ns() if arrival_ns is None else arrival_ns
        )

    def snapshot(self, models: Sequence[ModelSnapshot] | None = None) -> StateSnapshot:
        """A copy of every exported value (:func:`~servelens.core.snapshot.take_snapshot`), reusing the
        copies of histograms unchanged since the last one; ``models``: the models' copies if already
        made (:func:`~servelens.core.snapshot.copy_model`)."""
        snap = take_snapshot(self.state, self._last, models)
        self._last = snap
        return snap

    @property
    def last_snapshot(self) -> StateSnapshot | None:
        """The latest :meth:`snapshot` (None before the first)."""
        return self._last

    def exposition(self) -> bytes:
        """The Prometheus text exposition (format 0.0.4) of these metrics alone: the bytes that
        ``prometheus_client.generate_latest`` writes for :attr:`collector`, written by :attr:`text` from
        a :meth:`snapshot` (~25x faster when every series changed, more when few did)."""
        return self.text.render(self.snapshot())
