"""`servelens report --capacity` (issue 17, section 5): from bench results with the engine's
per-request times, from the fit alone, and from scrapes (the gateway's by-ISL histograms beside the
engine's vLLM queue and prefill histograms), on sim runs in virtual time whose truth is known; bad
input is one error line or a note."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.formats.results import write_results
from servelens.prometheus.frontend import FrontendMetrics
from servelens.testing.sim_runs import BASE, engine_exposition, feed_records, run_loaded, slowed

BUCKETS = IslBuckets.default()
EVEN = (1, 1, 1, 1, 1, 1, 1)


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["report", *argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("capacity")
    out: dict[str, str] = {}
    for name, params, conc in (("prefill", slowed(prefill=4.0), 2), ("queue", BASE.with_overrides(max_num_seqs=4), 32)):
        recs, times = run_loaded(1, BUCKETS, EVEN, 300, conc, params)
        write_results(tmp / name / "results.jsonl", recs)
        (tmp / name / "engine.jsonl").write_text("".join(
            json.dumps({"request_id": k, "queue_s": q, "prefill_s": p}) + "\n" for k, (q, p) in times.items()))
        m = FrontendMetrics(isl_buckets=BUCKETS)
        m.register_model("test-model")
        (tmp / name / "g0.txt").write_bytes(m.exposition())
        feed_records(m, recs)
        (tmp / name / "g1.txt").write_bytes(m.exposition())
        (tmp / name / "e0.txt").write_bytes(engine_exposition([], {}))
        (tmp / name / "e1.txt").write_bytes(engine_exposition(recs, times))
        out[name] = str(tmp / name)
    return out


def capacity_json(*argv: str) -> dict[str, object]:
    rc, out, err = cli(*argv, "--capacity", "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert "rows" in doc
    cap = doc["capacity"]
    assert isinstance(cap, dict)
    return cap


def test_results_with_engine_times_tell_queue_from_prefill(runs: dict[str, str]) -> None:
    pre = capacity_json("--results", runs["prefill"], "--engine-log", runs["prefill"] + "/engine.jsonl")
    que = capacity_json("--results", runs["queue"], "--engine-log", runs["queue"] + "/engine.jsonl")
    assert pre["prefilling"] == list(BUCKETS.labels) and pre["waiting"] == []
    assert que["waiting"] == list(BUCKETS.labels) and que["prefilling"] == []
    buckets = pre["buckets"]
    assert isinstance(buckets, list) and all(b["split"] == "engine" for b in buckets)
    fit = pre["fit"]
    assert isinstance(fit, dict) and 0.9 * 6250 <= fit["throughput_tps"] <= 6250
    assert "every bucket is slow to prefill" in str(pre["verdict"])


def test_text_output_has_the_verdict_table_fit_and_notes(runs: dict[str, str]) -> None:
    rc, out, _ = cli("--results", runs["queue"], "--capacity")
    assert rc == 0
    assert "where the capacity is short: every bucket waits in the queue" in out
    assert "Where the capacity is short (TTFT split per ISL bucket)" in out
    assert "prefill throughput" in out and "Theil-Sen" in out
    # no engine log: the split is the fit's, and a note says what the wait includes
    assert "note: no queue or prefill time per request from the engine" in out
    rc, md, _ = cli("--results", runs["queue"], "--capacity", "--format", "markdown")
    assert rc == 0 and "## Where the capacity is short" in md and "| 16385+ |" in md


def test_scrapes_with_the_engine_histograms(runs: dict[str, str]) -> None:
    d = runs["queue"]
    que = capacity_json("--metrics", d + "/g1.txt", "--metrics-before", d + "/g0.txt",
                        "--engine-metrics", d + "/e1.txt", "--engine-metrics-before", d + "/e0.txt")
    assert que["waiting"] == list(BUCKETS.labels)
    assert isinstance(que["engine_queue_mean_s"], float) and que["engine_queue_mean_s"] > 1.0
    notes = que["notes"]
    assert isinstance(notes, list)
    assert any("not per ISL bucket" in n for n in notes)
    # the gateway's prompt-token counter per bucket makes the fit over the buckets' means
    fit = que["fit"]
    assert isinstance(fit, dict) and fit["method"] == "wls-bucket-means"
    d = runs["prefill"]
    pre = capacity_json("--metrics", d + "/g1.txt", "--engine-metrics", d + "/e1.txt")
    prefilling = pre["prefilling"]
    assert isinstance(prefilling, list) and {"4097-8192", "8193-16384", "16385+"} <= set(prefilling)


def test_scrape_without_engine_histograms_says_so(runs: dict[str, str]) -> None:
    # the split is then TTFT minus the prefill fitted over the buckets' means (the gateway's prompt-token
    # counter), and a note says the engine gave no times
    cap = capacity_json("--metrics", runs["queue"] + "/g1.txt")
    buckets = cap["buckets"]
    assert isinstance(buckets, list) and {b["split"] for b in buckets if b["split"]} == {"fit"}
    notes = cap["notes"]
    assert isinstance(notes, list) and any("no queue or prefill times from the engine" in n for n in notes)
    rc, out, _ = cli("--metrics", runs["queue"] + "/g1.txt", "--capacity")
    assert rc == 0 and "note: no queue or prefill times" in out


@pytest.mark.parametrize(("argv", "says"), [
    (["--engine-log", "x.jsonl"], "--engine-log is an input of --capacity"),
    (["--capacity", "--format", "csv"], "not csv"),
    (["--capacity", "--engine-metrics", "e.txt"], "--engine-metrics goes with --metrics"),
])
def test_bad_flags_are_one_line(runs: dict[str, str], argv: list[str], says: str) -> None:
    rc, out, err = cli("--results", runs["queue"], *argv)
    assert rc == 2 and out == "" and says in err and len(err.strip().splitlines()) == 1


def test_an_engine_log_of_another_run_is_an_error(runs: dict[str, str], tmp_path: Path) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text('{"request_id": "nobody", "queue_s": 1.0, "prefill_s": 0.1}\n')
    rc, _, err = cli("--results", runs["queue"], "--capacity", "--engine-log", str(other))
    assert rc == 2 and "no request id of" in err


def test_explain_shows_each_windows_capacity(runs: dict[str, str]) -> None:
    pre, que = runs["prefill"], runs["queue"]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["explain", "--results", pre, que, "--metric", "ttft", "--resamples", "50", "--capacity",
                   "--engine-log", pre + "/engine.jsonl", que + "/engine.jsonl", "--format", "json"])
    assert rc == 0, err.getvalue()
    cap = json.loads(out.getvalue())["capacity"]
    assert cap["before"]["prefilling"] == list(BUCKETS.labels) and cap["after"]["waiting"] == list(BUCKETS.labels)
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        assert main(["explain", "--metrics", pre + "/g0.txt", pre + "/g1.txt", que + "/g0.txt", que + "/g1.txt",
                     "--metric", "ttft", "--capacity"]) == 0
    text = out.getvalue()
    assert "earlier window: where the capacity is short" in text and "later window:" in text
    assert "note: no queue or prefill times from the engine" in text
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        assert main(["explain", "--results", pre, que, "--engine-log", "a", "b"]) == 2
    assert "--engine-log goes with --results and --capacity" in err.getvalue()


def test_scrapes_with_a_prompt_token_counter_fit_over_bucket_means(tmp_path: Path) -> None:
    # alone on an engine without attention cost, TTFT is linear in the prompt: the bucket means are too
    linear = BASE.with_overrides(prefill_attn_s_per_token_pair=0.0)
    recs, _ = run_loaded(3, BUCKETS, EVEN, 210, 1, linear)
    m = FrontendMetrics(isl_buckets=BUCKETS)
    m.register_model("test-model")
    feed_records(m, recs)
    # the gateway's own prompt-token counter (the records report cached tokens)
    text = m.exposition().decode()
    assert "servelens_prompt_tokens_by_isl_total{" in text
    (tmp_path / "g.txt").write_text(text)
    cap = capacity_json("--metrics", str(tmp_path / "g.txt"))
    fit = cap["fit"]
    assert isinstance(fit, dict) and fit["method"] == "wls-bucket-means"
    assert fit["throughput_tps"] == pytest.approx(1 / linear.prefill_s_per_token, rel=0.01)
    buckets = cap["buckets"]
    assert isinstance(buckets, list) and all(b["split"] == "fit" for b in buckets)


def test_fit_line_says_an_intercept_below_zero_is_no_overhead() -> None:
    from servelens.core.prefill_fit import PrefillFit
    from servelens.report.capacity_output import fit_line

    below = PrefillFit(60, 13_224.0, 12_530.0, 14_000.0, -0.0752, "uncached", "theil-sen")
    assert fit_line(below) == ("prefill throughput 13,224 tokens/s (95% interval 12,530-14,000), intercept -75.2 ms "
                               "(below 0: no overhead or wait, see the note): TTFT against uncached prompt tokens, "
                               "Theil-Sen over requests, 60 points")
    above = PrefillFit(60, 13_224.0, None, None, 0.3, "uncached", "wls-bucket-means")
    assert "intercept 300.0 ms (fixed overhead + queue floor)" in (fit_line(above) or "")
