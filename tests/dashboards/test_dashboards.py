"""Dashboard JSON structure, numeric bucket order, PromQL validity (promtool), rules (promtool)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets, label_sort_key
from servelens.dashboards.grafana import grafana_dashboard, panel_queries, substitute_variables
from servelens.dashboards.queries import FIGURES, bucket_queries, model_matcher
from servelens.dashboards.rules import alert_rules, recording_rules, to_yaml
from servelens.prometheus.names import MetricNames

BUCKETS = IslBuckets.default()
PROMTOOL = shutil.which("promtool")


def _promtool_check(tmp_path: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL, "promtool (Debian package prometheus) is required"
    return subprocess.run([PROMTOOL, "check", "rules", *map(str, files)], capture_output=True, text=True,
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


def test_promtool_rejects_a_broken_query(tmp_path: Path) -> None:  # the check above can fail
    f = tmp_path / "bad.yml"
    f.write_text(to_yaml({"groups": [{"name": "g", "rules": [{"record": "a:b", "expr": "sum(rate(x[5m])"}]}]}))
    assert _promtool_check(tmp_path, f).returncode != 0


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
