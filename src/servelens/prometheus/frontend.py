"""The library entry point: frontend metrics bound to a prometheus_client registry."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from servelens.core.buckets import IslBuckets
from servelens.core.edges import MetricEdges
from servelens.core.slo import Slo
from servelens.core.snapshot import ModelSnapshot, StateSnapshot, take_snapshot
from servelens.core.state import (
    DEFAULT_MAX_MODELS,
    ISL_SOURCES,
    SLO_KINDS,
    UNCACHED_SOURCES,
    FrontendState,
    LiveRequest,
    slo_kind_on,
)
from servelens.prometheus.collector import FrontendCollector
from servelens.prometheus.exposition import TextExposition
from servelens.prometheus.names import DEFAULT_PREFIX, DYNAMO_PREFIX, MetricNames, default_edges

DEFAULT_MAX_SERIES = 50_000
"""Series budget of one :class:`FrontendMetrics` (the models it registers times
:func:`series_per_model`). The old guard, 64 models of ~700 series each with Dynamo's edges, allowed
~45,000; with the fine TTFT, ITL and duration edges and seven ISL buckets (3,556 series per model) this
allows 14 models (19 with Dynamo's duration edges, 2,596 series per model)."""


def series_per_model(
    edges: MetricEdges, buckets: IslBuckets | None, stock: bool = True, by_isl: bool = True, slo: Slo | None = None,
    uncached: IslBuckets | None = None,
) -> int:
    """Series one registered model adds to ``/metrics``: each histogram has one ``_bucket`` series per
    ``le`` edge plus ``+Inf``, a ``_sum`` and a ``_count``; stock: six histograms (label ``model``),
    ``inflight_requests`` and ``output_tokens_total``; by-ISL: five histograms and the prompt-token
    counter per ISL bucket, and the assignment counter (one series per source); by-uncached (``uncached``
    buckets): three histograms (TTFT, ITL, duration) per uncached bucket and its assignment counter.
    ``requests_total`` is not counted: its series appear as outcomes happen (at most 2 endpoints x 2
    request types x (success + each error type)). With ``slo``, one SLO counter series per bucket and
    ``slo`` label value.
    """
    def hist(e: tuple[float, ...]) -> int:
        return len(e) + 3

    n = 0
    if stock:
        n += sum(hist(e) for e in (edges.ttft_s, edges.itl_s, edges.duration_s, edges.isl_tokens,
                                   edges.osl_tokens, edges.cached_tokens)) + 2
    if by_isl and buckets is not None:
        per_bucket = sum(hist(e) for e in (edges.ttft_s, edges.itl_s, edges.duration_s, edges.osl_tokens,
                                           edges.cached_tokens))
        n += (per_bucket + 1) * len(buckets.labels) + len(ISL_SOURCES)
        if slo is not None:
            n += len(buckets.labels) * sum(slo_kind_on(slo, k) for k in SLO_KINDS)
    if uncached is not None:
        n += sum(hist(e) for e in (edges.ttft_s, edges.itl_s, edges.duration_s)) * len(uncached.labels)
        n += len(UNCACHED_SOURCES)
    return n


def _buckets(spec: IslBuckets | str | Iterable[int] | None) -> IslBuckets | None:
    """Buckets from a spec; None or ``""`` -> None. Raises ValueError for bad boundaries."""
    if spec is None or spec == "":
        return None
    return spec if isinstance(spec, IslBuckets) else IslBuckets.parse(spec)


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
        edges: histogram ``le`` edges (default: :func:`~servelens.prometheus.names.default_edges` of
            the prefix: Dynamo 1.6.1's for ``dynamo_frontend``, else the fine TTFT, ITL and duration edges).
            With Dynamo's prefix only Dynamo's edges are accepted.
        max_models: cardinality guard for :meth:`register_model`.
        max_series: series budget (:data:`DEFAULT_MAX_SERIES`): at most ``max_series //``
            :attr:`series_per_model` models are registered (and ``max_models`` at most).
        stock, by_isl: which families to export (``stock=False`` is the sidecar mode that adds
            only the by-ISL series to an engine that already exports the stock ones).
        slo: SLOs judged exactly per request and counted per bucket in
            ``{prefix}_requests_within_slo_by_isl_total{model, isl_bucket, slo}`` (``slo``: ttft,
            itl, all; see :class:`~servelens.core.state.FrontendState`); None: no such series.
        uncached_buckets: boundaries of the opt-in buckets by uncached prompt tokens (ISL minus cached
            tokens; label ``uncached_bucket``), with the same rules as ``isl_buckets``; None (default) or
            ``""``: nothing registered, nothing paid. Exported in the sidecar mode too.

    Raises:
        ValueError: bad boundaries, edges or prefix; edges other than Dynamo's with Dynamo's prefix;
            one model needing more series than ``max_series``; ``by_isl`` export without buckets is
            ignored.
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
        max_series: int = DEFAULT_MAX_SERIES,
        slo: Slo | None = None,
        uncached_buckets: IslBuckets | str | Iterable[int] | None = None,
    ) -> None:
        buckets = _buckets(isl_buckets)
        try:
            uncached = _buckets(uncached_buckets)
        except ValueError as exc:
            raise ValueError(f"uncached buckets: {exc}") from None
        if not stock and buckets is None:
            raise ValueError("exporting only the by-ISL families needs ISL bucket boundaries")
        self.names = MetricNames(prefix)
        if edges is None:
            edges = default_edges(prefix)
        elif prefix == DYNAMO_PREFIX and not edges.is_dynamo:
            raise ValueError("with Dynamo's metric names (prefix dynamo_frontend) the le edges are Dynamo's: the "
                             "by-ISL twins must share the edges of Dynamo's own stock histograms")
        if slo is not None and (buckets is None or not by_isl):
            raise ValueError("SLO counters are per ISL bucket: they need ISL buckets")
        self.series_per_model = series_per_model(edges, buckets, stock, by_isl, slo, uncached)
        """Series one registered model adds (:func:`series_per_model`)."""
        by_budget = max_series // self.series_per_model
        if by_budget < 1:
            raise ValueError(f"one model needs {self.series_per_model:,} series, over max_series {max_series:,}")
        self.state = FrontendState(
            buckets, edges, min(max_models, by_budget),
            limit_reason=(f"{self.series_per_model:,} series per model within max_series {max_series:,}"
                          if by_budget < max_models else ""),
            slo=slo,
            uncached_buckets=uncached,
        )
        self.collector = FrontendCollector(self.state, self.names, stock=stock, by_isl=by_isl)
        self.text = TextExposition(self.names, self.state.edges, stock=stock, by_isl=self.collector.by_isl,
                                   by_uncached=self.collector.by_uncached)
        """Writes the exposition of :meth:`snapshot` (what :meth:`exposition` and the gateway serve)."""
        self._last: StateSnapshot | None = None
        self.registry = registry
        self._extra: list[Collector] = []
        if registry is not None:
            registry.register(self.collector)

    def add_collector(self, collector: Collector) -> None:
        """Export ``collector`` with these metrics (in :meth:`exposition`, and in the registry if any);
        the gateway adds its connection metrics so. Raises ValueError for a name already exported."""
        if self.registry is not None:
            self.registry.register(collector)
        self._extra.append(collector)

    @property
    def isl_buckets(self) -> IslBuckets | None:
        """The configured buckets, or None when by-ISL metrics are off."""
        return self.state.isl_buckets

    @property
    def uncached_buckets(self) -> IslBuckets | None:
        """The configured uncached-prompt-token buckets, or None when they are off (the default)."""
        return self.state.uncached_buckets

    @property
    def max_models(self) -> int:
        """How many models can be registered (``max_models``, or fewer by the series budget)."""
        return self.state.max_models

    def register_model(self, name: str) -> None:
        """Create every series of ``name`` at zero. Raises ValueError past :attr:`max_models`."""
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

    def added_exposition(self) -> bytes:
        """The text exposition of the collectors added (:meth:`add_collector`) alone, by prometheus_client
        (``b""`` when there are none)."""
        if not self._extra:
            return b""
        reg = CollectorRegistry(auto_describe=False)
        for extra in self._extra:
            reg.register(extra)
        return generate_latest(reg)

    def exposition(self) -> bytes:
        """The Prometheus text exposition (format 0.0.4) of these metrics and the collectors added
        (:meth:`add_collector`): the bytes ``prometheus_client.generate_latest`` writes for
        :attr:`collector` and them, the frontend's written by :attr:`text` from a :meth:`snapshot` (~25x
        faster when every series changed, more when few did)."""
        return self.text.render(self.snapshot()) + self.added_exposition()
