"""sim (prefix cache on) <- gateway --uncached-buckets <- bench --uncached-buckets: the same prompts sent
twice (the same seed), so the second pass hits the cache. Client and server agree on every request's
uncached bucket and on each ISL bucket's hit ratio; the tables, report and summary carry them."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from rich.console import Console

from servelens.bench import BenchConfig, run_bench
from servelens.bench.printing import print_result
from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.formats.metrics_text import parse_scrape
from servelens.gateway.testing import run_gateway
from servelens.report.sources import report_from_metrics
from servelens.sim.testing import run_sim

UNCACHED = IslBuckets.parse("256,1024,2048,4096")
ISL = IslBuckets.default()


async def test_uncached_buckets_and_hit_ratio_client_and_server_agree(tmp_path: Path) -> None:
    async with run_sim(seed=2) as sim, run_gateway(sim.url, uncached_buckets=UNCACHED.spec) as gw:
        before = gw.metrics.exposition().decode()
        results = []
        for run in ("cold", "warm"):
            results.append(await run_bench(BenchConfig(
                url=gw.url, isl="3000", osl="4", num_requests=6, concurrency=1, seed=7,
                uncached_buckets=UNCACHED.boundaries, metrics_url=gw.url + "/metrics",
                output_dir=str(tmp_path / run))))
        after = gw.metrics.exposition().decode()
    cold, warm = results
    assert cold.errors == warm.errors == 0
    # the warm pass finds each prompt cached (all but the last partial block): few uncached tokens
    assert all(r.cached_tokens is not None and r.cached_tokens >= 2900 for r in warm.records)
    for res in results:
        assert res.uncached_client_rows is not None and res.uncached_server_rows is not None
        client = {r.bucket: r.requests for r in res.uncached_client_rows}
        server = {r.bucket: r.requests for r in res.uncached_server_rows}
        assert client == server and sum(v for k, v in client.items() if k != "all") == 6
        # ISL buckets: both passes in 2049-4096; the hit ratio, client and server, from the same usage
        c_isl = next(r for r in res.client_rows if r.bucket == "2049-4096")
        s_isl = next(r for r in res.server_rows or () if r.bucket == "2049-4096")
        assert c_isl.requests == s_isl.requests == 6
        assert c_isl.cache_hit_ratio is not None and s_isl.cache_hit_ratio == pytest.approx(c_isl.cache_hit_ratio)
    assert {r.bucket: r.requests for r in warm.uncached_client_rows or ()}["0-256"] == 6
    warm_hit = next(r for r in warm.client_rows if r.bucket == "2049-4096").cache_hit_ratio
    assert warm_hit is not None and warm_hit > 0.95
    summary = json.loads((tmp_path / "warm" / "summary.json").read_text())
    assert [r["bucket"] for r in summary["client_rows_by_uncached"]] == [*UNCACHED.labels, "all"]
    assert summary["server_rows_by_uncached"][0]["requests"] == 6
    buf = io.StringIO()
    print_result(warm, Console(file=buf, width=200))
    assert "Uncached prompt" in buf.getvalue() and "Cache hit" in buf.getvalue()
    # report: the same from the results file and from the two scrapes, numeric order
    b, a = tmp_path / "before.txt", tmp_path / "after.txt"
    b.write_text(before)
    a.write_text(after)
    rep = report_from_metrics(str(a), gw.metrics.names, str(b), by="uncached")
    assert [r.bucket for r in rep.rows] == [*UNCACHED.labels, "all"]
    assert 6 <= {r.bucket: r.requests for r in rep.rows}["0-256"] <= 8  # + each run's one-token probe request
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", "--results", str(tmp_path / "warm"), "--uncached-buckets", UNCACHED.spec,
                     "--format", "json", "--html", str(tmp_path / "r.html")]) == 0
    assert "<th>Uncached prompt (tokens)</th>" in (tmp_path / "r.html").read_text()
    rows = json.loads(out.getvalue())
    assert [r["bucket"] for r in rows] == [*UNCACHED.labels, "all"] and rows[0]["requests"] == 6
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", "--metrics", str(a), "--metrics-before", str(b), "--by", "uncached",
                     "--format", "markdown"]) == 0
    assert out.getvalue().splitlines()[2].startswith("| Uncached prompt (tokens) | Requests |")
    assert "| 0-256 |" in out.getvalue()
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", "--metrics", str(a), "--metrics-before", str(b), "--format", "json"]) == 0
    isl_rows = {r["bucket"]: r for r in json.loads(out.getvalue())}
    # the hit ratio from the known scrape: cached_tokens_by_isl_sum / prompt_tokens_by_isl_total
    s0, s1 = parse_scrape(before), parse_scrape(after)
    n = gw.metrics.names
    cached = (s1.value(n.cached_by_isl + "_sum", {"isl_bucket": "2049-4096"})
              - s0.value(n.cached_by_isl + "_sum", {"isl_bucket": "2049-4096"}))
    prompt = (s1.value(n.prompt_tokens_by_isl, {"isl_bucket": "2049-4096"})
              - s0.value(n.prompt_tokens_by_isl, {"isl_bucket": "2049-4096"}))
    assert prompt == sum(r.isl or 0 for res in results for r in res.records)  # the probes are shorter
    assert isl_rows["2049-4096"]["cache_hit_ratio"] == pytest.approx(cached / prompt)
    every = [s1.value(name) - s0.value(name) for name in (n.cached_by_isl + "_sum", n.prompt_tokens_by_isl)]
    assert isl_rows["all"]["cache_hit_ratio"] == pytest.approx(every[0] / every[1])  # the probes too
    # by uncached buckets, "all requests" is the same requests with the same hit ratio (it was None, "-",
    # beside the bench's server table, which showed it); the uncached buckets have no cached tokens
    by_uncached = {r.bucket: r for r in rep.rows}
    assert by_uncached["all"].cache_hit_ratio == pytest.approx(every[0] / every[1])
    assert all(by_uncached[label].cache_hit_ratio is None for label in UNCACHED.labels)
    bench_all = next(r for r in warm.uncached_server_rows or () if r.bucket == "all")
    assert bench_all.cache_hit_ratio == next(r for r in warm.server_rows or () if r.bucket == "all").cache_hit_ratio
    assert isl_rows["513-1024"]["cache_hit_ratio"] is None  # no request there: unknown, not 0


@pytest.mark.parametrize("argv, message", [
    (["--by", "isl", "--uncached-buckets", "512"], "--uncached-buckets goes with --by uncached"),
    (["--by", "uncached", "--isl-buckets", "512"], "not --isl-buckets"),
    (["--uncached-buckets", "512,100"], "--uncached-buckets: ISL bucket boundaries must be strictly increasing"),
    (["--by", "uncached", "--slo-ttft", "1"], "SLO attainment is per ISL bucket"),
])
def test_report_by_uncached_bad_input_is_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text("")
    err = io.StringIO()
    from contextlib import redirect_stderr
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        assert main(["report", "--results", str(results), *argv]) != 0
    assert message in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1, err.getvalue()


def test_bench_config_checks_uncached_buckets() -> None:
    with pytest.raises(ValueError, match="--uncached-buckets: at most 32"):
        BenchConfig(url="http://127.0.0.1:1", uncached_buckets=tuple(range(1, 34)))
    assert BenchConfig(url="http://127.0.0.1:1").uncached_buckets is None
