"""End to end: the bench against the simulated engine, directly and through the gateway.

The sim runs in this process, so its truth records use the same ``perf_counter_ns`` clock as the
bench's records (joined by ``x-request-id``).
"""

import io
import re

from rich.console import Console

from servelens.bench import BenchConfig, print_result, run_bench
from servelens.bench.traces import packaged_trace
from servelens.core.buckets import IslBuckets
from servelens.core.summary import ALL_LABEL
from servelens.gateway.testing import run_gateway
from servelens.sim.testing import run_sim

MS = 1_000_000
BUCKETS = (512, 1024, 2048, 4096, 8192, 16384)
LABELS = IslBuckets(BUCKETS)


async def test_client_ttft_contains_the_sims_and_lengths_match_truth() -> None:
    async with run_sim(speedup=10) as sim:
        cfg = BenchConfig(url=sim.url, isl="200:0.4,900:0.3,3000:0.3", osl="16", num_requests=40,
                          concurrency=4, seed=11)
        res = await run_bench(cfg)
        assert res.errors == 0 and len(res.records) == 40
        assert res.prompt_deviation.exact == 40  # the sim's tokenizer: prompts have exactly their target length
        diffs_ms = []
        for r in res.records:
            assert r.request_id is not None
            truth = await sim.wait_truth(r.request_id, timeout=30)
            assert truth.isl == r.isl_server == r.isl_target
            assert truth.osl == r.osl == 16
            assert truth.cached_tokens == r.cached_tokens
            assert truth.ttft_ns is not None and truth.first_token_ns is not None and r.first_output_ns is not None
            # the client sends before the sim's handler sees the request and stamps the first chunk after
            # the engine step that produced it ended
            assert r.send_ns <= truth.arrival_ns and r.first_output_ns >= truth.first_token_ns
            diffs_ms.append((r.first_output_ns - r.send_ns - truth.ttft_ns) / MS)
        # how close (a few ms) is a figure of this machine's load, kept in docs/benchmarks.md
        print("direct, client - truth TTFT (ms):", sorted(diffs_ms))
        by = {row.bucket: row for row in res.client_rows}
        assert by["0-512"].requests + by["513-1024"].requests + by["2049-4096"].requests == 40
        assert res.lag.samples > 0


async def test_trace_shares_prefixes_in_the_sim() -> None:
    async with run_sim(speedup=50) as sim:
        cfg = BenchConfig(url=sim.url, trace=str(packaged_trace()), time_scale=0.0, max_requests=12,
                          concurrency=4, max_context=16384, long_requests="clip")
        res = await run_bench(cfg)
        assert res.errors == 0 and res.prompt_deviation.exact == len(res.records) == 12
        recs = sorted(res.records, key=lambda r: r.index)
        # every Mooncake conversation row starts with hash id 0: after the first, the 512-token
        # block is a prefix-cache hit in the engine
        assert any((r.cached_tokens or 0) >= 512 for r in recs[1:])
        for r in recs:
            truth = await sim.wait_truth(r.request_id or "", timeout=30)
            assert truth.cached_tokens == r.cached_tokens


async def test_through_gateway_buckets_and_counts_agree() -> None:
    async with run_sim(speedup=20) as sim, run_gateway(sim.url, isl_buckets="512,1024,2048,4096,8192,16384") as gw:
        # a request before the run: the before/after difference must exclude it
        warm = await run_bench(BenchConfig(url=gw.url, isl="100", osl="4", num_requests=2, continuous_usage=True))
        assert warm.errors == 0
        cfg = BenchConfig(url=gw.url, isl="300:0.5,1500:0.3,5000:0.2", osl="8", num_requests=30, concurrency=6,
                          seed=5, metrics_url=gw.url + "/metrics")
        res = await run_bench(cfg)
        assert res.errors == 0
        assert res.server_rows is not None and res.server_rows
        server = {row.bucket: row for row in res.server_rows}
        client = {row.bucket: row for row in res.client_rows}
        for label, crow in client.items():
            if crow.requests:
                assert server[label].requests == crow.requests, label
        assert server[ALL_LABEL].requests == client[ALL_LABEL].requests == 30
        # per request the engine's TTFT lies inside the gateway's, which lies inside the client's: so
        # per bucket the means are ordered (the server's is exact: the histogram's sum over its count)
        truth_ttft: dict[str, list[float]] = {}
        for r in res.records:
            truth = await sim.wait_truth(r.request_id or "", timeout=30)
            assert truth.ttft_ns is not None and r.first_output_ns is not None
            assert r.send_ns <= truth.arrival_ns and r.first_output_ns >= truth.first_token_ns  # type: ignore[operator]
            truth_ttft.setdefault(LABELS.label(r.isl), []).append(truth.ttft_ns / 1e9)  # type: ignore[arg-type]
        for label, crow in client.items():
            if label == ALL_LABEL or not crow.requests:
                continue
            srow = server[label]
            assert srow.ttft_mean_s is not None and crow.ttft_mean_s is not None
            engine_mean_s = sum(truth_ttft[label]) / len(truth_ttft[label])
            assert engine_mean_s < srow.ttft_mean_s <= crow.ttft_mean_s + 1e-9, (label, engine_mean_s, srow, crow)
    # what is printed: client and server side by side where that fits with no cell wrapped, else the
    # client's table and then the server's, one line per bucket (at 80 columns: the unit in the headers)
    for width, stacked in ((80, True), (100, True), (250, False)):
        buf = io.StringIO()
        print_result(res, Console(file=buf, width=width, force_terminal=False, color_system=None))
        out = buf.getvalue()
        assert max(len(line) for line in out.splitlines()) <= width, out
        assert not [line for line in out.splitlines() if re.match(r"│\s+│", line)], out  # no wrapped cell
        assert ("Client (exact percentiles)" in out and "Server (gateway /metrics)" in out) == stacked, out
        used = [label for label, crow in client.items() if crow.requests]
        for label in used:  # once per table
            shown = "all requests" if label == ALL_LABEL else label
            assert len([line for line in out.splitlines() if line.startswith(f"│ {shown} ")]) == (
                2 if stacked else 1), (label, out)


async def test_by_isl_only_server_all_row_is_the_buckets_summed() -> None:
    """A sidecar gateway (--by-isl-only) exports no stock histograms: the server's "all requests" row is
    the by-ISL histograms summed over the buckets (it was "-"), its count every request's."""
    async with run_sim(speedup=20) as sim, run_gateway(sim.url, isl_buckets="512,1024,2048,4096,8192,16384",
                                                       by_isl_only=True) as gw:
        cfg = BenchConfig(url=gw.url, isl="300:0.5,1500:0.3,5000:0.2", osl="8", num_requests=20, concurrency=4,
                          seed=7, metrics_url=gw.url + "/metrics")
        res = await run_bench(cfg)
    assert res.errors == 0 and res.server_rows
    server = {row.bucket: row for row in res.server_rows}
    buckets = [row for row in res.server_rows if row.bucket != ALL_LABEL and row.requests]
    total = server[ALL_LABEL]
    assert total.requests == sum(r.requests for r in buckets) == 20
    # the mean of the sum is the count-weighted mean of the buckets (sums and counts add)
    assert total.ttft_mean_s is not None
    weighted = sum((r.ttft_mean_s or 0) * r.requests for r in buckets) / total.requests
    assert abs(total.ttft_mean_s - weighted) < 1e-9
    assert total.ttft_p50_s is not None and total.itl_p50_s is not None
    assert res.summary["server_all_from_buckets"] is True
    buf = io.StringIO()
    print_result(res, Console(file=buf, width=250, force_terminal=False, color_system=None))
    assert "server 'all requests': the by-ISL histograms summed over the buckets" in buf.getvalue()
