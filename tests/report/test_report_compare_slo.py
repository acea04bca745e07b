"""`servelens report --results A --compare B` (issue 17 section 4) and `--slo-ttft/--slo-itl`
(section 3, client side): runs of the sim's planner in virtual time, so the truth is known and
nothing depends on load."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.core.edges import MetricEdges
from servelens.formats.results import write_results
from servelens.prometheus.frontend import FrontendMetrics
from servelens.testing.latency_windows import EARLY_MIX
from servelens.testing.sim_runs import feed_records, run_phase, slowed

BUCKETS = IslBuckets.default()


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["report", *argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("runs")
    out = {}
    for name, seed, params in (("base", 1, None), ("again", 2, None), ("slow", 3, slowed(attention=6.0))):
        recs = run_phase(seed, BUCKETS, EARLY_MIX, 1200, *((params,) if params else ()))
        write_results(tmp / name / "results.jsonl", recs)
        out[name] = str(tmp / name)
        if name == "base":
            m = FrontendMetrics(isl_buckets=BUCKETS)
            m.register_model("test-model")
            (tmp / "s0.txt").write_bytes(m.exposition())
            feed_records(m, recs)
            (tmp / "s1.txt").write_bytes(m.exposition())
    out.update(s0=str(tmp / "s0.txt"), s1=str(tmp / "s1.txt"))
    return out


def test_help_names_the_baseline() -> None:
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        main(["report", "--help"])
    text = " ".join(out.getvalue().split())
    assert "a second bench run, the candidate, compared bucket by bucket against --results, the baseline" in text


def test_compare_same_engine_twice_changes_no_bucket(runs: dict[str, str]) -> None:
    rc, out, _ = cli("--results", runs["base"], "--compare", runs["again"], "--format", "json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["baseline"] == runs["base"] and doc["candidate"] == runs["again"]
    for metric in ("TTFT", "ITL"):
        rows = doc["metrics"][metric]
        assert [r["label"] for r in rows] == list(BUCKETS.labels)
        assert {r["verdict"] for r in rows} <= {"no significant change", "too few requests"}, metric


def test_compare_engine_slowed_on_long_prompts_names_those_buckets(runs: dict[str, str]) -> None:
    rc, out, _ = cli("--results", runs["base"], "--compare", runs["slow"], "--format", "json")
    assert rc == 0
    ttft = {r["label"]: r for r in json.loads(out)["metrics"]["TTFT"]}
    for label in ("4097-8192", "8193-16384"):  # the model: +37% and +69% (attention 6x)
        assert ttft[label]["verdict"] == "slower", label
        p50 = ttft[label]["quantiles"][0]
        assert p50["q"] == 0.5 and p50["ci_s"][0] > 0 and p50["diff_s"] == pytest.approx(
            p50["candidate_s"] - p50["baseline_s"])
    assert ttft["0-512"]["verdict"] == "no significant change"  # +2%


def test_compare_text_fits_80_columns(runs: dict[str, str]) -> None:
    rc, out, _ = cli("--results", runs["base"], "--compare", runs["slow"])
    assert rc == 0 and out.startswith("baseline: ")
    notes = ("baseline:", "candidate:", "change:", "no change")
    body = [line for line in out.splitlines() if not line.startswith(notes)]
    assert max(len(line.rstrip()) for line in body) <= 80
    assert "verdict per ISL bucket" in out and "TTFT by ISL bucket" in out and "ITL by ISL bucket" in out


@pytest.mark.parametrize("argv, message", [
    (["--metrics", "x.txt", "--compare", "y"], "give the baseline with --results"),
    (["--format", "csv"], "--compare prints --format table or json"),
    (["--slo-ttft", "1"], "for two runs use servelens explain"),
])
def test_compare_bad_flags_are_one_line(runs: dict[str, str], argv: list[str], message: str) -> None:
    base = [] if argv[0] == "--metrics" else ["--results", runs["base"], "--compare", runs["again"]]
    rc, _, err = cli(*base, *argv)
    assert rc == 2 and err.count("\n") == 1 and message in err, err


def test_slo_from_results_is_exact_and_from_histograms_exact_at_an_le_edge(runs: dict[str, str]) -> None:
    edges = [e for e in MetricEdges().ttft_s if 0.02 < e < 2]  # a few edges inside the TTFT range
    for edge in edges[:3]:
        exact = json.loads(cli("--results", runs["base"], "--slo-ttft", f"{edge!r}", "--format", "json")[1])
        binned = json.loads(cli("--metrics", runs["s1"], "--metrics-before", runs["s0"], "--slo-ttft", f"{edge!r}",
                                "--format", "json")[1])
        assert exact["slo"]["exact"] and not binned["slo"]["exact"]
        for e, h in zip(exact["slo"]["rows"], binned["slo"]["rows"], strict=True):
            assert e["label"] == h["label"]
            if e["requests"]:
                assert h["ttft"]["exact"] and h["ttft"]["low"] == pytest.approx(e["ttft_share"]), (edge, e["label"])
        assert binned["slo"]["notes"] == ["goodput needs the window's length, which a scrape does not carry"]


def test_slo_between_le_edges_is_a_bound_that_holds_the_exact_share(runs: dict[str, str]) -> None:
    edges = [e for e in MetricEdges().ttft_s if 0.02 < e < 2]
    between = (edges[1] + edges[2]) / 2
    exact = json.loads(cli("--results", runs["base"], "--slo-ttft", f"{between!r}", "--format", "json")[1])
    rc, text, _ = cli("--metrics", runs["s1"], "--metrics-before", runs["s0"], "--slo-ttft", f"{between!r}")
    assert rc == 0 and "is not an le edge" in text and "%-" not in text
    binned = json.loads(cli("--metrics", runs["s1"], "--metrics-before", runs["s0"], "--slo-ttft", f"{between!r}",
                            "--format", "json")[1])
    assert any(not h["ttft"]["exact"] for h in binned["slo"]["rows"] if h["ttft"])
    for e, h in zip(exact["slo"]["rows"], binned["slo"]["rows"], strict=True):
        if e["requests"]:
            assert h["ttft"]["low"] <= e["ttft_share"] <= h["ttft"]["high"], e["label"]


def test_slo_table_and_goodput_from_results(runs: dict[str, str], tmp_path: Path) -> None:
    rc, out, _ = cli("--results", runs["base"], "--slo-ttft", "0.2+0.0001*isl", "--slo-itl", "0.5")
    assert rc == 0
    assert "SLO attainment per ISL bucket" in out and "Goodput" in out and "a failed request meets none" in out
    doc = json.loads(cli("--results", runs["base"], "--slo-ttft", "0.2+0.0001*isl", "--format", "json")[1])
    rows = {r["label"]: r for r in doc["slo"]["rows"]}
    assert rows["all"]["requests"] == 1200 and rows["all"]["all_met"] == sum(
        r["all_met"] for label, r in rows.items() if label != "all")
    assert rows["all"]["goodput_rps"] == pytest.approx(sum(r["goodput_rps"] for k, r in rows.items() if k != "all"))
    rc, _, err = cli("--results", runs["base"], "--slo-ttft", "1", "--format", "csv")
    assert rc == 2 and "not csv" in err
