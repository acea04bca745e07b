"""Exact percentiles on a synthetic result set with known answers, and the results file round trip."""

from pathlib import Path

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.summary import rows_from_samples
from servelens.formats.results import BenchRecord, load_results, to_samples, write_results

MS = 1_000_000


def rec(i: int, isl: int, ttft_ms: int, gaps_ms: tuple[int, ...] = (), ok: bool = True, tokens: tuple[int, ...] = (),
        isl_server: int | None = None, cached: int | None = None) -> BenchRecord:
    send = 10_000 * MS + i * MS
    offs = [ttft_ms * MS]
    for g in gaps_ms:
        offs.append(offs[-1] + g * MS)
    toks = tokens or (1,) * len(offs)
    return BenchRecord(
        index=i, request_id=f"r{i}", scheduled_ns=0, send_ns=send, wall_send_ns=1_700_000_000_000_000_000 + i,
        first_output_ns=send + offs[0] if ok else None, end_ns=send + offs[-1] + MS,
        chunk_offsets_ns=tuple(offs) if ok else (), chunk_tokens=toks if ok else (), tokens_from_usage=True,
        isl_target=isl, isl_server=isl_server, osl_target=len(offs), osl=sum(toks) if ok else None,
        cached_tokens=cached, status="success" if ok else "error", error_type="" if ok else "overload",
        error="" if ok else "HTTP 429: busy", http_status=200 if ok else 429,
    )


def test_known_percentiles_per_bucket() -> None:
    # bucket 0-512: TTFT 1..100 ms (100 requests) -> numpy linear p50 = 50.5, p95 = 95.05, p99 = 99.01
    small = [rec(i, 100, i + 1, cached=10 * (i % 2)) for i in range(100)]
    # bucket 513-1024: 3 requests TTFT 200, 400, 600 ms; ITL gaps (one 2-token chunk after 40 ms -> 20,20)
    mid = [rec(100 + j, 600, t, gaps_ms=(40,), tokens=(1, 2)) for j, t in enumerate((200, 400, 600))]
    # one failure in 513-1024, counted as an error
    bad = [rec(200, 700, 0, ok=False)]
    # isl_server decides the bucket: target 100 but the server said 3000 -> 2049-4096
    moved = [rec(300, 100, 1000, isl_server=3000)]
    rows = rows_from_samples(to_samples(small + mid + bad + moved), IslBuckets.default())
    by = {r.bucket: r for r in rows}
    assert [r.bucket for r in rows] == [*IslBuckets.default().labels, "all"]
    s = by["0-512"]
    assert s.requests == 100 and s.errors == 0
    assert s.ttft_p50_s == pytest.approx(0.0505)
    assert s.ttft_p95_s == pytest.approx(0.09505)
    assert s.ttft_p99_s == pytest.approx(0.09901)
    assert s.mean_cached_tokens == pytest.approx(5.0)
    assert s.low_count is False
    m = by["513-1024"]
    assert m.requests == 4 and m.errors == 1 and m.low_count
    assert m.ttft_p50_s == pytest.approx(0.4)
    assert m.itl_p50_s == pytest.approx(0.02) and m.itl_p95_s == pytest.approx(0.02)
    assert by["2049-4096"].requests == 1 and by["2049-4096"].ttft_p50_s == pytest.approx(1.0)
    assert by["all"].requests == 105 and by["all"].errors == 1
    assert by["16385+"].requests == 0 and by["16385+"].ttft_p50_s is None


def test_itl_values_follow_core_definition() -> None:
    r = rec(0, 10, 5, gaps_ms=(30, 10), tokens=(2, 3, 1))
    # the first chunk's extra token has no ITL; 30 ms over 3 tokens -> 3 x 10 ms; then 10 ms
    assert r.itl_values_s() == pytest.approx((0.01, 0.01, 0.01, 0.01))
    assert r.ttft_s == pytest.approx(0.005)


def test_round_trip(tmp_path: Path) -> None:
    records = [rec(i, 100 * (i + 1), i + 1, gaps_ms=(3, 4)) for i in range(5)] + [rec(9, 50, 0, ok=False)]
    path = write_results(tmp_path / "out" / "results.jsonl", records)
    assert load_results(path) == records
    assert load_results(tmp_path / "out") == records  # a folder means its results.jsonl
    path.write_text(path.read_text() + '{"index": "x"}\n')
    with pytest.raises(ValueError, match=r"results.jsonl:7: not a bench result line"):
        load_results(path)
