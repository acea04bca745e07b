"""Issue 17, sections 3 and 5 on real Prometheus 2.42 and VictoriaMetrics 1.79: a gateway exporter
with exact SLO counters and an engine exporter with vLLM's queue and prefill histograms, fed with a
queue-bound sim run (virtual time, truth known) and scraped every second. `servelens report
--prometheus --capacity` finds every bucket waiting in the queue with the engine's true mean queue
time; `--slo-from counters` gives the exact per-request attainment and goodput over the window."""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from typing import Any

import pytest

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.core.slo import Slo, attainment, parse_threshold
from servelens.formats.results import BenchRecord, to_slo_request
from servelens.prometheus.frontend import FrontendMetrics
from servelens.prometheus.names import MetricNames
from servelens.report.promapi import Series
from servelens.testing.exporter import CONTENT_TYPE, serve_metrics
from servelens.testing.sim_runs import BASE, engine_exposition, feed_records, run_loaded
from servelens.testing.static import serve_static
from servelens.testing.tsdb import TsdbServer, run_prometheus, run_victoria_metrics

pytestmark = pytest.mark.binaries("prometheus", "victoria-metrics")

BUCKETS = IslBuckets.default()
NAMES = MetricNames()
SLO_TTFT = "5+0.0002*isl"
SCRAPES = 3


@dataclass(frozen=True)
class Fed:
    servers: dict[str, TsdbServer]
    records: list[BenchRecord]
    times: dict[str, tuple[float | None, float | None]]


def _scraped(seen: float, r: list[Series]) -> bool:
    return len(r) == 1 and r[0].value >= seen + SCRAPES


@pytest.fixture(scope="module")
def fed() -> Iterator[Fed]:
    records, times = run_loaded(5, BUCKETS, (1,) * 7, 200, 32, BASE.with_overrides(max_num_seqs=4))
    slo = Slo(ttft=parse_threshold(SLO_TTFT, BUCKETS))
    gateway = FrontendMetrics(isl_buckets=BUCKETS, slo=slo)
    gateway.register_model("test-model")
    engine = [engine_exposition([], {})]
    count = f'count_over_time({NAMES.ttft_by_isl}_count{{isl_bucket="0-512"}}[10m])'
    with (
        serve_metrics(gateway) as g_url,
        serve_static(lambda: engine[0], CONTENT_TYPE, path="/metrics") as e_base,
        run_prometheus([g_url, e_base + "/metrics"]) as prom,
        run_victoria_metrics([g_url, e_base + "/metrics"]) as vm,
    ):
        servers = {"prometheus": prom, "victoria-metrics": vm}
        for s in servers.values():
            s.wait_until(count, lambda r: len(r) == 1 and r[0].value >= SCRAPES)
        feed_records(gateway, records)
        engine[0] = engine_exposition(records, times)
        for s in servers.values():
            seen = s.client.scalar(count) or 0
            s.wait_until(count, functools.partial(_scraped, seen))
        yield Fed(servers, records, times)


def _report(server: TsdbServer, *argv: str) -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", "--prometheus", server.url, "--window", "10m", *argv, "--format", "json"]) == 0
    doc = json.loads(out.getvalue())
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("server", ["prometheus", "victoria-metrics"])
def test_capacity_from_prometheus_finds_the_queue(fed: Fed, server: str) -> None:
    cap = _report(fed.servers[server], "--capacity")["capacity"]
    assert cap["waiting"] == list(BUCKETS.labels) and cap["prefilling"] == []
    queue = [q for q, _ in fed.times.values() if q is not None]
    assert cap["engine_queue_mean_s"] == pytest.approx(sum(queue) / len(queue), rel=1e-6)
    assert all(b["split"] == "engine-wide" for b in cap["buckets"])
    # the gateway's prompt-token counter per bucket: a fit over the buckets' means
    assert cap["fit"] is not None and cap["fit"]["method"] == "wls-bucket-means"


@pytest.mark.parametrize("server", ["prometheus", "victoria-metrics"])
def test_slo_counters_from_prometheus_are_exact(fed: Fed, server: str) -> None:
    doc = _report(fed.servers[server], "--slo-from", "counters", "--slo-ttft", SLO_TTFT)
    rows = {r["label"]: r for r in doc["slo"]["rows"]}
    slo = Slo(ttft=parse_threshold(SLO_TTFT, BUCKETS))
    exact = attainment([to_slo_request(r) for r in fed.records], BUCKETS, slo, 600.0)
    for a in exact:
        assert (rows[a.label]["requests"], rows[a.label]["ttft_met"], rows[a.label]["all_met"]) == (
            a.requests, a.ttft_met, a.all_met)
        assert rows[a.label]["goodput_rps"] == pytest.approx(a.all_met / 600)
    assert 0 < rows["all"]["all_met"] < len(fed.records)  # the SLO splits the requests
    assert not any("not checked" in n for n in doc["slo"]["notes"])  # the gateway exported its threshold
    # another threshold than the gateway's is refused (it was read as the gateway's); with --model too (the
    # info gauge has no model label: it is taken from the targets that counted the model's requests)
    for model in ([], ["--model", "test-model"]):
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            assert main(["report", "--prometheus", fed.servers[server].url, "--window", "10m", "--slo-from",
                         "counters", "--slo-ttft", "0.001", *model]) == 2
        assert err.getvalue() == (f"servelens: error: {fed.servers[server].url}: the gateway counts TTFT against "
                                  "5.0+0.0002*isl, --slo-ttft gives 0.001 (seconds): give the SLOs the gateway was "
                                  "started with (--slo-ttft '5.0+0.0002*isl')\n")
