"""`servelens dashboard --slo-from counters`: attainment and goodput rules over the gateway's exact
SLO counters and an alert on attainment; checked with promtool (syntax) and promtool's rule unit
tests (the recorded values on given series)."""

from __future__ import annotations

import io
import shutil
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from servelens.cli.main import main

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.binaries("promtool")


def _promtool(*argv: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL, "promtool (Debian package prometheus) is required"
    return subprocess.run([PROMTOOL, *argv], capture_output=True, text=True, timeout=60, check=False)


def alert_text(slo: str) -> dict[str, str]:
    return {"summary": f"SLO attainment ({slo}) of 0-1000-token prompts below 90% on model m",
            "description": f"Share of the requests meeting the SLO ({slo}), counted exactly by the gateway, over 5m "
            "is 75%."}


def test_counter_rules_pass_promtool_and_record_the_exact_share(tmp_path: Path) -> None:
    out = tmp_path / "dash"
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        assert main(["dashboard", "--output-dir", str(out), "--isl-buckets", "1000", "--slo-ttft", "0.5+0.0002*isl",
                     "--slo-itl", "0.05", "--slo-from", "counters", "--attainment-target", "0.9"]) == 0
    # the rules cannot check which SLOs the gateways count when they are written: it says so, and an alert does
    assert err.getvalue() == ("note: the SLO rules take the gateways' counters to be counted against the SLOs given "
                              "here; alert SLOThresholdDiffersFromRules fires where a gateway's "
                              "servelens_slo_threshold_info says otherwise\n")
    rec, alerts = out / "recording-rules.yml", out / "alert-rules.yml"
    res = _promtool("check", "rules", str(rec), str(alerts))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = yaml.safe_load(rec.read_text())
    slo_rules = next(g for g in doc["groups"] if g["name"].endswith("slo_attainment"))["rules"]
    assert [r.get("labels", {}).get("slo") for r in slo_rules] == ["ttft", "itl", "all", None]
    assert all("le=" not in r["expr"] for r in slo_rules)  # no histogram edge involved
    names = {a["alert"] for g in yaml.safe_load(alerts.read_text())["groups"] for a in g["rules"]}
    assert {"SLOAttainmentBelowTargetByInputLength", "SLOThresholdDiffersFromRules"} <= names
    # 60 requests a minute in 0-1000, 45 of them meeting every SLO: attainment 0.75 (< 0.9: fires), goodput 0.75/s
    series = [
        ('servelens_request_duration_by_isl_seconds_count{model="m",isl_bucket="0-1000"}', "0+60x20"),
        ('servelens_requests_within_slo_by_isl_total{model="m",isl_bucket="0-1000",slo="all"}', "0+45x20"),
        ('servelens_requests_within_slo_by_isl_total{model="m",isl_bucket="0-1000",slo="ttft"}', "0+60x20"),
        ('servelens_requests_within_slo_by_isl_total{model="m",isl_bucket="0-1000",slo="itl"}', "0+45x20"),
        # gateway a counts the rules' SLOs; gateway b another ITL threshold: the rules would misread its counters
        ('servelens_slo_threshold_info{instance="a",slo="ttft",threshold="0.5+0.0002*isl"}', "1x20"),
        ('servelens_slo_threshold_info{instance="a",slo="itl",threshold="0.05"}', "1x20"),
        ('servelens_slo_threshold_info{instance="b",slo="ttft",threshold="0.5+0.0002*isl"}', "1x20"),
        ('servelens_slo_threshold_info{instance="b",slo="itl",threshold="0.07"}', "1x20"),
    ]
    attain = next(r["record"] for r in slo_rules if r.get("labels", {}).get("slo") == "all")
    goodput = slo_rules[-1]["record"]
    test = {
        "rule_files": [rec.name, alerts.name],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "promql_expr_test": [
                {"expr": f'{attain}{{isl_bucket="0-1000",slo="all"}}', "eval_time": "15m",
                 "exp_samples": [{"labels": f'{attain}{{model="m",isl_bucket="0-1000",slo="all"}}', "value": 0.75}]},
                {"expr": goodput, "eval_time": "15m",
                 "exp_samples": [{"labels": f'{goodput}{{model="m",isl_bucket="0-1000"}}', "value": 0.75}]},
            ],
            "alert_rule_test": [{"alertname": "SLOAttainmentBelowTargetByInputLength", "eval_time": "15m",
                                 "exp_alerts": [{"exp_labels": {"severity": "warning", "model": "m", "slo": s,
                                                                "isl_bucket": "0-1000"},
                                                 "exp_annotations": alert_text(s)} for s in ("all", "itl")]},
                                {"alertname": "SLOThresholdDiffersFromRules", "eval_time": "15m",
                                 "exp_alerts": [{"exp_labels": {
                                     "severity": "warning", "instance": "b", "slo": "itl", "threshold": "0.07"},
                                     "exp_annotations": {
                                         "summary": "A gateway counts SLO itl against 0.07 s, the rules assume TTFT "
                                                    "0.5+0.0002*isl, ITL 0.05 (seconds)",
                                         "description": "The SLO attainment and goodput rules read the gateways' SLO "
                                         "counters as counted against TTFT 0.5+0.0002*isl, ITL 0.05; b counts against "
                                         "other thresholds: start it with the rules' --slo-ttft/--slo-itl, or "
                                         "regenerate the rules with its own."}}]}],
        }],
    }
    (out / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = _promtool("test", "rules", str(out / "test.yml"))
    assert res.returncode == 0, res.stdout + res.stderr
