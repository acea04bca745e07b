"""The collector's ``describe`` against its ``collect``: what mutation testing found unchecked
(scripts/mutation.py, docs/mutation.md). The registry uses ``describe`` to check for name clashes at
register time, so it must name exactly the families ``collect`` yields, with their type, help and labels."""

from __future__ import annotations

import math

import pytest
from prometheus_client.core import Metric

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
