"""``le`` label values are written as NVIDIA Dynamo 1.6.1's frontend writes them (``1``, not ``1.0``)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from servelens.prometheus import FrontendMetrics
from servelens.prometheus.collector import format_le


def test_format_le_matches_rust_display() -> None:
    assert [format_le(x) for x in (0.0, 1.0, 0.0022, 130000.0, 0.1, 1e-5, float("inf"))] == [
        "0", "1", "0.0022", "130000", "0.1", "0.00001", "+Inf"]


def test_exposition_le_strings_have_no_trailing_zero() -> None:
    m = FrontendMetrics(prefix="dynamo_frontend", isl_buckets="512")
    m.register_model("tiny")
    les = {s.labels["le"] for fam in text_string_to_metric_families(m.exposition().decode())
           for s in fam.samples if "le" in s.labels}
    assert {"0", "1", "10", "480", "130000", "+Inf"} <= les
    assert not any(le.endswith(".0") for le in les)
