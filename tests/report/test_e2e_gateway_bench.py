"""End to end: sim <- gateway <- bench, with real Prometheus and VictoriaMetrics scraping the
gateway. ``servelens report --prometheus`` counts exactly the bench's requests per bucket; its
percentiles and the recording rules agree with the gateway's own histograms scraped directly within the
resolution of the ``le`` buckets (the client's percentiles hold the hop and its own loop: a busy
machine's figure), buckets in numeric order; the
dashboard's per-bucket queries return one series each, of their own bucket, on both servers."""

from __future__ import annotations

import asyncio
import io
import json
import math
from contextlib import ExitStack, redirect_stdout
from pathlib import Path

import pytest

from servelens.bench import BenchConfig, run_bench
from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.core.edges import ITL_EDGES_S, TTFT_EDGES_S  # compared at Dynamo's (coarser) le resolution
from servelens.core.summary import rows_from_samples
from servelens.dashboards.grafana import grafana_dashboard, substitute_variables
from servelens.dashboards.output import write_dashboard_files
from servelens.dashboards.rules import hit_ratio_record_name, record_name
from servelens.formats.metrics_text import parse_scrape
from servelens.formats.results import to_samples
from servelens.gateway.testing import run_gateway
from servelens.prometheus.names import MetricNames
from servelens.sim.testing import run_sim
from servelens.testing.tsdb import TsdbServer, run_prometheus, run_victoria_metrics

pytestmark = pytest.mark.binaries("prometheus", "victoria-metrics")

BUCKETS = IslBuckets.default()
NAMES = MetricNames()
USED = ["0-512", "513-1024", "1025-2048", "2049-4096"]
UNCACHED = IslBuckets.parse("256,1024,2048")


def _le_index(edges: tuple[float, ...], x: float) -> int:
    return next((i for i, e in enumerate(edges) if x <= e), len(edges))


def _near(edges: tuple[float, ...], server: float | None, client: float | None) -> bool:
    """Same ``le`` bucket, or a neighbouring one (interpolation inside a bucket vs exact ranks)."""
    assert server is not None and client is not None
    e = tuple(float(x) for x in edges)
    return abs(_le_index(e, server) - _le_index(e, client)) <= 1


async def test_report_and_rules_agree_with_bench_through_gateway(tmp_path: Path) -> None:
    files = write_dashboard_files(tmp_path / "dash", NAMES, BUCKETS, ttft_p95_slo_s=10.0)
    async with run_sim(seed=3) as sim, run_gateway(sim.url, isl_buckets=BUCKETS.spec,
                                                   uncached_buckets=UNCACHED.spec) as gw:
        metrics_url = gw.url + "/metrics"
        stack = ExitStack()
        try:
            # server start and polling block: run them in a thread so the gateway keeps serving scrapes
            prom: TsdbServer = await asyncio.to_thread(
                stack.enter_context, run_prometheus([metrics_url], rule_files=[files.recording_rules]))
            vm: TsdbServer = await asyncio.to_thread(stack.enter_context, run_victoria_metrics([metrics_url]))
            for s in (prom, vm):
                await asyncio.to_thread(s.wait_until, "up", lambda r: any(x.value == 1 for x in r))
            result = await run_bench(BenchConfig(
                url=gw.url, isl="300:1,800:1,1800:1,3000:1", osl="12", num_requests=48, concurrency=6,
                seed=5, isl_buckets=BUCKETS.boundaries, output_dir=str(tmp_path / "bench"),
            ))
            assert result.errors == 0
            # the gateway's own count (the bench may send a probe request before the run)
            ok = parse_scrape(gw.metrics.exposition().decode()).value(f"{NAMES.duration_by_isl}_count")
            assert len(result.records) <= ok <= len(result.records) + 1
            dur = f"sum({NAMES.duration_by_isl}_count)"
            for s in (prom, vm):
                await asyncio.to_thread(s.wait_until, dur, lambda r: len(r) == 1 and r[0].value == ok)
            await asyncio.to_thread(
                prom.wait_until, f'{record_name(NAMES.ttft_by_isl, "p50")}{{isl_bucket="1025-2048"}}',
                lambda r: len(r) == 1 and not math.isnan(r[0].value))
            client = {r.bucket: r for r in result.client_rows}
            # the gateway's own histograms, scraped directly: what Prometheus and VictoriaMetrics hold. The
            # client's percentiles are not the reference here: its clock holds the hop and its own loop,
            # which on a busy machine moved an ITL p95 two le buckets away from the gateway's
            buf = io.StringIO()
            with redirect_stdout(buf):
                assert await asyncio.to_thread(main, ["report", "--metrics", metrics_url, "--format", "json"]) == 0
            direct = {r["bucket"]: r for r in json.loads(buf.getvalue())}
            for s in (prom, vm):
                buf = io.StringIO()
                with redirect_stdout(buf):
                    rc = await asyncio.to_thread(main, [
                        "report", "--prometheus", s.url, "--window", "5m", "--format", "json"])
                assert rc == 0
                rows = json.loads(buf.getvalue())
                # discovered buckets (the gateway exports all of them from the start), numeric order
                assert [r["bucket"] for r in rows] == [*BUCKETS.labels, "all"], s.kind
                for r in rows:
                    c = client[r["bucket"]]
                    if r["bucket"] not in USED and r["bucket"] != "all":
                        assert c.requests == 0 and r["requests"] == 0 and r["ttft_p50_s"] is None
                        continue
                    # an exact count of the window; +1: the bench's probe request
                    assert c.requests <= r["requests"] <= c.requests + 1, (s.kind, r)
                    if r["bucket"] == "all":
                        assert r["requests"] == ok, (s.kind, r)
                    for f, edges in (("ttft_p50_s", TTFT_EDGES_S), ("ttft_p95_s", TTFT_EDGES_S),
                                     ("itl_p50_s", ITL_EDGES_S), ("itl_p95_s", ITL_EDGES_S)):
                        want = direct[r["bucket"]][f]
                        assert _near(edges, r[f], want), (s.kind, r["bucket"], f, r[f], want)
                    if c.mean_cached_tokens is not None:
                        assert r["mean_cached_tokens"] == pytest.approx(c.mean_cached_tokens, rel=1e-6)
                    if c.cache_hit_ratio is not None:  # rate ratio; +-: the probe request
                        assert r["cache_hit_ratio"] == pytest.approx(c.cache_hit_ratio, abs=0.05), (s.kind, r)
            # by uncached prompt tokens: the same requests per bucket as the client's usage says, numeric order
            want_uncached = {r.bucket: r.requests
                             for r in rows_from_samples(to_samples(result.records), UNCACHED, "uncached")}
            for s in (prom, vm):
                buf = io.StringIO()
                with redirect_stdout(buf):
                    rc = await asyncio.to_thread(main, [
                        "report", "--prometheus", s.url, "--window", "5m", "--by", "uncached", "--format", "json"])
                assert rc == 0
                rows = json.loads(buf.getvalue())
                assert [r["bucket"] for r in rows] == [*UNCACHED.labels, "all"], s.kind
                for r in rows[:-1]:  # +1: the bench's probe request
                    assert want_uncached[r["bucket"]] <= r["requests"] <= want_uncached[r["bucket"]] + 1, (s.kind, r)
                    if r["requests"] >= 5:
                        assert r["ttft_p50_s"] is not None, (s.kind, r)
            # recording rules (Prometheus evaluates them; VictoriaMetrics needs vmalert)
            for label in USED:
                for hist, stat, field, edges in (
                    (NAMES.ttft_by_isl, "p50", "ttft_p50_s", TTFT_EDGES_S),
                    (NAMES.ttft_by_isl, "p95", "ttft_p95_s", TTFT_EDGES_S),
                    (NAMES.ttft_by_isl, "mean", "ttft_mean_s", TTFT_EDGES_S),
                    (NAMES.itl_by_isl, "p50", "itl_p50_s", ITL_EDGES_S),
                    (NAMES.itl_by_isl, "p95", "itl_p95_s", ITL_EDGES_S),
                ):
                    got = prom.client.scalar(f'sum({record_name(hist, stat)}{{isl_bucket="{label}"}})')
                    assert _near(edges, got, direct[label][field]), (label, stat, field, got)
                hit = prom.client.scalar(f'sum({hit_ratio_record_name(NAMES)}{{isl_bucket="{label}"}})')
                want = client[label].cache_hit_ratio
                assert want is not None and hit == pytest.approx(want, abs=0.05), (label, hit, want)
            # the dashboard's per-bucket panels on both servers: each query returns its own bucket,
            # so a panel's series come in query order, which is numeric order
            dash = grafana_dashboard(NAMES, BUCKETS)
            for s in (prom, vm):
                for panel in dash["panels"]:
                    if "by input length" not in panel["title"]:
                        continue
                    legends = [t["legendFormat"] for t in panel["targets"]]
                    assert legends == list(BUCKETS.labels), panel["title"]
                    with_data = []
                    for t in panel["targets"]:
                        series = await asyncio.to_thread(s.client.query, substitute_variables(t["expr"], "5m", ".*"))
                        assert len(series) <= 1, (s.kind, t["expr"])
                        if series and not math.isnan(series[0].value):
                            assert series[0].labels.get("isl_bucket") == t["legendFormat"], (s.kind, t["expr"])
                            with_data.append(t["legendFormat"])
                    assert set(USED) <= set(with_data), (s.kind, panel["title"], with_data)
        finally:
            await asyncio.to_thread(stack.close)
    # the HTML report from the bench's results file: exact figures and p95 over send time
    html = tmp_path / "report.html"
    with redirect_stdout(io.StringIO()):
        assert main(["report", "--results", str(tmp_path / "bench"), "--html", str(html)]) == 0
    assert "p95 TTFT by input length over time" in html.read_text()
