"""The exposition written from snapshots is the one prometheus_client writes for the collector: the
same bytes, hence the same samples and values, at the default and the large configuration."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES, IslBuckets
from servelens.prometheus import FrontendMetrics
from servelens.prometheus import exposition as exposition_module
from servelens.prometheus.parse import parse_exposition
from servelens.testing.exporter import feed, many_series_metrics, synthetic_samples

MS = 1_000_000
BUCKETS = ",".join(map(str, DEFAULT_ISL_BOUNDARIES))


def prometheus_client_text(m: FrontendMetrics) -> bytes:
    """The exposition as before: ``generate_latest`` over the custom collector."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(m.collector)
    return generate_latest(reg)


def assert_same_exposition(m: FrontendMetrics, parsed: bool = True) -> bytes:
    """Byte for byte the same as before, and (``parsed``) the same samples and values as
    prometheus_client's parser reads them (6 s per 100,000 lines, so not at the large configuration,
    where the same bytes say the same)."""
    new = m.exposition()
    old = prometheus_client_text(m)
    if parsed:
        assert parse_exposition(new.decode()) == parse_exposition(old.decode())
    assert new == old
    return new


def default_config() -> FrontendMetrics:
    m = FrontendMetrics(isl_buckets=BUCKETS)
    m.register_model("llama")
    feed(m, synthetic_samples(40, IslBuckets.parse(BUCKETS), seed=3), model="llama")
    return m


def awkward_values() -> FrontendMetrics:
    """Label values that need escaping, counts and sums past 1e6 (written with an exponent), an
    unknown model, a disconnected client, a request in flight, the Dynamo prefix."""
    m = FrontendMetrics(prefix="dynamo_frontend", isl_buckets="100,1000")
    for name in ('quo"te', "back\\slash", "new\nline", "modèle-ü"):
        m.register_model(name)
    r = m.begin('quo"te', "completions", "stream", 0)
    r.output(5 * MS)
    r.output(3_000 * MS, tokens=2_500_000)  # 2.5 M ITL observations in one chunk
    r.finish(3_001 * MS, "success", isl=50, osl=2_000_000, cached_tokens=3_000_000)
    m.begin("back\\slash", "chat_completions", "stream", 0).finish(7 * MS, "error", "cancelled")
    m.begin("modèle-ü", "chat_completions", "unary", 0)  # in flight
    m.begin("ghost", "chat_completions", "stream", 0).finish(MS, "error", "not_found")
    m.state.client_disconnected()
    return m


def sidecar() -> FrontendMetrics:
    m = FrontendMetrics(isl_buckets=BUCKETS, stock=False)
    m.register_model("m")
    feed(m, synthetic_samples(10, IslBuckets.parse(BUCKETS)), model="m")
    return m


def buckets_off() -> FrontendMetrics:
    m = FrontendMetrics()
    m.register_model("m")
    feed(m, synthetic_samples(10, IslBuckets.parse(BUCKETS)), model="m")
    return m


def nothing_registered() -> FrontendMetrics:
    return FrontendMetrics(isl_buckets=BUCKETS)


def uncached_on() -> FrontendMetrics:
    """The opt-in buckets by uncached prompt tokens, beside the ISL buckets, and in the sidecar mode."""
    m = FrontendMetrics(isl_buckets=BUCKETS, uncached_buckets="256,4096")
    for name in ("llama", 'quo"te'):
        m.register_model(name)
    feed(m, synthetic_samples(30, IslBuckets.parse(BUCKETS), seed=4), model="llama")
    return m


def uncached_sidecar() -> FrontendMetrics:
    m = FrontendMetrics(prefix="dynamo_frontend", isl_buckets=BUCKETS, uncached_buckets=BUCKETS, stock=False)
    m.register_model("m")
    feed(m, synthetic_samples(10, IslBuckets.parse(BUCKETS)), model="m")
    return m


@pytest.mark.parametrize("build", [default_config, awkward_values, sidecar, buckets_off, nothing_registered,
                                   uncached_on, uncached_sidecar])
def test_same_exposition_as_prometheus_client(build: Callable[[], FrontendMetrics]) -> None:
    m = build()
    assert_same_exposition(m)
    feed(m, synthetic_samples(7, IslBuckets.parse(BUCKETS), seed=9), model=next(iter(m.state.models), "x"))
    assert_same_exposition(m)  # after more requests, unchanged series reused from the last one


def test_same_exposition_at_the_large_configuration() -> None:
    m = many_series_metrics()
    text = assert_same_exposition(m, parsed=False)
    assert text.count(b"\n") > 100_000  # 10 models x 33 buckets x ~140 edges: the configuration of the goal
    feed(m, synthetic_samples(33, m.isl_buckets or IslBuckets.default(), seed=5), model="model-3")
    assert_same_exposition(m, parsed=False)


def test_a_request_reformats_only_the_series_it_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    m = FrontendMetrics(isl_buckets=BUCKETS)
    for name in ("a", "b"):
        m.register_model(name)
    calls: list[str] = []
    real = exposition_module._HistogramFamily.series

    def counted(self: exposition_module._HistogramFamily, *args: object) -> bytes:
        calls.append(self.name)
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(exposition_module._HistogramFamily, "series", counted)
    m.exposition()
    assert len(calls) == 2 * (6 + 7 * 5)  # every series of both models, the first time
    calls.clear()
    m.exposition()
    assert calls == []  # nothing changed: nothing formatted
    feed(m, synthetic_samples(1, IslBuckets.parse(BUCKETS)), model="b")  # one request, bucket 0-512
    text = m.exposition()
    n = m.names
    assert calls == [*n.stock_histograms(), *n.by_isl_histograms()]  # its 6 stock and 5 by-ISL series
    assert text == prometheus_client_text(m)


def test_collectors_added_follow_the_frontend_families() -> None:
    m = default_config()
    extra = CounterMetricFamily("servelens_test_extra", "An added family", labels=["k"])
    extra.add_metric(["v"], 3)

    class Added(Collector):
        def collect(self) -> Iterator[Metric]:
            yield extra

    m.add_collector(Added())
    reg = CollectorRegistry(auto_describe=False)
    reg.register(m.collector)
    for c in m._extra:
        reg.register(c)
    assert m.exposition() == generate_latest(reg) == prometheus_client_text(m) + m.added_exposition()
    assert m.added_exposition().endswith(b'servelens_test_extra_total{k="v"} 3.0\n')


@pytest.mark.binaries("promtool")
@pytest.mark.parametrize("build", [awkward_values, many_series_metrics])
def test_promtool_check_metrics_is_clean(build: Callable[[], FrontendMetrics]) -> None:
    proc = subprocess.run(["promtool", "check", "metrics"], input=build().exposition(), capture_output=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout.decode()[:2000] + proc.stderr.decode()[:2000]
