"""A real Prometheus (Debian package) scrapes a test exporter fed with known requests and runs the
two seed queries of the by-ISL dashboard, unchanged apart from the prefix (issue 2)."""

import math

import pytest
from prometheus_client import CollectorRegistry

from servelens.core.buckets import IslBuckets
from servelens.core.quantiles import bucket_bounds
from servelens.prometheus import FrontendMetrics
from servelens.testing.exporter import feed, serve_metrics, synthetic_samples
from servelens.testing.tsdb import run_prometheus

BUCKETS = IslBuckets.default()
P95 = ("histogram_quantile(0.95, sum by (le, isl_bucket) "
       "(rate(dynamo_frontend_time_to_first_token_by_isl_seconds_bucket[5m])))")
MEAN = ("sum by (isl_bucket) (rate(dynamo_frontend_time_to_first_token_by_isl_seconds_sum[5m])) / "
        "sum by (isl_bucket) (rate(dynamo_frontend_time_to_first_token_by_isl_seconds_count[5m]))")


@pytest.mark.binaries("prometheus")
def test_seed_queries_on_real_prometheus() -> None:
    metrics = FrontendMetrics(registry=CollectorRegistry(), prefix="dynamo_frontend", isl_buckets=BUCKETS)
    metrics.register_model("test-model")
    samples = synthetic_samples(7 * 40, BUCKETS, seed=3)
    with serve_metrics(metrics) as url, run_prometheus([url]) as prom:
        # the zero-valued series exist from registration, so Prometheus sees them before any request
        prom.wait_until("dynamo_frontend_time_to_first_token_by_isl_seconds_count",
                        lambda s: len(s) == len(BUCKETS))
        feed(metrics, samples)
        total = float(len(samples))
        prom.wait_until("sum(dynamo_frontend_time_to_first_token_by_isl_seconds_count)",
                        lambda s: bool(s) and s[0].value == total)
        p95 = {s.labels["isl_bucket"]: s.value for s in prom.client.query(P95)}
        mean = {s.labels["isl_bucket"]: s.value for s in prom.client.query(MEAN)}

    assert sorted(p95) == sorted(BUCKETS.labels) and sorted(mean) == sorted(BUCKETS.labels)
    edges = metrics.state.edges.ttft_s
    for label in BUCKETS.labels:
        ttfts = sorted(s.ttft_s for s in samples if s.ttft_s is not None and s.isl is not None
                       and BUCKETS.label(s.isl) == label)
        assert len(ttfts) == 40
        # mean: rate(sum)/rate(count) scales both by the same factor, so it is exact (the feed
        # rounds each TTFT to whole nanoseconds, hence the 1 ns tolerance)
        assert mean[label] == pytest.approx(sum(ttfts) / len(ttfts), abs=1e-9)
        # p95: histogram_quantile lands in the le bucket holding the ceil(0.95 n)-th observation
        true_p95 = ttfts[math.ceil(0.95 * len(ttfts)) - 1]
        lower, upper = bucket_bounds(true_p95, edges)
        assert lower <= p95[label] <= upper, (label, true_p95, p95[label])
