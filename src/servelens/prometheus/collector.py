"""A custom ``prometheus_client`` Collector that exports a :class:`~servelens.core.state.FrontendState`.

Owned histogram state is turned into ``HistogramMetricFamily`` at scrape time (the
prometheus_client "custom collector" pattern), so requests never touch prometheus_client
objects and a request-local ITL histogram is merged once without per-token locks.
No ``_created`` series are exported.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from decimal import Decimal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from servelens.core.histogram import HistogramState
from servelens.core.snapshot import slo_thresholds
from servelens.core.state import SLO_KINDS, FrontendState, slo_kind_on
from servelens.core.status import UNKNOWN_MODEL
from servelens.prometheus.names import BY_ISL_HELP, BY_UNCACHED_HELP, HELP, MetricNames


def format_le(edge: float) -> str:
    """The ``le`` label value of a bucket edge, written as NVIDIA Dynamo's (Rust) frontend writes it.

    Shortest round-trip decimal without exponent and without a trailing ``.0`` (``1``, ``0.0022``,
    ``130000``), ``+Inf`` for infinity. Prometheus 2.x keeps ``le`` as a string, so ``le="1.0"``
    (prometheus_client's ``floatToGoString``) and Dynamo's ``le="1"`` would be two different series.
    """
    if math.isinf(edge):
        return "+Inf" if edge > 0 else "-Inf"
    if edge == int(edge) and abs(edge) < 1e21:
        return str(int(edge))
    text = repr(float(edge))
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    return text


def _buckets(h: HistogramState) -> list[tuple[str, float]]:
    return [(format_le(le), float(c)) for le, c in h.cumulative()]


class FrontendCollector(Collector):
    """Exports stock and (when buckets are configured) by-ISL families of a FrontendState.

    Args:
        state: the state to export.
        names: metric names (prefix).
        stock: export the stock families (histograms labelled ``model``, counters, gauges).
        by_isl: export the by-ISL families (labels ``model``, ``isl_bucket``), the assignment
            counter and the prompt-token counter; ignored when the state has no buckets.
        by_uncached: export the by-uncached families (labels ``model``, ``uncached_bucket``) and their
            assignment counter; ignored when the state has no uncached buckets.
    """

    def __init__(self, state: FrontendState, names: MetricNames, stock: bool = True, by_isl: bool = True,
                 by_uncached: bool = True) -> None:
        self.state = state
        self.names = names
        self.stock = stock
        self.by_isl = by_isl and state.isl_buckets is not None
        self.by_uncached = by_uncached and state.uncached_buckets is not None

    def describe(self) -> Iterator[Metric]:
        """Families without samples (lets the registry check for name clashes at register time)."""
        n = self.names
        if self.stock:
            for name, key in zip(n.stock_histograms(), ("ttft", "itl", "duration", "isl", "osl", "cached"),
                                 strict=True):
                yield HistogramMetricFamily(name, HELP[key], labels=["model"])
            yield CounterMetricFamily(n.requests, HELP["requests"],
                                      labels=["endpoint", "error_type", "model", "request_type", "status"])
            yield GaugeMetricFamily(n.inflight, HELP["inflight"], labels=["model"])
            yield CounterMetricFamily(n.output_tokens, HELP["output_tokens"], labels=["model"])
            yield GaugeMetricFamily(n.disconnected, HELP["disconnected"])
        if self.by_isl:
            for name, key in zip(n.by_isl_histograms(), ("ttft", "itl", "duration", "osl", "cached"), strict=True):
                yield HistogramMetricFamily(name, HELP[key] + BY_ISL_HELP, labels=["model", "isl_bucket"])
            yield CounterMetricFamily(n.isl_assignments, HELP["isl_assignments"], labels=["model", "source"])
            if self.state.slo is not None:
                yield CounterMetricFamily(n.slo_by_isl, HELP["slo_by_isl"], labels=["isl_bucket", "model", "slo"])
                yield GaugeMetricFamily(n.slo_threshold_info, HELP["slo_threshold_info"], labels=["slo", "threshold"])
            yield CounterMetricFamily(n.prompt_tokens_by_isl, HELP["prompt_tokens_by_isl"],
                                      labels=["model", "isl_bucket"])
        if self.by_uncached:
            for name, key in zip(n.by_uncached_histograms(), ("ttft", "itl", "duration"), strict=True):
                yield HistogramMetricFamily(name, HELP[key] + BY_UNCACHED_HELP, labels=["model", "uncached_bucket"])
            yield CounterMetricFamily(n.uncached_assignments, HELP["uncached_assignments"], labels=["model", "source"])

    def collect(self) -> Iterator[Metric]:
        """Snapshot the state under its lock and yield the metric families."""
        n = self.names
        st = self.state
        with st.lock:
            families: list[Metric] = []
            if self.stock:
                hists = [HistogramMetricFamily(name, HELP[key], labels=["model"]) for name, key in zip(
                    n.stock_histograms(), ("ttft", "itl", "duration", "isl", "osl", "cached"), strict=True)]
                requests = CounterMetricFamily(
                    n.requests, HELP["requests"],
                    labels=["endpoint", "error_type", "model", "request_type", "status"])
                inflight = GaugeMetricFamily(n.inflight, HELP["inflight"], labels=["model"])
                out_tokens = CounterMetricFamily(n.output_tokens, HELP["output_tokens"], labels=["model"])
                for model, ms in st.models.items():
                    s = ms.stock
                    for fam, h in zip(hists, (s.ttft, s.itl, s.duration, s.isl, s.osl, s.cached), strict=True):
                        assert h is not None
                        fam.add_metric([model], _buckets(h), h.sum)
                    for (endpoint, rtype, status, etype), count in sorted(ms.requests.items()):
                        requests.add_metric([endpoint, etype, model, rtype, status], count)
                    inflight.add_metric([model], ms.inflight)
                    out_tokens.add_metric([model], ms.output_tokens)
                for (endpoint, rtype, status, etype), count in sorted(st.unknown_requests.items()):
                    requests.add_metric([endpoint, etype, UNKNOWN_MODEL, rtype, status], count)
                if st.unknown_requests:  # Dynamo keeps an inflight series at 0 for unknown_model too
                    inflight.add_metric([UNKNOWN_MODEL], 0)
                if st.unknown_duration is not None:  # Dynamo records these durations too
                    hists[2].add_metric([UNKNOWN_MODEL], _buckets(st.unknown_duration), st.unknown_duration.sum)
                families.extend(hists)
                families.extend([requests, inflight, out_tokens,
                                 GaugeMetricFamily(n.disconnected, HELP["disconnected"],
                                                   value=st.disconnected_clients)])
            if self.by_isl:
                keys = ("ttft", "itl", "duration", "osl", "cached")
                bhists = [HistogramMetricFamily(name, HELP[key] + BY_ISL_HELP, labels=["model", "isl_bucket"])
                          for name, key in zip(n.by_isl_histograms(), keys, strict=True)]
                sources = CounterMetricFamily(n.isl_assignments, HELP["isl_assignments"], labels=["model", "source"])
                prompt = CounterMetricFamily(n.prompt_tokens_by_isl, HELP["prompt_tokens_by_isl"],
                                             labels=["model", "isl_bucket"])
                for model, ms in st.models.items():
                    assert ms.by_isl is not None and ms.isl_sources is not None
                    for label, hs in ms.by_isl.items():
                        for fam, h in zip(bhists, (hs.ttft, hs.itl, hs.duration, hs.osl, hs.cached), strict=True):
                            fam.add_metric([model, label], _buckets(h), h.sum)
                    for src, count in ms.isl_sources.items():
                        sources.add_metric([model, src], count)
                    for label, hs in ms.by_isl.items():
                        prompt.add_metric([model, label], hs.prompt_tokens)
                families.extend(bhists)
                families.append(sources)
                if st.slo is not None:
                    slo = CounterMetricFamily(n.slo_by_isl, HELP["slo_by_isl"], labels=["isl_bucket", "model", "slo"])
                    for model, ms in st.models.items():
                        assert ms.slo_met is not None
                        for label, met in ms.slo_met.items():
                            for kind, count in zip(SLO_KINDS, met, strict=True):
                                if slo_kind_on(st.slo, kind):
                                    slo.add_metric([label, model, kind], count)
                    families.append(slo)
                    info = GaugeMetricFamily(n.slo_threshold_info, HELP["slo_threshold_info"],
                                             labels=["slo", "threshold"])
                    for kind, spec in slo_thresholds(st.slo):
                        info.add_metric([kind, spec], 1)
                    families.append(info)
                families.append(prompt)
            if self.by_uncached:
                uhists = [HistogramMetricFamily(name, HELP[key] + BY_UNCACHED_HELP, labels=["model", "uncached_bucket"])
                          for name, key in zip(n.by_uncached_histograms(), ("ttft", "itl", "duration"), strict=True)]
                usources = CounterMetricFamily(n.uncached_assignments, HELP["uncached_assignments"],
                                               labels=["model", "source"])
                for model, ms in st.models.items():
                    assert ms.by_uncached is not None and ms.uncached_sources is not None
                    for label, us in ms.by_uncached.items():
                        for fam, h in zip(uhists, (us.ttft, us.itl, us.duration), strict=True):
                            fam.add_metric([model, label], _buckets(h), h.sum)
                    for src, count in ms.uncached_sources.items():
                        usources.add_metric([model, src], count)
                families.extend(uhists)
                families.append(usources)
        yield from families
