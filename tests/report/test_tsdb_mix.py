"""The bucket mix on real Prometheus 2.42 and VictoriaMetrics 1.79 (issue 17, sections 1 and 3): a
servelens exporter fed with two phases whose truth is known (the sim's planner in virtual time),
scraped every second. The mix-adjusted recording rules and the dashboard's panel queries must equal
:func:`servelens.core.decompose.counterfactual` on the same data; the bucket-share panel keeps
numeric bucket order; the attainment rules equal the exact share at an ``le`` edge and their alert
fires for the buckets below target; ``servelens explain --prometheus`` over the two phases' ranges
equals ``servelens explain`` on scrapes of the same data (exact counter deltas, no extrapolation)."""

from __future__ import annotations

import functools
import io
import json
import math
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.core.decompose import counterfactual
from servelens.core.edges import MetricEdges
from servelens.core.slo import Slo, Threshold
from servelens.core.windows import HistogramWindow, Mix, window_mix
from servelens.dashboards.grafana import grafana_dashboard, substitute_variables
from servelens.dashboards.mix import MixReference
from servelens.dashboards.output import write_dashboard_files
from servelens.dashboards.rules import attainment_record_name, mix_record_name, share_record_name
from servelens.formats.metrics_text import bucket_histograms, parse_scrape
from servelens.formats.results import BenchRecord
from servelens.prometheus.frontend import FrontendMetrics
from servelens.prometheus.names import MetricNames
from servelens.report.explain_windows import from_scrapes
from servelens.report.promapi import Series
from servelens.testing.exporter import serve_metrics
from servelens.testing.latency_windows import EARLY_MIX, LATE_MIX
from servelens.testing.sim_runs import feed_records, run_phase, slowed
from servelens.testing.tsdb import TsdbServer, run_prometheus, run_victoria_metrics

pytestmark = pytest.mark.binaries("prometheus", "victoria-metrics")

BUCKETS = IslBuckets.default()
NAMES = MetricNames()
MODEL = "test-model"
SCRAPES_AROUND = 4
REFERENCE = Mix(BUCKETS.labels, (1, 1, 1, 1, 1, 1, 1))  # every bucket alike: far from either phase's mix
TARGET = 0.9


@dataclass(frozen=True)
class Fed:
    prom: TsdbServer
    vm: TsdbServer
    records: list[BenchRecord]
    scrapes: tuple[Path, Path, Path]  # the exporter's exposition at the start, after phase 1, after phase 2
    ranges: tuple[str, str]  # --before and --after covering each phase
    total: HistogramWindow  # TTFT of both phases together, as the exporter holds it
    edge_s: float  # the TTFT SLO, an le edge


def _scraped_since(seen: float, r: list[Series]) -> bool:
    return len(r) == 1 and r[0].value >= seen + SCRAPES_AROUND


def _wait_scrapes(servers: tuple[TsdbServer, ...], count: str) -> None:
    for s in servers:
        seen = s.client.scalar(count) or 0
        s.wait_until(count, functools.partial(_scraped_since, seen))


def _ttft_window(text: bytes) -> HistogramWindow:
    per_bucket, _ = bucket_histograms(parse_scrape(text.decode()), NAMES)
    hists = tuple(per_bucket[label].ttft for label in BUCKETS.labels)
    assert all(h is not None for h in hists)
    return HistogramWindow("TTFT", BUCKETS.labels, hists)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fed]:
    tmp = tmp_path_factory.mktemp("mix")
    phase1 = run_phase(11, BUCKETS, EARLY_MIX, 300)
    phase2 = run_phase(12, BUCKETS, LATE_MIX, 300, slowed(attention=6.0))
    edges = [e for e in MetricEdges().ttft_s if 0.05 < e < 1.5]
    edge = edges[len(edges) // 2]  # an le edge inside the latency range: some buckets meet it, some do not
    files = write_dashboard_files(tmp / "dash", NAMES, BUCKETS, 2.0, reference=MixReference(mix=REFERENCE),
                                  slo=Slo(ttft=Threshold(edge)), target=TARGET)
    files24 = write_dashboard_files(tmp / "dash24", NAMES, BUCKETS, 2.0)  # the 24h-window reference
    (tmp / "dash24" / "alert-rules.yml").unlink()
    metrics = FrontendMetrics(isl_buckets=BUCKETS)
    metrics.register_model(MODEL)
    count = f'count_over_time({NAMES.ttft_by_isl}_count{{isl_bucket="0-512"}}[10m])'
    t0 = time.time() - 1
    snaps = [tmp / f"scrape{i}.txt" for i in range(3)]
    with (
        serve_metrics(metrics) as url,
        run_prometheus([url], rule_files=[files.recording_rules, files.alert_rules, files24.recording_rules]) as prom,
        run_victoria_metrics([url]) as vm,
    ):
        servers = (prom, vm)
        for s in servers:
            s.wait_until(count, lambda r: len(r) == 1 and r[0].value >= SCRAPES_AROUND)
        snaps[0].write_bytes(metrics.exposition())
        feed_records(metrics, phase1, MODEL)
        snaps[1].write_bytes(metrics.exposition())
        _wait_scrapes(servers, count)
        t1 = time.time()
        _wait_scrapes(servers, count)
        feed_records(metrics, phase2, MODEL)
        snaps[2].write_bytes(metrics.exposition())
        _wait_scrapes(servers, count)
        t2 = time.time()
        # every rule has run on both phases
        prom.wait_until(mix_record_name(NAMES.ttft_by_isl, "p95", MixReference(window="24h")),
                        lambda r: len(r) == 1 and not math.isnan(r[0].value))
        _wait_scrapes(servers, count)
        # the later range starts just after t1 (whole ms), the earlier one ends at t1
        ranges = (f"{math.ceil(t1 - t0)}s@{t1:.3f}", f"{math.floor((t2 - t1) * 1000) - 1}ms@{t2:.3f}")
        yield Fed(prom, vm, phase1 + phase2, (snaps[0], snaps[1], snaps[2]), ranges,
                  _ttft_window(snaps[2].read_bytes()), edge)


def _value(server: TsdbServer, expr: str) -> float:
    got = server.client.query(expr)
    assert len(got) == 1, (server.kind, expr, got)
    return got[0].value


def test_mix_adjusted_recording_rules_equal_the_counterfactual(fed: Fed) -> None:
    fixed, window = MixReference(mix=REFERENCE), MixReference(window="24h")
    for ref, mix in ((fixed, REFERENCE), (window, window_mix(fed.total))):
        want = counterfactual(fed.total, mix)
        sel = f'{{model="{MODEL}"}}'
        for q, w in zip(want.quantiles, want.quantiles_s, strict=True):
            got = _value(fed.prom, mix_record_name(NAMES.ttft_by_isl, f"p{q * 100:g}", ref) + sel)
            assert got == pytest.approx(w, rel=1e-9), (ref.tag, q)
        assert _value(fed.prom, mix_record_name(NAMES.ttft_by_isl, "mean", ref) + sel) == pytest.approx(
            want.mean_s, rel=1e-9)
    # the reference differs from the data's own mix, so the adjusted p95 is not the raw one
    raw = counterfactual(fed.total, window_mix(fed.total)).quantiles_s[1]
    assert _value(fed.prom, mix_record_name(NAMES.ttft_by_isl, "p95", fixed)) != pytest.approx(raw, rel=1e-3)


@pytest.mark.parametrize("server", ["prom", "vm"])
@pytest.mark.parametrize("reference", ["fixed", "window"])
def test_dashboard_mix_panels_equal_the_counterfactual_in_numeric_order(fed: Fed, server: str, reference: str) -> None:
    s: TsdbServer = getattr(fed, server)
    ref = MixReference(mix=REFERENCE) if reference == "fixed" else MixReference(window="24h")
    want = counterfactual(fed.total, REFERENCE if reference == "fixed" else window_mix(fed.total))
    panels = {p["title"]: p for p in grafana_dashboard(NAMES, BUCKETS, reference=ref)["panels"]}

    def run(expr: str) -> list[Series]:
        return s.client.query(substitute_variables(expr, "5m", ".*"))

    p95 = panels["TTFT p95, all requests: raw and at the reference mix"]["targets"]
    assert run(p95[1]["expr"])[0].value == pytest.approx(want.quantiles_s[1], rel=1e-9), s.kind
    raw = functools.reduce(lambda a, b: a.plus(b), fed.total.histograms).quantile(0.95)
    assert run(p95[0]["expr"])[0].value == pytest.approx(raw, rel=1e-9)
    mean = panels["TTFT mean, all requests: raw and at the reference mix"]["targets"]
    assert run(mean[1]["expr"])[0].value == pytest.approx(want.mean_s, rel=1e-9)
    share = panels["Bucket mix: share of the requests per ISL bucket"]["targets"]
    assert [t["legendFormat"] for t in share] == list(BUCKETS.labels)
    got = [run(t["expr"]) for t in share]
    assert [g[0].labels["isl_bucket"] for g in got] == list(BUCKETS.labels)  # numeric order kept
    counts = fed.total.counts()
    assert [g[0].value for g in got] == pytest.approx(list(counts / counts.sum()), rel=1e-9)


def test_bucket_share_rules_and_a_bucket_without_data_leaves_a_gap(fed: Fed) -> None:
    shares = fed.prom.client.query(share_record_name(NAMES.ttft_by_isl))
    assert sorted(s.labels["isl_bucket"] for s in shares) == sorted(BUCKETS.labels)
    assert sum(s.value for s in shares) == pytest.approx(1.0)
    # a reference share on a bucket the data does not have: no figure, on both servers
    ghost = MixReference(mix=Mix((*BUCKETS.labels, "ghost"), (*([1.0] * len(BUCKETS)), 1.0)))
    expr = grafana_dashboard(NAMES, BUCKETS, reference=ghost)["panels"][-3]["targets"][1]["expr"]
    for s in (fed.prom, fed.vm):
        assert s.client.query(substitute_variables(expr, "5m", ".*")) == [], s.kind


def test_attainment_rules_equal_the_exact_share_and_alert_below_target(fed: Fed) -> None:
    got = {s.labels["isl_bucket"]: s for s in fed.prom.client.query(attainment_record_name(NAMES.ttft_by_isl))}
    below = set()
    for label in BUCKETS.labels:
        mine = [r for r in fed.records if BUCKETS.label(r.isl) == label]
        share = sum(1 for r in mine if (r.ttft_s or 0) <= fed.edge_s) / len(mine)
        assert got[label].value == pytest.approx(share, rel=1e-9), label
        assert float(got[label].labels["slo_le"]) == fed.edge_s
        if share < TARGET:
            below.add(label)
    assert below and below != set(BUCKETS.labels)
    fed.prom.wait_until('ALERTS{alertname="TTFTSLOAttainmentBelowTargetByInputLength"}',
                        lambda r: {s.labels["isl_bucket"] for s in r} == below)


def _explain(*argv: str) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert main(["explain", *argv, "--format", "json", "--slo-ttft", "0.5"]) == 0, err.getvalue()
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


@pytest.mark.parametrize("server", ["prom", "vm"])
def test_explain_on_prometheus_ranges_equals_explain_on_scrapes(fed: Fed, server: str) -> None:
    s: TsdbServer = getattr(fed, server)
    a, b, c = (str(p) for p in fed.scrapes)
    want = _explain("--metrics", a, b, b, c)
    got = _explain("--prometheus", s.url, "--before", fed.ranges[0], "--after", fed.ranges[1])
    assert got["before"]["duration_s"] > 0 and got["labels"] == list(BUCKETS.labels)
    for metric in ("TTFT", "ITL", "duration"):
        w, g = want["metrics"][metric], got["metrics"][metric]
        assert (g["count_before"], g["count_after"]) == (w["count_before"], w["count_after"]), (s.kind, metric)
        for key in ("mix_effect_s", "latency_effect_s", "counterfactual_mean_s", "mean_before_s", "mean_after_s"):
            assert g[key] == pytest.approx(w[key], rel=1e-9), (s.kind, metric, key)
        assert g["verdict"] == w["verdict"] and g["ranked"] == w["ranked"]
        for x, y in zip(g["quantiles"], w["quantiles"], strict=True):
            assert x["counterfactual_s"] == pytest.approx(y["counterfactual_s"], rel=1e-9)
    assert got["metrics"]["TTFT"]["verdict"] == "both"
    # goodput: Prometheus ranges have a length, scrapes do not
    assert got["slo"]["before"][-1]["goodput_rps"] is not None and want["slo"]["before"][-1]["goodput_rps"] is None
    # the same windows as the library reads them from the scrape files
    assert from_scrapes([a, b, b, c], NAMES).windows["TTFT"][1].counts().sum() == 300


def test_report_prometheus_slo_bounds(fed: Fed) -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", "--prometheus", fed.prom.url, "--window", "10m", "--slo-ttft", repr(fed.edge_s),
                     "--format", "json"]) == 0
    doc = json.loads(out.getvalue())
    rows = {r["label"]: r for r in doc["slo"]["rows"]}
    assert rows["all"]["observations"] == len(fed.records) and rows["all"]["ttft"]["exact"]
    share = sum(1 for r in fed.records if (r.ttft_s or 0) <= fed.edge_s) / len(fed.records)
    assert rows["all"]["ttft"]["low"] == pytest.approx(share)
    assert rows["all"]["goodput_rps"][0] == pytest.approx(share * len(fed.records) / 600)
