"""The collector's ``describe`` against its ``collect``: what mutation testing found unchecked
(scripts/mutation.py, docs/mutation.md). The registry uses ``describe`` to check for name clashes at
register time, so it must name exactly the families ``collect`` yields, with their type, help and labels."""

from __future__ import annotations

import math

import pytest
from prometheus_client.core import Metric

from servelens.core.slo import Slo, Threshold
from servelens.prometheus import FrontendMetrics
from servelens.prometheus.collector import FrontendCollector, format_le


def shape(fams: list[Metric]) -> list[tuple[str, str, str, tuple[str, ...]]]:
    # _labelnames: the label names a *MetricFamily was declared with (prometheus_client keeps no public one)
    return [(f.name, f.type, f.documentation, tuple(getattr(f, "_labelnames", ()))) for f in fams]


@pytest.mark.parametrize(("stock", "by_isl"), [(True, True), (True, False), (False, True)])
def test_describe_names_what_collect_yields(stock: bool, by_isl: bool) -> None:
    m = FrontendMetrics(registry=None, isl_buckets="512,1024", stock=stock, by_isl=by_isl)
    m.register_model("m")
    described = list(m.collector.describe())
    collected = list(m.collector.collect())
    assert shape(described) == shape(collected)
    assert all(f.samples == [] for f in described)
    assert all(f.documentation for f in described)
    for f in collected:
        if f.type == "histogram":
            labels = {k for s in f.samples for k in s.labels if k != "le"}
            assert labels == set(getattr(f, "_labelnames", ())), f.name


def test_format_le_of_infinities_and_of_tiny_edges() -> None:
    assert format_le(math.inf) == "+Inf" and format_le(-math.inf) == "-Inf"
    assert format_le(1e-7) == "0.0000001" and format_le(2.5e-10) == "0.00000000025"


def test_the_collector_exports_stock_and_by_isl_families_by_default() -> None:
    m = FrontendMetrics(registry=None, isl_buckets="512")
    m.register_model("m")
    c = FrontendCollector(m.state, m.names)
    assert (c.stock, c.by_isl) == (True, True)
    assert shape(list(c.collect())) == shape(list(m.collector.collect()))


MS = 1_000_000


@pytest.mark.parametrize("slo", [Slo(ttft=Threshold(0.5)), Slo(ttft=Threshold(0.5), itl=Threshold(0.01))])
def test_describe_names_what_collect_yields_with_slo_counters_and_uncached_buckets(slo: Slo) -> None:
    m = FrontendMetrics(registry=None, isl_buckets="512,1024", slo=slo, uncached_buckets="256")
    m.register_model("m")
    described = list(m.collector.describe())
    collected = list(m.collector.collect())
    assert shape(described) == shape(collected)
    names = [f.name for f in described]
    n = m.names
    assert n.slo_by_isl.removesuffix("_total") in names and n.uncached_assignments.removesuffix("_total") in names
    assert all(name in names for name in n.by_uncached_histograms())
    assert all(f.samples == [] for f in described)


def _slo_samples(m: FrontendMetrics) -> list[tuple[str, str, str, float]]:
    fam = next(f for f in m.collector.collect() if f.name == m.names.slo_by_isl.removesuffix("_total"))
    assert (fam.type, tuple(getattr(fam, "_labelnames", ()))) == ("counter", ("isl_bucket", "model", "slo"))
    return [(s.labels["isl_bucket"], s.labels["model"], s.labels["slo"], s.value) for s in fam.samples]


def _two_requests(m: FrontendMetrics) -> None:
    # ISL 100: first token at 100 ms, gaps of 5 ms (meets 0.5 s and 0.01 s); ISL 600: 700 ms, gaps of 5 ms
    for isl, ttft_ms in ((100, 100), (600, 700)):
        r = m.begin("m", "chat_completions", "stream", arrival_ns=0)
        for k in range(3):
            r.output((ttft_ms + 5 * k) * MS)
        r.finish(1_000 * MS, "success", isl=isl, osl=3)


def test_collect_counts_each_slo_given_per_bucket_and_model() -> None:
    m = FrontendMetrics(registry=None, isl_buckets="512,1024", slo=Slo(ttft=Threshold(0.5), itl=Threshold(0.01)))
    m.register_model("m")
    _two_requests(m)
    assert _slo_samples(m) == [
        ("0-512", "m", "ttft", 1.0), ("0-512", "m", "itl", 1.0), ("0-512", "m", "all", 1.0),
        ("513-1024", "m", "ttft", 0.0), ("513-1024", "m", "itl", 1.0), ("513-1024", "m", "all", 0.0),
        ("1025+", "m", "ttft", 0.0), ("1025+", "m", "itl", 0.0), ("1025+", "m", "all", 0.0),
    ]
    ttft_only = FrontendMetrics(registry=None, isl_buckets="512,1024", slo=Slo(ttft=Threshold(0.5)))
    ttft_only.register_model("m")
    _two_requests(ttft_only)
    assert _slo_samples(ttft_only) == [  # no itl series without an ITL SLO
        ("0-512", "m", "ttft", 1.0), ("0-512", "m", "all", 1.0),
        ("513-1024", "m", "ttft", 0.0), ("513-1024", "m", "all", 0.0),
        ("1025+", "m", "ttft", 0.0), ("1025+", "m", "all", 0.0),
    ]


def test_collect_exports_each_slo_threshold_once_as_an_info_gauge() -> None:
    """``{p}_slo_threshold_info{slo, threshold} 1``: one series per SLO set, ``ttft`` first, the threshold
    as ``Threshold.spec`` writes it (each number's shortest repr, ``base+per_token*isl``)."""
    both = FrontendMetrics(registry=None, isl_buckets="512,1024",
                           slo=Slo(ttft=Threshold(0.5, 2e-05), itl=Threshold(0.01)))
    both.register_model("m")
    _two_requests(both)
    itl_only = FrontendMetrics(registry=None, isl_buckets="512", slo=Slo(itl=Threshold(0.25)))
    itl_only.register_model("m")
    for m, want in ((both, [("ttft", "0.5+2e-05*isl"), ("itl", "0.01")]), (itl_only, [("itl", "0.25")])):
        name = m.names.slo_threshold_info
        fam = next(f for f in m.collector.collect() if f.name == name)
        assert (fam.type, tuple(getattr(fam, "_labelnames", ()))) == ("gauge", ("slo", "threshold"))
        assert [(s.name, s.labels, s.value) for s in fam.samples] == [
            (name, {"slo": kind, "threshold": spec}, 1) for kind, spec in want]
