"""The demo's hop table: per bucket the client's TTFT p50, the gateway's exact one from its request
log (joined by the engine's response id), the histogram's, and the median per-request hop."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from servelens.core.buckets import IslBuckets
from servelens.core.summary import BucketRow
from servelens.demo_hop import gateway_ttft_by_id, hop_rows, print_hop
from servelens.formats.results import BenchRecord

MS = 1_000_000


def _record(i: int, isl: int, ttft_ms: int, status: str = "success") -> BenchRecord:
    return BenchRecord(index=i, request_id=f"cmpl-{i}", scheduled_ns=0, send_ns=0, wall_send_ns=0,
                       first_output_ns=ttft_ms * MS, end_ns=(ttft_ms + 5) * MS, chunk_offsets_ns=(0,),
                       chunk_tokens=(1,), tokens_from_usage=True, isl_target=isl, isl_server=isl, osl_target=1,
                       osl=1, cached_tokens=None, status=status)


def test_hop_rows_split_the_gap_into_hop_and_histogram(tmp_path: Path) -> None:
    log = tmp_path / "gateway-normal-requests.jsonl"
    lines = [{"upstream_request_id": f"cmpl-{i}", "status": "success", "ttft_s": t / 1000}
             for i, t in enumerate((18, 28, 38, 98))]
    lines.append({"upstream_request_id": "cmpl-9", "status": "error", "ttft_s": None})
    log.write_text("\n".join(json.dumps(e) for e in lines) + "\n")
    gw = gateway_ttft_by_id([log, tmp_path / "missing.jsonl"])
    assert gw == pytest.approx({"cmpl-0": 0.018, "cmpl-1": 0.028, "cmpl-2": 0.038, "cmpl-3": 0.098})

    records = [_record(0, 100, 20), _record(1, 200, 30), _record(2, 300, 40), _record(3, 2000, 100),
               _record(4, 3000, 200), _record(9, 100, 50, status="error")]
    server = [BucketRow(bucket="0-512", requests=3, errors=None, ttft_p50_s=0.0285, ttft_p95_s=None,
                        ttft_p99_s=None, itl_p50_s=None, itl_p95_s=None, mean_cached_tokens=None)]
    rows = {r.bucket: r for r in hop_rows(records, gw, server, IslBuckets((512, 1024)))}
    assert list(rows) == ["0-512", "1025+"]  # no request in 513-1024: no row
    short = rows["0-512"]
    assert short.requests == 3 and short.client_p50_s == pytest.approx(0.030)
    assert short.gateway_p50_s == pytest.approx(0.028) and short.hop_p50_s == pytest.approx(0.002)
    assert short.histogram_p50_s == 0.0285
    long = rows["1025+"]  # cmpl-4 is not in the request log: no exact figure, no hop
    assert long.gateway_p50_s is None and long.hop_p50_s is None and long.histogram_p50_s is None

    out = io.StringIO()
    print_hop(list(rows.values()), Console(file=out, width=150))
    text = out.getvalue()
    assert "the client-gateway hop" in text and "+1.8 %" in text  # histogram 28.5 ms against exact 28 ms
    out = io.StringIO()
    print_hop([long], Console(file=out, width=150))
    assert out.getvalue() == ""  # nothing to say without the gateway's exact values
