"""Issue 5's workload and output options, each against the tiny upstream (conftest.Upstream):
trace replay by timestamps x ``--time-scale``, ``--duration``, ``--seed``, the default model,
``--isl-buckets``, dropped/clipped counts in the summary, the prompt-length report, the progress
bar and the not-trustworthy marker."""

import asyncio
import dataclasses
import io
import json
import re
from pathlib import Path
from typing import Any as Upstream  # the fixture type lives in conftest.py

import pytest
from rich.console import Console

from servelens.bench import BenchConfig, print_result, run_bench
from servelens.bench.lag import LagReport
from servelens.bench.summary import PromptDeviation
from servelens.bench.traces import packaged_trace

MS = 1_000_000


def write_trace(folder: Path, fmt: str, offsets_ms: list[int]) -> Path:
    """A small trace of ``fmt`` whose first row is not at time 0 (offsets are taken from it)."""
    if fmt == "mooncake":
        path = folder / "t.jsonl"
        path.write_text("".join(json.dumps({"timestamp": 7_000 + o, "input_length": 20 + i, "output_length": 2,
                                            "hash_ids": [i]}) + "\n" for i, o in enumerate(offsets_ms)))
        return path
    path = folder / "t.csv"
    rows = [f"2023-11-16 18:15:{46 + o // 1000:02d}.{(o % 1000) * 10_000:07d},{20 + i},2"
            for i, o in enumerate(offsets_ms)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("fmt", ["mooncake", "azure"])
async def test_trace_is_replayed_by_its_timestamps_times_the_scale(upstream: Upstream, tmp_path: Path,
                                                                   fmt: str, open_loop_starts: list[int]) -> None:
    # trace offsets 0, 1, 3 and 9 s; --time-scale 0.01 -> due at 0, 10, 30, 90 ms; --duration 0.05 s keeps 3
    # (the loop starts each request at its due time: test_loops.py, on a virtual clock)
    path = write_trace(tmp_path, fmt, [0, 1_000, 3_000, 9_000])
    res = await run_bench(BenchConfig(url=upstream.url, trace=str(path), time_scale=0.01, duration_s=0.05))
    recs = sorted(res.records, key=lambda r: r.index)
    assert [r.scheduled_ns for r in recs] == [0, 10 * MS, 30 * MS]
    assert [r.isl_target for r in recs] == [20, 21, 22]  # lengths from the trace, in its order
    (t_start,) = open_loop_starts
    assert all(r.send_ns >= t_start + r.scheduled_ns for r in recs)  # none sent before it was due
    assert res.summary["config"]["time_scale"] == 0.01


async def test_max_requests_bounds_a_trace(upstream: Upstream, tmp_path: Path) -> None:
    path = write_trace(tmp_path, "mooncake", [0, 1, 2, 3, 4])
    res = await run_bench(BenchConfig(url=upstream.url, trace=str(path), time_scale=0.0, max_requests=2))
    assert sorted(r.isl_target for r in res.records) == [20, 21]


async def test_duration_bounds_open_and_closed_loops(upstream: Upstream) -> None:
    # both bounds hold on a busy machine: the open loop stops by the planned due times, not the clock;
    # the closed loop's upper bound comes from each request's own 20 ms, and load only lowers the count
    # open loop: 100 req/s, constant -> due at 0, 10, ..., 190 ms; 45 ms keeps the first 5
    res = await run_bench(BenchConfig(url=upstream.url, isl="5", osl="1", num_requests=20, rate=100.0,
                                      arrival="constant", duration_s=0.045))
    assert len(res.records) == 5
    # closed loop: every request takes >= 20 ms (the upstream waits before its chunk), so one worker
    # can start at most 3 within 50 ms (at 0, >= 20 and >= 40 ms)
    upstream.gap_s = 0.02
    res = await run_bench(BenchConfig(url=upstream.url, isl="5", osl="1", num_requests=50, concurrency=1,
                                      duration_s=0.05, continuous_usage=True))
    assert 1 <= len(res.records) <= 3 and res.errors == 0


async def test_seed_gives_the_same_workload(upstream: Upstream) -> None:
    def cfg(seed: int) -> BenchConfig:
        return BenchConfig(url=upstream.url, isl="uniform:10-500", osl="lognormal:6,3", num_requests=8,
                           seed=seed, continuous_usage=True)

    runs = []
    for seed in (7, 7, 8):
        upstream.bodies.clear()
        res = await run_bench(cfg(seed))
        recs = sorted(res.records, key=lambda r: r.index)
        prompts = sorted(b["messages"][0]["content"] for b in upstream.bodies)
        runs.append(([(r.isl_target, r.osl_target) for r in recs], prompts))
    assert runs[0] == runs[1]  # same seed: same lengths and the same prompt texts
    assert runs[0][0] != runs[2][0] and runs[0][1] != runs[2][1]


async def test_model_defaults_to_the_first_listed_and_url_may_end_in_v1(upstream: Upstream) -> None:
    upstream.more_models = ("second",)
    res = await run_bench(BenchConfig(url=upstream.url + "/v1/", isl="5", osl="1", num_requests=1))
    assert res.model == "tiny" and upstream.bodies[-1]["model"] == "tiny"
    res = await run_bench(BenchConfig(url=upstream.url, model="second", isl="5", osl="1", num_requests=1))
    assert res.model == "second" and upstream.bodies[-1]["model"] == "second"


async def test_isl_buckets_change_the_rows(upstream: Upstream, tmp_path: Path) -> None:
    res = await run_bench(BenchConfig(url=upstream.url, isl="50:0.5,300:0.5", osl="1", num_requests=10,
                                      isl_buckets=(100, 400), output_dir=str(tmp_path)))
    assert [r.bucket for r in res.client_rows] == ["0-100", "101-400", "401+", "all"]
    by = {r.bucket: r.requests for r in res.client_rows}
    assert by["0-100"] + by["101-400"] == 10 and by["401+"] == 0 and by["0-100"] > 0 and by["101-400"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["isl_buckets"] == [100, 400]


async def test_dropped_and_clipped_counts_reach_summary_and_console(upstream: Upstream, tmp_path: Path) -> None:
    # /v1/models reports max_model_len 4096
    res = await run_bench(BenchConfig(url=upstream.url, trace=str(packaged_trace()), time_scale=0.0, max_requests=3,
                                      output_dir=str(tmp_path)))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert res.dropped > 0 and summary["dropped_over_context"] == res.dropped and summary["max_context"] == 4096
    buf = io.StringIO()
    print_result(res, Console(file=buf, width=150))
    assert f"over the context (4096 tokens): {res.dropped} dropped, 0 clipped" in buf.getvalue()
    # a synthetic request over the context, clipped: ISL cut so that ISL + OSL fits
    clip = await run_bench(BenchConfig(url=upstream.url, isl="5000", osl="100", num_requests=2, max_context=2000,
                                       long_requests="clip"))
    assert clip.clipped == 2 and clip.summary["clipped_to_context"] == 2
    assert {(r.isl_target, r.osl_target) for r in clip.records} == {(1900, 100)}
    with pytest.raises(ValueError, match=r"empty: 2 requests were over the context \(2000 .*--long-requests clip"):
        await run_bench(BenchConfig(url=upstream.url, isl="5000", osl="100", num_requests=2, max_context=2000))


@pytest.mark.parametrize("continuous_usage", [None, True])
async def test_clip_leaves_room_for_the_chat_template_the_probe_reported(
    upstream: Upstream, continuous_usage: bool | None
) -> None:
    """An endpoint that adds 7 template tokens to every prompt and refuses what exceeds its context:
    prompts clipped to the whole context all failed (Dynamo: 21 of 300); clipped to the context less the
    template, learned from the probe's usage, all succeed. Also when --no-continuous-usage style settings
    skip the options probe (one probe is sent for the template then)."""
    upstream.prompt_extra_tokens = 7
    upstream.context_limit = 2000
    res = await run_bench(BenchConfig(url=upstream.url, isl="5000:0.5,1990:0.5", osl="100", num_requests=4,
                                      max_context=2000, long_requests="clip", continuous_usage=continuous_usage))
    assert res.errors == 0 and res.clipped == 4, [r.error for r in res.records]
    assert {(r.isl_target, r.osl_target) for r in res.records} == {(1893, 100)}
    assert all(r.isl == 1900 for r in res.records)  # the server's count: prompt + template + output fit
    assert res.summary["template_tokens"] == 7 and res.summary["max_context"] == 2000
    buf = io.StringIO()
    print_result(res, Console(file=buf, width=150))
    assert "over the context (2000 tokens, 7 of them the endpoint's chat template): 0 dropped, 4 clipped" in (
        buf.getvalue())
    # drop: what fits without the template but not with it is dropped, not sent to fail
    with pytest.raises(ValueError, match=r"empty: 2 requests were over the context \(2000 tokens, ISL \+ OSL \+ 7 of "
                       r"chat template\) and dropped"):
        await run_bench(BenchConfig(url=upstream.url, isl="1895", osl="100", num_requests=2, max_context=2000))


async def test_the_template_is_learned_for_a_given_or_a_discovered_context(upstream: Upstream) -> None:
    upstream.prompt_extra_tokens = 7
    res = await run_bench(BenchConfig(url=upstream.url, isl="10", osl="1", num_requests=1, max_context=2000))
    assert res.summary["template_tokens"] == 7
    res = await run_bench(BenchConfig(url=upstream.url, isl="10", osl="1", num_requests=1))  # 4096 from /v1/models
    assert res.summary["template_tokens"] == 7
    upstream.prompt_extra_tokens = 0
    assert (await run_bench(BenchConfig(url=upstream.url, isl="10", osl="1", num_requests=1))).summary[
        "template_tokens"] == 0


async def test_prompt_length_report_when_the_server_counts_more(upstream: Upstream) -> None:
    upstream.prompt_extra_tokens = 7  # as a chat template would add
    res = await run_bench(BenchConfig(url=upstream.url, isl="300", osl="1", num_requests=3))
    dev = res.prompt_deviation
    assert (dev.reported, dev.exact, dev.mean_diff, dev.max_diff) == (3, 0, 7.0, 7)
    assert res.summary["prompt_tokens_vs_target"]["mean_diff"] == 7.0
    assert "0/3 exact, server - target mean +7.0" in dev.line()
    assert all(r.isl == 307 for r in res.records)  # the server's count decides the bucket
    assert "did not report" in PromptDeviation.of([]).line()


async def test_progress_bar_shows_done_errors_and_elapsed(
    upstream: Upstream, capsys: pytest.CaptureFixture[str]
) -> None:
    await run_bench(BenchConfig(url=upstream.url, isl="5", osl="1", num_requests=4, progress=True))
    err = capsys.readouterr().err
    assert "4/4" in err and "errors 0" in err and re.search(r"\b\d+:\d\d:\d\d\b", err), err  # h:mm:ss elapsed
    upstream.fail_status = 503
    await run_bench(BenchConfig(url=upstream.url, isl="5", osl="1", num_requests=3, progress=True,
                                continuous_usage=True))
    err = capsys.readouterr().err
    assert "3/3" in err and "errors 3" in err, err


async def test_untrustworthy_client_is_marked_on_the_table(upstream: Upstream) -> None:
    res = await run_bench(BenchConfig(url=upstream.url, isl="5", osl="1", num_requests=2))
    slow = LagReport(samples=50, p50_ms=30.0, p99_ms=45.0, max_ms=60.0, interval_ms=10.0, threshold_ms=10.0)
    buf = io.StringIO()
    print_result(dataclasses.replace(res, lag=slow), Console(file=buf, width=150))
    text = buf.getvalue()
    assert "[CLIENT FIGURES NOT TRUSTWORTHY]" in text and "NOT TRUSTWORTHY: client event-loop lag p99 45.0" in text
    fast = dataclasses.replace(slow, p50_ms=0.1, p99_ms=2.0, max_ms=3.0)
    buf = io.StringIO()
    print_result(dataclasses.replace(res, lag=fast), Console(file=buf, width=150))
    assert "NOT TRUSTWORTHY" not in buf.getvalue() and "client figures are trustworthy" in buf.getvalue()


async def test_unreachable_metrics_url_is_one_clear_error(upstream: Upstream) -> None:
    with pytest.raises(ValueError, match=r"^cannot scrape http://127\.0\.0\.1:9/metrics: cannot connect \(") as exc:
        await run_bench(BenchConfig(url=upstream.url, isl="5", osl="1", num_requests=1,
                                    metrics_url="http://127.0.0.1:9/metrics"))
    assert "ssl:default" not in str(exc.value)


async def test_a_failed_final_scrape_keeps_the_results(upstream: Upstream, tmp_path: Path) -> None:
    # the results were written only after the final /metrics scrape: a scrape error lost the whole run
    from servelens.formats.results import load_results

    upstream.metrics_ok_scrapes = 1  # the "before" scrape works, the one after the load fails
    res = await run_bench(BenchConfig(url=upstream.url, isl="10", osl="2", num_requests=3,
                                      metrics_url=upstream.url + "/metrics", output_dir=str(tmp_path)))
    assert res.server_rows is None and "HTTP 500" in res.summary["server_error"]
    assert len(load_results(tmp_path / "results.jsonl")) == 3
    assert json.loads((tmp_path / "summary.json").read_text())["server_error"] == res.summary["server_error"]
    buf = io.StringIO()
    print_result(res, Console(file=buf, width=150))
    assert "server side: none, the final scrape failed" in buf.getvalue()


async def test_rate_inf_sends_everything_at_once_and_nan_is_refused(upstream: Upstream) -> None:
    # vLLM's --request-rate inf: every request due at 0 and all in flight together. The upstream answers
    # none until all 8 have arrived, so the run ends only if the bench sent them without waiting for
    # any reply (one sent after another's reply would wait for ever)
    upstream.hold_until = 8
    async with asyncio.timeout(30):  # a bound for a hung test, not a figure
        res = await run_bench(BenchConfig(url=upstream.url, isl="5", osl="2", num_requests=8, rate=float("inf"),
                                          continuous_usage=True))
    assert len(res.records) == 8 and res.errors == 0
    assert [r.scheduled_ns for r in res.records] == [0] * 8
    assert max(r.send_ns for r in res.records) < min(r.first_output_ns or 0 for r in res.records)
    with pytest.raises(ValueError, match="rate must be a number"):
        BenchConfig(url=upstream.url, rate=float("nan"))


async def test_slo_attainment_and_goodput_in_the_table_and_summary(upstream: Upstream, tmp_path: Path) -> None:
    # a threshold no TTFT can miss and one every TTFT misses: attainment by definition, not by timing
    res = await run_bench(BenchConfig(url=upstream.url, isl="50:0.5,300:0.5", osl="3", num_requests=12,
                                      isl_buckets=(100, 400), output_dir=str(tmp_path), slo_ttft="0-100=1000,"
                                      "101-400=0,401+=1000", slo_itl="1000"))
    assert res.attainment is not None and res.slo is not None
    rows = {r.label: r for r in res.attainment}
    assert rows["0-100"].ttft_share == 1.0 and rows["101-400"].ttft_share == 0.0
    assert rows["all"].all_met == rows["0-100"].requests and rows["all"].itl_share == 1.0
    assert rows["all"].goodput_rps == pytest.approx(rows["0-100"].requests / res.elapsed_s)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["slo_ttft"].startswith("0-100=1000") and summary["slo"]["rows"][-1]["label"] == "all"
    buf = io.StringIO()
    print_result(res, Console(file=buf, width=150))
    assert "SLO attainment (client, exact)" in buf.getvalue() and "Goodput" in buf.getvalue()
    with pytest.raises(ValueError, match="SLO table names"):
        BenchConfig(url=upstream.url, isl_buckets=(100, 400), slo_ttft="0-100=1")
