"""`servelens explain` on bad input: one clear line and exit status 2, or a stated limitation in the
output, never a traceback or a silent number; the JSON carries every figure (inf and NaN as null);
a reference mix shows both windows at it."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.core.edges import MetricEdges
from servelens.formats.mix_file import read_mix
from servelens.formats.results import write_results
from servelens.prometheus.frontend import FrontendMetrics
from servelens.testing.latency_windows import EARLY_MIX, LATE_MIX
from servelens.testing.sim_runs import feed_records, run_phase

BUCKETS = IslBuckets.default()


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(["explain", *argv])
        except SystemExit as exc:  # argparse's usage errors exit
            rc = int(exc.code or 0)
    return rc, out.getvalue(), err.getvalue()


def one_line_error(argv: list[str], message: str) -> None:
    rc, out, err = cli(*argv)
    assert rc == 2 and out == "", out
    assert err.startswith("servelens: error:") and err.count("\n") == 1 and message in err, err


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("runs")
    out = {}
    for name, seed, mix in (("a", 1, EARLY_MIX), ("b", 2, LATE_MIX), ("no_top", 3, (*EARLY_MIX[:-1], 0))):
        write_results(tmp / name / "results.jsonl", run_phase(seed, BUCKETS, mix, 200))
        out[name] = str(tmp / name)
    # the same run bucketed differently by the bench that wrote it
    write_results(tmp / "other" / "results.jsonl", run_phase(4, BUCKETS, LATE_MIX, 200))
    (tmp / "other" / "summary.json").write_text(json.dumps({"config": {"isl_buckets": [1024, 4096]}}))
    (tmp / "a" / "summary.json").write_text(json.dumps({"config": {"isl_buckets": list(BUCKETS.boundaries)}}))
    out["other"] = str(tmp / "other")
    (tmp / "empty.jsonl").write_text("")
    out["empty"] = str(tmp / "empty.jsonl")
    # scrapes: one server with the default buckets, one with others
    for name, buckets in (("s", BUCKETS), ("t", IslBuckets.parse("1024,4096"))):
        m = FrontendMetrics(isl_buckets=buckets)
        m.register_model("test-model")
        (tmp / f"{name}0.txt").write_bytes(m.exposition())
        feed_records(m, run_phase(5, BUCKETS, EARLY_MIX, 100))
        (tmp / f"{name}1.txt").write_bytes(m.exposition())
        out[f"{name}0"], out[f"{name}1"] = str(tmp / f"{name}0.txt"), str(tmp / f"{name}1.txt")
    (tmp / "mix-bad.yml").write_text("shares:\n  0-1024: 1\n  1025+: 2\n")
    (tmp / "mix-good.yml").write_text("shares:\n" + "".join(f"  {label}: 1\n" for label in BUCKETS.labels))
    (tmp / "mix-text.yml").write_text("just words\n")
    out.update(bad=str(tmp / "mix-bad.yml"), good=str(tmp / "mix-good.yml"), text=str(tmp / "mix-text.yml"))
    return out


def test_windows_without_data_are_one_line(runs: dict[str, str]) -> None:
    one_line_error(["--results", runs["empty"], runs["a"]], "no requests in it")
    one_line_error(["--results", runs["a"], "/nonexistent/results.jsonl"], "cannot read results file")
    # a scrape pair with nothing between them
    one_line_error(["--metrics", runs["s0"], runs["s0"], runs["s0"], runs["s1"]],
                   "the earlier window has no TTFT observations")
    one_line_error(["--metrics", runs["s1"], runs["s0"], runs["s0"], runs["s1"]], "counters decreased")


def test_boundaries_that_differ_between_windows_are_one_line(runs: dict[str, str]) -> None:
    one_line_error(["--results", runs["a"], runs["other"]], "the two runs used different ISL buckets")
    one_line_error(["--metrics", runs["s0"], runs["s1"], runs["t0"], runs["t1"]], "the ISL buckets differ between")
    one_line_error(["--metrics", runs["s0"], runs["s1"], runs["s0"], runs["s1"], "--isl-buckets", "100,200"],
                   "does not match the server's ISL buckets")
    one_line_error(["--results", runs["a"], runs["a"], "--isl-buckets", ""], "ISL bucket boundaries must not be empty")
    # raw per-request data can be put into the same buckets
    rc, out, _ = cli("--results", runs["a"], runs["other"], "--isl-buckets", BUCKETS.spec, "--metric", "ttft")
    assert rc == 0 and out.startswith("TTFT p95")


def test_reference_mix_that_does_not_match_is_one_line(runs: dict[str, str]) -> None:
    one_line_error(["--results", runs["a"], runs["b"], "--reference-mix", runs["bad"]],
                   "the reference mix does not match the ISL buckets")
    one_line_error(["--results", runs["a"], runs["b"], "--reference-mix", runs["text"]],
                   "must map ISL bucket labels to shares")
    one_line_error(["--results", runs["a"], runs["b"], "--reference-mix", "/nonexistent.yml"],
                   "cannot read reference mix")


def test_flags_that_do_not_fit_are_one_line(runs: dict[str, str]) -> None:
    one_line_error(["--results", runs["a"], runs["b"], "--before", "1h"], "--before and --after go with --prometheus")
    one_line_error(["--prometheus", "http://127.0.0.1:1"], "needs --before RANGE and --after RANGE")
    one_line_error(["--prometheus", "http://127.0.0.1:1", "--before", "1q", "--after", "10m"], "a range is DURATION")
    one_line_error(["--results", runs["a"], runs["b"], "--metric", "tpot"], "unknown metric 'tpot'")
    one_line_error(["--results", runs["a"], runs["b"], "--slo-ttft", "fast"], "SLO threshold 'fast'")
    one_line_error(["--results", runs["a"], runs["b"], "--quantile", "95"], "--quantile must be within (0, 1)")
    one_line_error(["--metrics", runs["s0"]], "expected 4 arguments")
    one_line_error(["--metrics", runs["s0"], runs["s1"], runs["s0"], runs["s1"], "--intervals", "bootstrap"],
                   "--intervals bootstrap needs per-request samples")
    one_line_error(["--results", runs["a"], runs["b"], "--intervals", "jackknife"], "invalid choice: 'jackknife'")


def test_the_output_names_the_interval_method(runs: dict[str, str]) -> None:
    """The uncertainty line says which method made the intervals and why; both are there for results."""
    for flag, starts, why in (("auto", "bootstrap over requests", "each window having at most 10,000 requests"),
                              ("bootstrap", "bootstrap over requests", "(as asked)"),
                              ("normal", "normal approximation from per-request sums", "(as asked)")):
        rc, out, _ = cli("--results", runs["a"], runs["b"], "--metric", "ttft", "--intervals", flag,
                         "--resamples", "100")
        line = next(x for x in out.splitlines() if x.startswith("uncertainty: "))
        assert rc == 0 and line.startswith(f"uncertainty: {starts}") and why in line, line
    rc, out, _ = cli("--metrics", runs["s0"], runs["s1"], runs["s0"], runs["s1"], "--metric", "ttft",
                     "--intervals", "normal")
    assert rc == 0 and "uncertainty: normal approximation from histogram counts" in out


def test_a_bucket_empty_in_one_window_is_stated(runs: dict[str, str]) -> None:
    rc, out, _ = cli("--results", runs["no_top"], runs["b"], "--metric", "ttft")
    assert rc == 0
    assert "note: bucket 16385+ has no TTFT observations in the earlier window" in out
    assert "16385+" in out.split("by ISL bucket")[1].splitlines()[3 + BUCKETS.labels.index("16385+")]
    doc = json.loads(cli("--results", runs["no_top"], runs["b"], "--metric", "ttft", "--format", "json")[1])
    top = doc["metrics"]["TTFT"]["buckets"][-1]
    assert top["change"] == "only in the later window" and top["mean_before_s"] is None
    assert top["mean_change_ci_s"] is None and top["latency_effect_s"] == 0


def test_a_bucket_empty_in_both_windows_says_no_data(runs: dict[str, str]) -> None:
    """It read ``later only`` (JSON: "only in the later window"); report --compare said "too few"."""
    rc, out, _ = cli("--results", runs["no_top"], runs["no_top"], "--metric", "ttft")
    assert rc == 0
    row = out.split("by ISL bucket")[1].splitlines()[3 + BUCKETS.labels.index("16385+")]
    assert row.split() == ["16385+", "0→0", "0→0%", "-→-", "-→-", "no", "data"]
    doc = json.loads(cli("--results", runs["no_top"], runs["no_top"], "--metric", "ttft", "--format", "json")[1])
    assert doc["metrics"]["TTFT"]["buckets"][-1]["change"] == "no data in either window"
    compared = io.StringIO()
    with redirect_stdout(compared):
        assert main(["report", "--results", runs["no_top"], "--compare", runs["no_top"]]) == 0
    verdicts = compared.getvalue().split("verdict per ISL bucket")[1].splitlines()
    assert next(line for line in verdicts if line.startswith("16385+")).split() == [
        "16385+", "0→0", "no", "data", "no", "data"]


def test_json_has_every_figure_and_no_nan(runs: dict[str, str]) -> None:
    rc, out, _ = cli("--results", runs["no_top"], runs["b"], "--format", "json", "--slo-ttft", "0.5")
    assert rc == 0 and "NaN" not in out and "Infinity" not in out
    doc = json.loads(out)
    assert set(doc["metrics"]) == {"TTFT", "ITL", "duration"}
    ttft = doc["metrics"]["TTFT"]
    for key in ("mix_effect_s", "latency_effect_s", "verdict", "mix_effect_ci_s", "latency_effect_ci_s",
                "counterfactual", "buckets", "ranked", "verdict_line", "quantiles", "limitations"):
        assert key in ttft, key
    assert ttft["verdict"] in ("mix", "latency", "both", "none")
    assert [b["label"] for b in ttft["buckets"]] == list(BUCKETS.labels)
    assert doc["slo"]["exact"] is True and doc["slo"]["before"][-1]["label"] == "all"


def test_reference_mix_shows_both_windows_at_it(runs: dict[str, str], tmp_path: Path) -> None:
    rc, _, err = cli("--results", runs["a"], runs["b"], "--metric", "ttft", "--write-mix", str(tmp_path / "m.yml"))
    assert rc == 0 and "wrote" in err
    written = read_mix(tmp_path / "m.yml")
    assert written.labels == BUCKETS.labels
    # the earlier window at its own mix is itself; the later at it is the counterfactual
    doc = json.loads(cli("--results", runs["a"], runs["b"], "--metric", "ttft", "--format", "json",
                         "--reference-mix", str(tmp_path / "m.yml"))[1])["metrics"]["TTFT"]
    assert doc["at_reference"]["before"]["mean_s"] == pytest.approx(doc["mean_before_s"], rel=1e-5)
    assert doc["at_reference"]["after"]["mean_s"] == pytest.approx(doc["counterfactual_mean_s"], rel=1e-5)
    rc, text, _ = cli("--results", runs["a"], runs["b"], "--metric", "ttft", "--reference-mix", runs["good"])
    assert rc == 0 and "TTFT at the reference mix" in text


def _scrape_pairs(tmp: Path, edges: MetricEdges) -> list[str]:
    """Two windows of the same engine (every duration 0.1-1.9 s) as four scrapes of one gateway."""
    m = FrontendMetrics(isl_buckets=BUCKETS, edges=edges)
    m.register_model("test-model")
    paths = []
    for k, (seed, mix) in enumerate(((6, EARLY_MIX), (7, LATE_MIX))):
        paths.append(tmp / f"w{k}0.txt")
        paths[-1].write_bytes(m.exposition())
        feed_records(m, run_phase(seed, BUCKETS, mix, 150))
        paths.append(tmp / f"w{k}1.txt")
        paths[-1].write_bytes(m.exposition())
    return [str(p) for p in paths]


def test_a_quantile_inside_one_le_bucket_is_not_presented_as_measured(tmp_path: Path) -> None:
    """With Dynamo's duration edges (0, 2, 4, ... s) every request of a window fell in 0-2 s and explain
    printed "duration p95 stayed at 1.9 s" (0.95 x 2 s) while the means were 0.1-1.1 s. The verdict now
    headlines the mean and says why; the tables mark such quantiles ``~``, as the bench table does."""
    coarse = MetricEdges(duration_s=MetricEdges.dynamo().duration_s)
    rc, out, _ = cli("--metrics", *_scrape_pairs(tmp_path, coarse), "--metric", "duration")
    assert rc == 0
    line = out.splitlines()[0]
    assert re.fullmatch(r"duration mean rose \d+ ms -> \d+ ms \(p95 not measured: every duration of both windows "
                        r"in the le bucket 0-2\.0 s\); at the earlier mix it would be \d+ ms: .*", line), line
    assert "p95 stayed at 1.9 s" not in out and "p95 rose" not in line
    p95 = next(row for row in out.splitlines() if row.startswith("p95 "))
    assert p95.split()[1:3] == ["~1900", "~1900"]  # 0.95 x 2 s in both windows: interpolations, marked
    rows = out.split("by ISL bucket")[1].splitlines()[3:3 + len(BUCKETS.labels)]
    assert all(re.search(r" ~\d+→~\d+ ", row) for row in rows), rows
    assert ("~ every duration of a row in one le bucket (0-2.0 s: all requests, 0-512, 513-1024, 1025-2048, "
            "2049-4096, 4097-8192, 8193-16384, 16385+): its percentiles are interpolated inside it, not measured; "
            "only the range is known (means are exact)") in out.splitlines()
    doc = json.loads(cli("--metrics", *_scrape_pairs(tmp_path, coarse), "--metric", "duration", "--format",
                         "json")[1])["metrics"]["duration"]
    assert doc["le_range_before_s"] == doc["le_range_after_s"] == [0.0, 2.0]
    assert doc["buckets"][0]["le_range_before_s"] == [0.0, 2.0]
    # the fine duration edges (the default now): measured quantiles, nothing marked
    rc, out, _ = cli("--metrics", *_scrape_pairs(tmp_path, MetricEdges()), "--metric", "duration")
    assert rc == 0 and out.startswith("duration p95 ") and "~" not in out and "not measured" not in out
