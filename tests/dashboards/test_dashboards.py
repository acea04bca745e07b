"""Dashboard JSON structure, numeric bucket order, PromQL validity (promtool), rules (promtool)."""

from __future__ import annotations

import io
import json
import math
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets, label_sort_key
from servelens.core.slo import Threshold
from servelens.core.state import MetricEdges
from servelens.dashboards.grafana import grafana_dashboard, panel_queries, substitute_variables
from servelens.dashboards.queries import FIGURES, bucket_queries, model_matcher
from servelens.dashboards.rules import alert_rules, recording_rules, to_yaml
from servelens.dashboards.slo import attainment_rules, le_matcher
from servelens.prometheus.names import MetricNames

BUCKETS = IslBuckets.default()


def _promtool_check(tmp_path: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", "check", "rules", *map(str, files)], capture_output=True, text=True,
                          timeout=60, check=False)


def test_dashboard_has_separate_panels_and_variables() -> None:
    dash = grafana_dashboard(MetricNames(), BUCKETS)
    json.dumps(dash)  # serialisable
    titles = [p["title"] for p in dash["panels"]]
    for want in ("TTFT mean", "TTFT p50", "TTFT p95", "TTFT p99", "ITL p50", "ITL p95", "Request rate",
                 "cached prompt tokens"):
        assert sum(want in t for t in titles) >= 1, want
    assert any("all requests" in t and "TTFT" in t for t in titles)
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["model"]["includeAll"] and variables["model"]["allValue"] == ".*"
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        for t in p["targets"]:
            assert 'model=~"$model"' in t["expr"]
    # panels do not overlap
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        cell = (g["x"], g["y"])
        assert cell not in cells
        cells.add(cell)


def test_per_bucket_panels_query_one_bucket_each_in_numeric_order() -> None:
    buckets = IslBuckets.parse("512,1024,2048,4096,8192,16384,32768")
    dash = grafana_dashboard(MetricNames(), buckets)
    per_bucket = [p for p in dash["panels"] if "by input length" in p["title"]]
    assert len(per_bucket) == len(FIGURES)
    for p in per_bucket:
        legends = [t["legendFormat"] for t in p["targets"]]
        assert legends == list(buckets.labels)
        assert legends == sorted(legends, key=label_sort_key)
        assert legends != sorted(legends)  # string sorting would put 1025-2048 before 513-1024
        for t in p["targets"]:
            assert f'isl_bucket="{t["legendFormat"]}"' in t["expr"]
            assert t["expr"].count("isl_bucket=") == t["expr"].count("[$__rate_interval]")


def test_metrics_prefix_gives_dynamo_names() -> None:
    dash = grafana_dashboard(MetricNames("dynamo_frontend"), BUCKETS)
    exprs = [e for _, _, e in panel_queries(dash)]
    assert any("dynamo_frontend_time_to_first_token_by_isl_seconds_bucket" in e for e in exprs)
    assert any("dynamo_frontend_time_to_first_token_seconds_bucket" in e for e in exprs)  # stock contrast
    assert not any("servelens_" in e for e in exprs)
    rules = to_yaml(recording_rules(MetricNames("dynamo_frontend")))
    assert "servelens_" not in rules and "dynamo_frontend_inter_token_latency_by_isl_seconds" in rules


@pytest.mark.parametrize("prefix", ["servelens", "dynamo_frontend"])
@pytest.mark.binaries("promtool")
def test_every_panel_query_parses_as_promql(tmp_path: Path, prefix: str) -> None:
    # promtool has no expression-only check: wrap each query in a recording rule and check the file
    dash = grafana_dashboard(MetricNames(prefix), BUCKETS)
    queries = panel_queries(dash)
    rules = {"groups": [{"name": "panels", "rules": [
        {"record": f"panel:query{i}", "expr": substitute_variables(expr, "5m", ".*")}
        for i, (_, _, expr) in enumerate(queries)
    ]}]}
    f = tmp_path / "panels.yml"
    f.write_text(to_yaml(rules))
    res = _promtool_check(tmp_path, f)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(queries)} rules found" in res.stdout


@pytest.mark.binaries("promtool")
def test_promtool_rejects_a_broken_query(tmp_path: Path) -> None:  # the check above can fail
    f = tmp_path / "bad.yml"
    f.write_text(to_yaml({"groups": [{"name": "g", "rules": [{"record": "a:b", "expr": "sum(rate(x[5m])"}]}]}))
    assert _promtool_check(tmp_path, f).returncode != 0


@pytest.mark.binaries("promtool")
def test_cli_writes_three_files_that_promtool_accepts(tmp_path: Path) -> None:
    out = tmp_path / "dash"
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["dashboard", "--output-dir", str(out), "--metrics-prefix", "dynamo_frontend",
                   "--isl-buckets", "1000,2000,10000", "--ttft-p95-slo", "1.5"])
    assert rc == 0
    assert len(buf.getvalue().splitlines()) == 3
    dash = json.loads((out / "grafana-dashboard.json").read_text())
    assert [t["legendFormat"] for t in dash["panels"][0]["targets"]] == ["0-1000", "1001-2000", "2001-10000",
                                                                         "10001+"]
    res = _promtool_check(tmp_path, out / "recording-rules.yml", out / "alert-rules.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    rec = yaml.safe_load((out / "recording-rules.yml").read_text())
    records = [r["record"] for r in rec["groups"][0]["rules"]]
    for stat in ("p50", "p95", "p99", "mean"):
        assert any(f"time_to_first_token_by_isl_seconds:{stat}_rate5m" in r for r in records)
        assert any(f"inter_token_latency_by_isl_seconds:{stat}_rate5m" in r for r in records)
    alerts = yaml.safe_load((out / "alert-rules.yml").read_text())["groups"][0]["rules"]
    assert alerts[0]["expr"].endswith("> 1.5")
    assert "isl_bucket" in alerts[0]["annotations"]["summary"]


@pytest.mark.parametrize("argv, message", [
    (["--ttft-p95-slo", "0"], "SLO"),
    (["--ttft-p95-slo", "inf"], "SLO must be a finite number"),
    (["--ttft-p95-slo", "nan"], "SLO must be a finite number"),
    (["--isl-buckets", "1024,512"], "strictly increasing"),
    (["--metrics-prefix", "9bad"], "prefix"),
])
def test_cli_bad_input_is_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        rc = main(["dashboard", "--output-dir", str(tmp_path / "o"), *argv])
    assert rc == 2
    assert err.getvalue().startswith("servelens: error:") and err.getvalue().count("\n") == 1
    assert message in err.getvalue()
    assert not (tmp_path / "o" / "grafana-dashboard.json").exists()


def test_alert_rules_reject_non_positive_slo() -> None:
    with pytest.raises(ValueError, match="SLO"):
        alert_rules(MetricNames(), -1)


def test_model_matcher_quotes_and_bucket_queries_keep_order() -> None:
    assert model_matcher(None) == ""
    assert model_matcher('a"b') == 'model="a\\"b"'
    qs = bucket_queries(FIGURES[0], MetricNames(), ["0-512", "513-1024", "1025-2048"], "5m", model_matcher("m"))
    assert [q.bucket for q in qs] == ["0-512", "513-1024", "1025-2048"]
    assert all('model="m"' in q.expr for q in qs)


@pytest.mark.binaries("promtool")
def test_mix_panels_and_rules_pass_promtool_with_either_reference(tmp_path: Path) -> None:
    mix_file = tmp_path / "mix.yml"
    mix_file.write_text("shares:\n" + "".join(f"  {label}: {i + 1}\n" for i, label in enumerate(BUCKETS.labels)))
    for extra in ([], ["--reference-mix", str(mix_file)], ["--reference-window", "6h"]):
        out = tmp_path / f"d{len(extra)}{extra[-1][-2:] if extra else ''}"
        with redirect_stdout(io.StringIO()):
            assert main(["dashboard", "--output-dir", str(out), "--slo-ttft", "0.5+0.0001*isl", "--slo-itl", "0.05",
                         *extra]) == 0
        res = _promtool_check(tmp_path, out / "recording-rules.yml", out / "alert-rules.yml")
        assert res.returncode == 0, res.stdout + res.stderr
        dash = json.loads((out / "grafana-dashboard.json").read_text())
        titles = [p["title"] for p in dash["panels"]]
        assert "TTFT p95, all requests: raw and at the reference mix" in titles
        share = next(p for p in dash["panels"] if p["title"].startswith("Bucket mix"))
        assert [t["legendFormat"] for t in share["targets"]] == list(BUCKETS.labels)  # numeric order
        queries = {"groups": [{"name": "panels", "rules": [
            {"record": f"panel:query{i}", "expr": substitute_variables(e, "5m", ".*")}
            for i, (_, _, e) in enumerate(panel_queries(dash))]}]}
        (out / "panels.yml").write_text(to_yaml(queries))
        res = _promtool_check(tmp_path, out / "panels.yml")
        assert res.returncode == 0, res.stdout + res.stderr
        rec = yaml.safe_load((out / "recording-rules.yml").read_text())
        records = [r["record"] for g in rec["groups"] for r in g["rules"]]
        tag = "refmix" if "--reference-mix" in extra else "ref6h" if extra else "ref24h"
        assert f"model:servelens_time_to_first_token_by_isl_seconds:p95_{tag}_rate5m" in records
        alerts = yaml.safe_load((out / "alert-rules.yml").read_text())["groups"][0]["rules"]
        assert {a["alert"] for a in alerts} == {
            "TTFTp95AboveSLOByInputLength", "TTFTSLOAttainmentBelowTargetByInputLength",
            "ITLSLOAttainmentBelowTargetByInputLength"}


def test_attainment_counts_at_the_largest_le_edge_at_or_below_the_threshold() -> None:
    edges = MetricEdges().ttft_s
    inner = [e for e in edges if e > 0]
    between = (inner[3] + inner[4]) / 2
    for threshold, edge in ((inner[3], inner[3]), (between, inner[3])):
        rules = attainment_rules("h", Threshold(threshold), BUCKETS, edges)
        assert [r.bucket for r in rules] == list(BUCKETS.labels)
        assert {r.edge_s for r in rules} == {edge} and all(r.exact == (threshold == edge) for r in rules)
        assert all(le_matcher(edge) in r.expr for r in rules)
    # a threshold growing with ISL: each bucket at its smallest threshold, never exact
    grow = attainment_rules("h", Threshold(inner[2], 1e-5), BUCKETS, edges)
    assert [r.edge_s for r in grow] == sorted(r.edge_s for r in grow) and not any(r.exact for r in grow)
    assert le_matcher(1.0) == 'le=~"1|1\\\\.0"'
    with pytest.raises(ValueError, match="below the smallest le edge"):
        attainment_rules("h", Threshold(0.001), BUCKETS, (0.01, math.inf))


@pytest.mark.parametrize("argv, message", [
    (["--reference-mix", "MIX"], "the reference mix does not match the ISL buckets"),
    (["--reference-window", "1d2"], "not a Prometheus duration"),
    (["--slo-ttft", "0-512=1"], "SLO table names 0-512"),
    (["--slo-ttft", "1", "--attainment-target", "1.5"], "attainment target must be within (0, 1]"),
    # exited 0 with no SLO rules, where report refuses the same input
    (["--slo-from", "counters"], "servelens: error: --slo-from counters: give the SLOs the gateway counts "
     "(--slo-ttft/--slo-itl)\n"),
])
def test_cli_bad_mix_and_slo_input_is_one_line_and_writes_nothing(tmp_path: Path, argv: list[str],
                                                                   message: str) -> None:
    mix = tmp_path / "mix.yml"
    mix.write_text("shares:\n  0-512: 1\n  513+: 1\n")
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        rc = main(["dashboard", "--output-dir", str(tmp_path / "o"), *[str(mix) if a == "MIX" else a for a in argv]])
    assert rc == 2 and err.getvalue().count("\n") == 1 and message in err.getvalue(), err.getvalue()
    assert not (tmp_path / "o").exists()


def test_cli_attainment_counts_at_the_edges_given(tmp_path: Path) -> None:
    for extra, edge in (([], None), (["--ttft-edges", "dynamo"], 0.47), (["--ttft-edges", "0.3,0.6,0.9"], 0.3)):
        out = tmp_path / f"d{len(extra)}{edge}"
        with redirect_stdout(io.StringIO()):
            assert main(["dashboard", "--output-dir", str(out), "--slo-ttft", "0.5", *extra]) == 0
        rules = yaml.safe_load((out / "recording-rules.yml").read_text())["groups"][-1]["rules"]
        want = edge if edge is not None else max(e for e in MetricEdges().ttft_s if e <= 0.5)  # the prefix's
        assert {float(r["labels"]["slo_le"]) for r in rules} == {want}
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        assert main(["dashboard", "--output-dir", str(tmp_path / "x"), "--ttft-edges", "1,0.5"]) == 2
    assert "ttft edges" in err.getvalue() and err.getvalue().count("\n") == 1


def test_hit_ratio_panel_and_rule_are_cached_over_prompt_tokens_per_bucket() -> None:
    buckets = IslBuckets.parse("512,1024,2048,4096,8192,16384,32768")
    dash = grafana_dashboard(MetricNames(), buckets)
    panel = next(p for p in dash["panels"] if "hit ratio" in p["title"])
    assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert [t["legendFormat"] for t in panel["targets"]] == list(buckets.labels)  # numeric order
    expr = panel["targets"][1]["expr"]
    assert expr == ('sum by (isl_bucket) (rate(servelens_cached_tokens_by_isl_sum{isl_bucket="513-1024",'
                    'model=~"$model"}[$__rate_interval])) / sum by (isl_bucket) (rate('
                    'servelens_prompt_tokens_by_isl_total{isl_bucket="513-1024",model=~"$model"}[$__rate_interval]))')
    rules = recording_rules(MetricNames("dynamo_frontend"))["groups"][0]["rules"]
    hit = next(r for r in rules if r["record"].endswith(":hit_ratio_rate5m"))
    assert hit["record"] == "model_isl_bucket:dynamo_frontend_cached_tokens_by_isl:hit_ratio_rate5m"
    assert "dynamo_frontend_prompt_tokens_by_isl_total[5m]" in hit["expr"]


def test_uncached_panels_only_when_asked_in_numeric_order_and_promtool_clean(tmp_path: Path) -> None:
    assert not any("uncached" in e for _, _, e in panel_queries(grafana_dashboard(MetricNames(), BUCKETS)))
    assert "uncached" not in to_yaml(recording_rules(MetricNames()))
    uncached = IslBuckets.parse("256,512,1024,2048,4096,8192,16384")
    out = tmp_path / "dash"
    with redirect_stdout(io.StringIO()):
        rc = main(["dashboard", "--output-dir", str(out), "--uncached-buckets", uncached.spec])
    assert rc == 0
    dash = json.loads((out / "grafana-dashboard.json").read_text())
    panels = [p for p in dash["panels"] if "by uncached prompt tokens" in p["title"]]
    assert [p["title"] for p in panels][:2] == ["TTFT mean by uncached prompt tokens",
                                                "TTFT p50 by uncached prompt tokens"]
    for p in panels:
        legends = [t["legendFormat"] for t in p["targets"]]
        assert legends == list(uncached.labels) and legends != sorted(legends)
        for t in p["targets"]:
            assert f'uncached_bucket="{t["legendFormat"]}"' in t["expr"] and "isl_bucket" not in t["expr"]
            assert "_by_uncached_seconds" in t["expr"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    res = _promtool_check(tmp_path, out / "recording-rules.yml", out / "alert-rules.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    groups = yaml.safe_load((out / "recording-rules.yml").read_text())["groups"]
    unc = next(g for g in groups if g["name"] == "servelens_uncached_bucket_latency")
    assert "model_uncached_bucket:servelens_time_to_first_token_by_uncached_seconds:p95_rate5m" in [
        r["record"] for r in unc["rules"]]
    # every panel query of the dashboard with uncached panels parses as PromQL
    rules = {"groups": [{"name": "panels", "rules": [
        {"record": f"panel:query{i}", "expr": substitute_variables(expr, "5m", ".*")}
        for i, (_, _, expr) in enumerate(panel_queries(dash))]}]}
    f = tmp_path / "panels.yml"
    f.write_text(to_yaml(rules))
    res = _promtool_check(tmp_path, f)
    assert res.returncode == 0, res.stdout + res.stderr
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["dashboard", "--output-dir", str(tmp_path / "x"), "--uncached-buckets", "9,3"]) != 0
    assert "--uncached-buckets" in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1
