"""Real Prometheus 2.42 and VictoriaMetrics 1.79 scrape a servelens exporter fed with known
requests; the report, the recording rules, the alert rules and the dashboard's per-bucket queries
must give per-bucket figures consistent with the fed data, with buckets in numeric order."""

from __future__ import annotations

import functools
import io
import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.core.edges import ITL_EDGES_S, TTFT_EDGES_S  # compared at Dynamo's (coarser) le resolution
from servelens.core.summary import BucketRow, RequestSample, rows_from_histograms, rows_from_samples
from servelens.dashboards.grafana import grafana_dashboard, substitute_variables
from servelens.dashboards.output import write_dashboard_files
from servelens.dashboards.rules import record_name
from servelens.formats.metrics_text import bucket_histograms, parse_scrape
from servelens.prometheus.frontend import FrontendMetrics
from servelens.prometheus.names import MetricNames
from servelens.report.promapi import PromApiError, Series
from servelens.report.sources import report_from_prometheus
from servelens.testing.exporter import feed, serve_metrics, synthetic_samples
from servelens.testing.tsdb import TsdbServer, run_prometheus, run_victoria_metrics

pytestmark = pytest.mark.binaries("prometheus", "victoria-metrics")

BUCKETS = IslBuckets.parse("512,1024,2048,4096,8192,16384")
PER_BUCKET = 24
N = PER_BUCKET * len(BUCKETS)
NAMES = MetricNames()
MODEL = "test-model"
SCRAPES_AROUND = 4


@dataclass(frozen=True)
class Fed:
    prom: TsdbServer
    vm: TsdbServer
    samples: list[RequestSample]
    expected: dict[str, BucketRow]  # histogram_quantile over the exporter's own histograms
    exact: dict[str, BucketRow]  # exact percentiles of the fed values
    slo_s: float
    over_slo: set[str]


def _count_is(n: float) -> Callable[[list[Series]], bool]:
    return lambda r: len(r) == 1 and r[0].value == n


def _scraped_since(seen: float, r: list[Series]) -> bool:
    """The scrape counter has moved SCRAPES_AROUND past ``seen``."""
    return len(r) == 1 and r[0].value >= seen + SCRAPES_AROUND


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fed]:
    samples = synthetic_samples(N, BUCKETS, seed=7)
    metrics = FrontendMetrics(isl_buckets=BUCKETS)
    metrics.register_model(MODEL)  # every series exists at zero before the first scrape
    # the expected figures: the exporter's own histograms after feeding (computed on a twin)
    twin = FrontendMetrics(isl_buckets=BUCKETS)
    twin.register_model(MODEL)
    feed(twin, samples, MODEL)
    per_bucket, all_h = bucket_histograms(parse_scrape(twin.exposition().decode()), NAMES)
    expected = {r.bucket: r for r in rows_from_histograms(per_bucket, all_h)}
    exact = {r.bucket: r for r in rows_from_samples(samples, BUCKETS)}
    # an SLO between the bucket p95s: the long-prompt buckets are over it
    p95s = sorted(expected[label].ttft_p95_s or 0.0 for label in BUCKETS.labels)
    slo = (p95s[3] + p95s[4]) / 2
    over = {label for label in BUCKETS.labels if (expected[label].ttft_p95_s or 0) > slo}
    out = tmp_path_factory.mktemp("rules")
    files = write_dashboard_files(out, NAMES, BUCKETS, slo)
    dur = f"sum({NAMES.duration_by_isl}_count)"
    with (
        serve_metrics(metrics) as url,
        run_prometheus([url], rule_files=[files.recording_rules, files.alert_rules]) as prom,
        run_victoria_metrics([url]) as vm,
    ):
        # several scrapes before and after the requests, so that increase() over the window is
        # not dominated by Prometheus' extrapolation to the window's end
        one = f'count_over_time({NAMES.duration_by_isl}_count{{isl_bucket="0-512"}}[5m])'
        for server in (prom, vm):
            server.wait_until(dur, _count_is(0))
            server.wait_until(one, lambda r: len(r) == 1 and r[0].value >= SCRAPES_AROUND)
        feed(metrics, samples, MODEL)
        for server in (prom, vm):
            server.wait_until(dur, _count_is(N))
            seen = server.client.scalar(one) or 0
            server.wait_until(one, functools.partial(_scraped_since, seen))
        # the recording rules have run on the fed data
        prom.wait_until(
            f'{record_name(NAMES.ttft_by_isl, "p95")}{{isl_bucket="0-512"}}',
            lambda r: len(r) == 1 and not math.isnan(r[0].value),
        )
        yield Fed(prom, vm, samples, expected, exact, slo, over)


def _le_bucket(edges: tuple[float, ...], x: float) -> int:
    """Index of the ``le`` bucket holding ``x`` (lo < x <= hi)."""
    for i, e in enumerate(edges):
        if x <= e:
            return i
    return len(edges)


def _assert_row_matches(got: BucketRow | dict, want: BucketRow, exact: BucketRow, where: str) -> None:
    g = got if isinstance(got, dict) else got.__dict__
    for f in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "itl_p50_s", "itl_p95_s", "ttft_mean_s",
              "mean_cached_tokens"):
        assert g[f] == pytest.approx(getattr(want, f), rel=1e-6), (where, want.bucket, f)
    # against the exact percentiles of the fed values: same le bucket, or the neighbour
    for f, edges in (("ttft_p50_s", TTFT_EDGES_S), ("ttft_p95_s", TTFT_EDGES_S), ("itl_p50_s", ITL_EDGES_S),
                     ("itl_p95_s", ITL_EDGES_S)):
        e = tuple(float(x) for x in edges)
        assert abs(_le_bucket(e, g[f]) - _le_bucket(e, getattr(exact, f))) <= 1, (where, want.bucket, f)
    assert g["mean_cached_tokens"] == pytest.approx(exact.mean_cached_tokens, rel=1e-9)
    assert g["ttft_mean_s"] == pytest.approx(exact.ttft_mean_s, rel=1e-6)


@pytest.mark.parametrize("server", ["prom", "vm"])
def test_report_prometheus_cli_matches_fed_data(fed: Fed, server: str) -> None:
    s: TsdbServer = getattr(fed, server)
    buf, err = io.StringIO(), io.StringIO()
    before_s = time.time()
    with redirect_stdout(buf), redirect_stderr(err):
        rc = main(["report", "--prometheus", s.url, "--window", "5m", "--isl-buckets", BUCKETS.spec,
                   "--format", "json"])
    assert rc == 0
    # up to when the data goes: the last scrape's time, in the past (a scrape interval or less ago)
    line = err.getvalue()
    assert line.startswith("data up to ") and line.count("\n") == 1 and "s ago), the last scrape" in line, line
    last = datetime.strptime(line.split("data up to ")[1][:19], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    assert last.timestamp() <= before_s + 1
    rows = json.loads(buf.getvalue())
    assert [r["bucket"] for r in rows] == [*BUCKETS.labels, "all"]  # numeric order
    for r in rows:
        _assert_row_matches(r, fed.expected[r["bucket"]], fed.exact[r["bucket"]], s.kind)
        # an exact count of the window (not increase(), which extrapolates towards the window edges)
        assert r["requests"] == fed.exact[r["bucket"]].requests, (s.kind, r["bucket"], r["requests"])


@pytest.mark.parametrize("server", ["prom", "vm"])
def test_report_prometheus_discovers_buckets_in_numeric_order_with_timeseries(fed: Fed, server: str) -> None:
    s: TsdbServer = getattr(fed, server)
    report = report_from_prometheus(s.url, NAMES, "5m", buckets=None, model=MODEL, range_s=60)
    assert [r.bucket for r in report.rows] == [*BUCKETS.labels, "all"]
    # the notes describe the edges on the server (here servelens' fine ones), not Dynamo's whatever they are
    assert {(r.ttft_le_edges, r.itl_le_edges) for r in report.rows} == {("fine", "fine")}
    assert sorted(BUCKETS.labels) != list(BUCKETS.labels)  # string order would differ
    assert [ts.bucket for ts in report.timeseries] == list(BUCKETS.labels)
    for ts in report.timeseries:
        last = [v for v in ts.ttft_p95_s if v is not None][-1]
        assert last == pytest.approx(fed.expected[ts.bucket].ttft_p95_s, rel=1e-6)
    other = report_from_prometheus(s.url, NAMES, "5m", buckets=BUCKETS, model="no-such-model", range_s=None)
    assert all(r.requests == 0 and r.ttft_p95_s is None for r in other.rows)


def test_recording_rules_give_fed_figures(fed: Fed) -> None:
    c = fed.prom.client
    for label in BUCKETS.labels:
        want = fed.expected[label]
        sel = f'{{isl_bucket="{label}",model="{MODEL}"}}'
        for stat, field in (("p50", "ttft_p50_s"), ("p95", "ttft_p95_s"), ("p99", "ttft_p99_s"),
                            ("mean", "ttft_mean_s")):
            assert c.scalar(record_name(NAMES.ttft_by_isl, stat) + sel) == pytest.approx(
                getattr(want, field), rel=1e-6), (label, stat)
        for stat, field in (("p50", "itl_p50_s"), ("p95", "itl_p95_s")):
            assert c.scalar(record_name(NAMES.itl_by_isl, stat) + sel) == pytest.approx(
                getattr(want, field), rel=1e-6), (label, stat)
        assert c.scalar(record_name(NAMES.itl_by_isl, "p99") + sel) is not None
        assert c.scalar(record_name(NAMES.itl_by_isl, "mean") + sel) == pytest.approx(
            sum(sum(s.itl_s) for s in fed.samples if BUCKETS.label(s.isl or 0) == label)
            / sum(len(s.itl_s) for s in fed.samples if BUCKETS.label(s.isl or 0) == label), rel=1e-6)


def test_alert_rules_fire_for_buckets_over_the_slo(fed: Fed) -> None:
    assert fed.over_slo and fed.over_slo != set(BUCKETS.labels)
    got = fed.prom.wait_until(
        'ALERTS{alertname="TTFTp95AboveSLOByInputLength"}',
        lambda r: {s.labels["isl_bucket"] for s in r} == fed.over_slo,
    )
    assert all(s.labels["alertstate"] == "pending" for s in got)  # for: 5m


@pytest.mark.parametrize("server", ["prom", "vm"])
def test_dashboard_queries_run_and_return_buckets_in_numeric_order(fed: Fed, server: str) -> None:
    s: TsdbServer = getattr(fed, server)
    dash = grafana_dashboard(NAMES, BUCKETS)
    for panel in dash["panels"]:
        legends = [t["legendFormat"] for t in panel["targets"]]
        returned = []
        for t in panel["targets"]:
            result = s.client.query(substitute_variables(t["expr"], "5m", MODEL))
            assert len(result) == 1, (s.kind, panel["title"], t["expr"])
            assert not math.isnan(result[0].value), (s.kind, panel["title"], t["expr"])
            returned.append(result[0].labels.get("isl_bucket", t["legendFormat"]))
        assert returned == legends
        if "by input length" in panel["title"]:
            assert returned == list(BUCKETS.labels), panel["title"]


@pytest.mark.parametrize("server", ["prom", "vm"])
def test_bad_input_is_one_line(fed: Fed, server: str) -> None:
    s: TsdbServer = getattr(fed, server)
    for argv, message in (
        (["--window", "5q"], "duration"),
        (["--metrics-prefix", "nothing_here"], "has no nothing_here_request_duration_by_isl_seconds_count"),
        (["--isl-buckets", "100,200"], f"does not match the server's ISL buckets ({', '.join(BUCKETS.labels)})"),
    ):
        err = io.StringIO()
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            rc = main(["report", "--prometheus", s.url, *argv])
        assert rc == 2
        assert err.getvalue().count("\n") == 1 and message in err.getvalue(), err.getvalue()
    with pytest.raises(PromApiError) as exc:
        s.client.query("sum(rate(x[5m])")
    assert "\n" not in str(exc.value) and s.url in str(exc.value)


def test_report_html_from_prometheus_has_time_chart(fed: Fed, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    with redirect_stdout(io.StringIO()):
        rc = main(["report", "--prometheus", fed.vm.url, "--isl-buckets", BUCKETS.spec, "--html", str(out),
                   "--range", "2m"])
    assert rc == 0
    text = out.read_text()
    assert "p95 TTFT by input length over time" in text
