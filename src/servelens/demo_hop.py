"""Which part of the gap between the client's and the gateway's TTFT is the hop between them.

The client's TTFT starts before its request is written and ends after its first chunk is parsed;
the gateway's starts when it has the request and ends when it has read the engine's first chunk.
The difference (the hop: loopback, both event loops, the client's own parsing) is not the
histogram's error and no ``le`` edges close it. The gateway's request log holds its own exact TTFT
per request, so after each phase the demo prints, per bucket, the client's exact p50, the gateway's
exact p50 and the gateway's histogram p50 (``histogram_quantile`` over its ``/metrics``): the first
gap is the hop, the second the edges'.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from servelens.core.buckets import IslBuckets
from servelens.core.summary import BucketRow
from servelens.formats.results import BenchRecord
from servelens.gateway.requestlog import read_request_log


def gateway_ttft_by_id(paths: Iterable[Path]) -> dict[str, float]:
    """The gateway's exact TTFT (s) per engine response id (``upstream_request_id``) of every
    successful request in the request logs ``paths`` (missing files are skipped)."""
    out: dict[str, float] = {}
    for path in paths:
        if not path.exists():
            continue
        for e in read_request_log(path):
            rid, ttft = e.get("upstream_request_id"), e.get("ttft_s")
            if e.get("status") == "success" and isinstance(ttft, float | int) and rid:
                out[str(rid)] = float(ttft)
    return out


@dataclass(frozen=True)
class HopRow:
    """One bucket's TTFT p50 three ways (s): the client's exact, the gateway's exact (its request
    log; None when some request of the bucket is not in it) and the gateway's histogram (None
    without server rows); and the hop: the median over the bucket's requests of the client's TTFT
    minus the gateway's (None with the gateway's exact p50)."""

    bucket: str
    requests: int
    client_p50_s: float
    gateway_p50_s: float | None
    histogram_p50_s: float | None
    hop_p50_s: float | None


def hop_rows(records: Sequence[BenchRecord], gateway_ttft: dict[str, float], server_rows: Sequence[BucketRow] | None,
             buckets: IslBuckets) -> list[HopRow]:
    """Per bucket with successful requests: :class:`HopRow` (numpy's linear percentiles, as the
    client's table)."""
    server = {r.bucket: r.ttft_p50_s for r in server_rows or ()}
    out = []
    for label in buckets.labels:
        rs = [r for r in records if r.ok and r.ttft_s is not None and buckets.label(r.isl) == label]
        if not rs:
            continue
        client = [r.ttft_s for r in rs if r.ttft_s is not None]
        gw = [gateway_ttft[r.request_id] for r in rs if r.request_id in gateway_ttft]
        whole = len(gw) == len(rs)
        out.append(HopRow(label, len(rs), float(np.percentile(client, 50)),
                          float(np.percentile(gw, 50)) if whole else None, server.get(label),
                          float(np.median(np.subtract(client, gw))) if whole else None))
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _pct(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{(a / b - 1) * 100:+.1f} %"


def print_hop(rows: Sequence[HopRow], console: Console) -> None:
    """The table: per bucket the three p50s (ms), the hop (the median of client minus gateway per
    request, ms) and the histogram against the gateway's exact value (%); nothing without the
    gateway's exact values."""
    if not any(r.gateway_p50_s is not None for r in rows):
        return
    t = Table(title="TTFT p50: the client-gateway hop, and the histogram against the gateway's exact values",
              caption="hop: the client's clock starts before its request is written and stops after its first chunk "
                      "is parsed; no histogram edges close it. gateway exact: its request log", title_style="bold")
    for name in ("Input length", "Requests", "client (ms)", "gateway exact (ms)", "hop (ms)", "histogram (ms)",
                 "histogram vs gateway exact"):
        t.add_column(name, justify="left" if name == "Input length" else "right")
    for r in rows:
        t.add_row(r.bucket, str(r.requests), _ms(r.client_p50_s), _ms(r.gateway_p50_s), _ms(r.hop_p50_s),
                  _ms(r.histogram_p50_s), _pct(r.histogram_p50_s, r.gateway_p50_s))
    console.print(t)
