"""The client and runner against a tiny in-test upstream (conftest.Upstream)."""

import json
from pathlib import Path
from typing import Any
from typing import Any as Upstream  # the fixture type lives in conftest.py

import pytest

from servelens.bench import BenchConfig, run_bench
from servelens.bench.traces import packaged_trace
from servelens.core.buckets import IslBuckets
from servelens.formats.columnar import columns_for, iter_columns
from servelens.formats.results import iter_results, load_results
from servelens.report.columnar import rows_from_columns


async def test_closed_loop_records_and_files(upstream: Upstream, tmp_path: Path) -> None:
    upstream.tokens_per_chunk = 2
    cfg = BenchConfig(url=upstream.url, isl="300:0.5,700:0.5", osl="5", num_requests=20, concurrency=4,
                      seed=3, output_dir=str(tmp_path))
    res = await run_bench(cfg)
    assert res.model == "tiny" and res.continuous_usage
    assert len(res.records) == 20 and res.errors == 0
    assert sorted(r.index for r in res.records) == list(range(20))
    r = res.records[0]
    assert r.request_id is not None and r.request_id.startswith("req-")
    # 5 tokens in chunks of 2,2,1 -> tokens from cumulative usage
    assert r.chunk_tokens == (2, 2, 1) and r.tokens_from_usage and r.osl == 5
    assert r.isl_server == r.isl_target  # sim tokenizer words == upstream's word count
    assert r.cached_tokens == 0
    assert list(r.chunk_offsets_ns) == sorted(r.chunk_offsets_ns)  # stamped per read: equal when one read
    assert r.first_output_ns == r.send_ns + r.chunk_offsets_ns[0]
    by = {row.bucket: row for row in res.client_rows}
    assert by["0-512"].requests + by["513-1024"].requests == 20 == by["all"].requests
    assert res.prompt_deviation.exact == 20
    assert load_results(tmp_path / "results.jsonl") == list(res.records)
    # the columns beside it: the same records, and the report's table from them is the bench's own
    assert list(iter_results(tmp_path / "results.jsonl")) == list(iter_columns(tmp_path / "results.cols"))
    assert columns_for(tmp_path) == tmp_path / "results.cols"
    assert tuple(rows_from_columns(tmp_path / "results.cols", IslBuckets(cfg.isl_buckets))) == res.client_rows
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["requests"] == 20 and summary["errors"] == 0
    assert "api_key" not in summary["config"]
    body = upstream.bodies[-1]
    assert body["stream"] is True and body["max_tokens"] == 5 and body["min_tokens"] == 5
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


async def test_falls_back_without_continuous_usage(upstream: Upstream) -> None:
    upstream.continuous_usage_ok = False
    upstream.tokens_per_chunk = 3
    res = await run_bench(BenchConfig(url=upstream.url, isl="10", osl="6", num_requests=3, endpoint="completions"))
    assert not res.continuous_usage and res.errors == 0
    r = res.records[0]
    assert r.chunk_tokens == (1, 1) and not r.tokens_from_usage and r.osl == 6  # OSL from the final usage
    assert "prompt" in upstream.bodies[-1]


async def test_errors_are_recorded_per_bucket(upstream: Upstream) -> None:
    res0 = await run_bench(BenchConfig(url=upstream.url, isl="10", osl="2", num_requests=1))
    assert res0.errors == 0
    upstream.fail_status = 429
    res = await run_bench(BenchConfig(url=upstream.url, isl="10", osl="2", num_requests=3, continuous_usage=True))
    assert res.errors == 3
    r = res.records[0]
    assert r.status == "error" and r.error_type == "overload" and r.http_status == 429
    assert "no capacity" in r.error and r.first_output_ns is None
    assert res.client_rows[0].errors == 3


async def test_truncated_stream_is_an_error(upstream: Upstream) -> None:
    upstream.truncate_after = 2
    res = await run_bench(BenchConfig(url=upstream.url, isl="10", osl="8", num_requests=2, continuous_usage=True))
    assert {r.error_type for r in res.records} == {"truncated_stream"}
    assert all(len(r.chunk_offsets_ns) == 2 for r in res.records)


async def test_trace_replay_drops_over_context(upstream: Upstream) -> None:
    # /v1/models reports max_model_len 4096: Mooncake rows with ISL+OSL above it are dropped
    cfg = BenchConfig(url=upstream.url, trace=str(packaged_trace()), time_scale=0.0, max_requests=5)
    res = await run_bench(cfg)
    assert res.dropped > 0 and res.clipped == 0
    assert all(r.isl_target + r.osl_target <= 4096 for r in res.records)
    assert len(res.records) == 5
    clip = await run_bench(BenchConfig(url=upstream.url, trace=str(packaged_trace()), time_scale=0.0,
                                       max_requests=4, long_requests="clip", max_context=2000))
    assert clip.clipped == 4 and all(r.isl_target + r.osl_target <= 2000 for r in clip.records)


async def test_rate_schedule_is_followed(upstream: Upstream, open_loop_starts: list[int]) -> None:
    """The plan is 100 req/s evenly spaced; what happened: each request sent in its order, none before
    its due time on the run's own clock. (That each starts *at* its due time is checked on a virtual
    clock in test_loops.py: here how late is a figure of the machine's load.)"""
    res = await run_bench(BenchConfig(url=upstream.url, isl="5", osl="2", num_requests=6, rate=100.0,
                                      arrival="constant"))
    (t_start,) = open_loop_starts
    recs = sorted(res.records, key=lambda r: r.index)
    assert [r.scheduled_ns for r in recs] == [i * 10_000_000 for i in range(6)]
    assert all(r.send_ns >= t_start + r.scheduled_ns for r in recs), [r.send_ns - t_start for r in recs]
    assert [r.index for r in sorted(recs, key=lambda r: r.send_ns)] == list(range(6))  # sent in order


async def test_user_errors(upstream: Upstream) -> None:
    with pytest.raises(ValueError, match="cannot reach"):
        await run_bench(BenchConfig(url="http://127.0.0.1:9", num_requests=1))
    with pytest.raises(ValueError, match="chat or completions"):
        BenchConfig(url=upstream.url, endpoint="embeddings")
    with pytest.raises(ValueError, match="uniform"):
        BenchConfig(url=upstream.url, isl="uniform:3")


async def test_interrupted_run_keeps_finished_requests(upstream: Upstream, tmp_path: Path) -> None:
    import asyncio

    upstream.gap_s = 0.01
    task = asyncio.create_task(run_bench(BenchConfig(url=upstream.url, isl="50", osl="4", num_requests=500,
                                                     concurrency=1, output_dir=str(tmp_path))))
    async with asyncio.timeout(30), upstream.arrived:  # wait until a few requests went through, then "Ctrl-C"
        await upstream.arrived.wait_for(lambda: len(upstream.bodies) >= 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    kept = load_results(tmp_path / "results.jsonl")
    assert 3 <= len(kept) < 500 and all(r.ok for r in kept)


@pytest.mark.parametrize("width", [80, 100, 200])
async def test_client_and_server_tables_are_never_cropped(upstream: Upstream, width: int) -> None:
    import dataclasses
    import io

    from rich.console import Console

    from servelens.bench import print_result

    res = await run_bench(BenchConfig(url=upstream.url, isl="300:0.5,20000:0.5", osl="3", num_requests=6))
    res = dataclasses.replace(res, server_rows=res.client_rows)  # as if the server agreed exactly
    buf = io.StringIO()
    print_result(res, Console(file=buf, width=width, color_system=None))
    lines = buf.getvalue().splitlines()
    tops = [line for line in lines if line.startswith("┏")]
    assert tops and all(t.endswith("┓") for t in tops), buf.getvalue()  # every table whole
    assert max(len(line) for line in lines) <= width
    assert "…" not in buf.getvalue()  # no header or cell cut
    one = "Client vs server" in buf.getvalue()  # the side-by-side table, else the client's and the server's
    assert len(tops) == (1 if one else 2) and (one or "Server (/metrics)" in buf.getvalue())  # no scrape: unnamed
    if width in (80, 200):  # too narrow for side by side / wide enough
        assert one == (width == 200)


async def test_server_table_names_what_served_the_metrics(upstream: Upstream) -> None:
    """The title said "gateway /metrics" whatever --metrics-url pointed at. A scrape with the gateway's
    own series is a gateway's; the ASGI middleware's (an engine's own /metrics) is not, and the table
    names its address."""
    import dataclasses
    import io

    import aiohttp
    from prometheus_client import CollectorRegistry, generate_latest
    from rich.console import Console

    from servelens.asgi import MetricsMiddleware
    from servelens.asgi.testing import TinyApp, call
    from servelens.bench import print_result
    from servelens.bench.control import server_kind
    from servelens.formats.metrics_text import parse_scrape
    from servelens.gateway.testing import run_gateway

    reg = CollectorRegistry()
    tiny = TinyApp()
    mw = MetricsMiddleware(tiny, registry=reg, isl_buckets="512", model="tiny", environ={})
    await call(mw, "/v1/chat/completions", {"model": "tiny", "messages": [], "stream": True, "max_tokens": 3},
               scope_extra={"app": tiny})
    assert server_kind(parse_scrape(generate_latest(reg).decode())) == "server"
    async with run_gateway(upstream.url) as gw, aiohttp.ClientSession() as session, \
            session.get(gw.metrics_url) as resp:
        assert server_kind(parse_scrape(await resp.text())) == "gateway"

    res = await run_bench(BenchConfig(url=upstream.url, isl="300", osl="3", num_requests=2))
    res = dataclasses.replace(res, server_rows=res.client_rows)

    def titles(summary: dict[str, Any]) -> list[str]:
        buf = io.StringIO()
        print_result(dataclasses.replace(res, summary=summary), Console(file=buf, width=250, color_system=None))
        return [line.strip() for line in buf.getvalue().splitlines() if "Client vs server" in line]

    config = {**res.summary["config"], "metrics_url": "http://127.0.0.1:8000/metrics"}
    assert titles({**res.summary, "config": config, "server_kind": "server"}) == [
        "Client vs server (127.0.0.1:8000/metrics)"]
    assert titles({**res.summary, "config": config, "server_kind": "gateway"}) == [
        "Client vs server (gateway /metrics)"]
