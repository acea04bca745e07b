"""Per-bucket TTFT and ITL percentiles: the gateway's histograms and the client, each against the truth.

``servelens sim --truth-log`` (every token's emission time) and ``servelens gateway --request-log
--request-log-chunks`` (every output chunk's read time) run as their own processes; this process is
the client (the bench's own :func:`servelens.bench.client.send_request`, which records every chunk's
read time). All three clocks are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC, shared by the processes
of the machine) and the sim's ``x-request-id`` joins them. A synthetic ISL mix (default the issue's:
300 / 3,000 / 12,000 tokens, OSL 64, concurrency 8) runs through the gateway after a warm-up wave;
``/metrics`` is scraped before and after, so the server's histograms hold exactly the measured requests.

Per ISL bucket (the truth's ``isl``) and percentile (p50, p95, p99):

* truth: TTFT = the sim's arrival to its first token; ITL = gaps between its token times.
* server: ``histogram_quantile`` over the gateway's by-ISL histograms (the difference of the two
  scrapes), as Prometheus and the dashboards compute it; also the same per-token values binned with
  Dynamo's edges (the values the gateway observed, so that histogram is what it would have exported
  with ``--ttft-edges dynamo --itl-edges dynamo``), and the gateway's exact percentiles.
* client: exact percentiles (numpy's linear method, as the bench's table).

Per token: gateway ITL minus truth ITL and client ITL minus truth ITL (token k against token k), with
the ITL definition of ``servelens.core.timing`` (chunks read together share the gap since the previous
read) and, for contrast, the former one (the whole gap to the first chunk of a read, 0 to the others).

Usage: ``python benchmarks/quantile_accuracy.py [--speedup 1] [--concurrency 8] [--requests 300]
[--isl 300:1,3000:1,12000:1] [--osl 64] [--sim-args '--decode-base-s 0.002'] [--json out.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from servelens.bench.client import RequestSpec, build_body, send_request
from servelens.bench.prompts import PromptBuilder, SimTokenizer
from servelens.core.buckets import IslBuckets
from servelens.core.edges import ITL_EDGES_S, TTFT_EDGES_S
from servelens.core.histogram import HistogramState
from servelens.core.quantiles import histogram_quantile
from servelens.core.timing import NS_PER_S, itl_histogram
from servelens.formats.results import BenchRecord
from servelens.gateway.requestlog import read_request_log
from servelens.process import ServerProcess
from servelens.prometheus.names import MetricNames
from servelens.prometheus.parse import parse_exposition

QUANTILES = (50, 95, 99)
NAMES = MetricNames()
BUCKETS = IslBuckets.default()


@dataclass
class Joined:
    """One request seen by all three: per-token ITL values and TTFTs (seconds)."""

    bucket: str
    ttft_truth: float
    ttft_gateway: float
    ttft_client: float
    itl_truth: list[float]
    itl_gateway: list[float]
    itl_client: list[float]
    itl_gateway_old: list[float] = field(default_factory=list)
    itl_client_old: list[float] = field(default_factory=list)


def itl_values(times_ns: Sequence[int], tokens: Sequence[int], grouped: bool = True) -> list[float]:
    """Per-token ITL (s) of chunks read at ``times_ns`` holding ``tokens``; ``grouped=False`` gives the
    former definition (each chunk its own read: chunks read together 1 ns apart, i.e. gaps of ~0)."""
    times = list(times_ns)
    if not grouped:
        for i in range(1, len(times)):
            if times[i] <= times[i - 1]:
                times[i] = times[i - 1] + 1
    multi = {i: k for i, k in enumerate(tokens) if k > 1}
    _, values = itl_histogram(times, multi, tuple(float(e) for e in ITL_EDGES_S), keep_values=True)
    return list(values)


async def _client(url: str, specs: list[RequestSpec], concurrency: int, prefix: str) -> list[BenchRecord]:
    sem = asyncio.Semaphore(concurrency)

    async def one(spec: RequestSpec, s: aiohttp.ClientSession) -> BenchRecord:
        async with sem:
            return await send_request(s, url + "/v1/chat/completions", spec,
                                      headers={"x-request-id": f"{prefix}-{spec.index}"})

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        return list(await asyncio.gather(*(one(sp, s) for sp in specs)))


def _specs(n: int, isl_mix: list[tuple[int, float]], osl: int, seed: int, offset: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    builder = PromptBuilder(SimTokenizer())
    lengths, weights = zip(*isl_mix, strict=True)
    out = []
    for i in range(n):
        isl = rng.choices(lengths, weights)[0]
        prompt = builder.build(isl, key=("acc", seed, offset + i))  # unique text: no prefix-cache hits
        out.append(RequestSpec(i, 0, isl, osl, build_body("chat", "sim-model", prompt, osl)))
    return out


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        return parse_exposition(r.read().decode())


def _hist(after: dict[Any, float], before: dict[Any, float], name: str, bucket: str) -> list[tuple[float, float]]:
    """Cumulative ``(le, count)`` of one by-ISL histogram over the window (after - before)."""
    out = []
    for (sample, labels), v in after.items():
        d = dict(labels)
        if sample == name + "_bucket" and d.get("isl_bucket") == bucket:
            out.append((float(d["le"]), v - before.get((sample, labels), 0.0)))
    return sorted(out)


def _binned(values: Sequence[float], edges: Sequence[float], q: float) -> float:
    h = HistogramState(tuple(float(e) for e in edges))
    for v in values:
        h.observe(v)
    return histogram_quantile(q, h.cumulative())


def run(speedup: float, concurrency: int, requests: int, isl_mix: list[tuple[int, float]], osl: int,
        seed: int, sim_args: Sequence[str] = ()) -> dict[str, Any]:
    """Run once; returns the joined per-request data and the per-bucket server histograms."""
    with tempfile.TemporaryDirectory() as tmp:
        truth_path, log_path = Path(tmp) / "truth.jsonl", Path(tmp) / "requests.jsonl"
        sim_cmd = ["sim", "--truth-log", str(truth_path), "--speedup", str(speedup), "--seed", str(seed), *sim_args]
        with ServerProcess(sim_cmd) as sim, ServerProcess(
                ["gateway", "--upstream", sim.url, "--request-log", str(log_path), "--request-log-chunks"]) as gw:
            asyncio.run(_client(gw.url, _specs(concurrency, isl_mix, osl, seed, 10**6), concurrency, "warm"))
            before = _scrape(gw.url)
            t0 = time.perf_counter()
            records = asyncio.run(_client(gw.url, _specs(requests, isl_mix, osl, seed, 0), concurrency, "acc"))
            wall_s = time.perf_counter() - t0
            deadline = time.monotonic() + 30
            while len(read_request_log(log_path)) < requests + concurrency and time.monotonic() < deadline:
                time.sleep(0.05)  # the gateway logs a request as it ends, just after the client saw its end
            after = _scrape(gw.url)
        truth = {r["request_id"]: r for r in map(json.loads, truth_path.read_text().splitlines())}
        logged: dict[str, dict[str, Any]] = {str(e["upstream_request_id"]): e for e in read_request_log(log_path)}
    joined: list[Joined] = []
    for rec in records:
        rid = f"acc-{rec.index}"
        t, g = truth.get(rid), logged.get(rid)
        if not rec.ok or t is None or g is None or t["outcome"] != "ok" or g["status"] != "success":
            continue
        times = t["token_times_ns"]
        g_off, g_tok = g["chunk_offsets_ns"], g["chunk_tokens"]
        g_times = [int(g["arrival_ns"]) + o for o in g_off]
        c_times = [rec.send_ns + o for o in rec.chunk_offsets_ns]
        joined.append(Joined(
            bucket=BUCKETS.label(int(t["isl"])),
            ttft_truth=(t["first_token_ns"] - t["arrival_ns"]) / NS_PER_S,
            ttft_gateway=float(g["ttft_s"]),
            ttft_client=(rec.first_output_ns - rec.send_ns) / NS_PER_S if rec.first_output_ns else math.nan,
            itl_truth=[(b - a) / NS_PER_S for a, b in itertools.pairwise(times)],
            itl_gateway=itl_values(g_times, g_tok),
            itl_client=itl_values(c_times, rec.chunk_tokens),
            itl_gateway_old=itl_values(g_times, g_tok, grouped=False),
            itl_client_old=itl_values(c_times, rec.chunk_tokens, grouped=False),
        ))
    server = {b: {"ttft": _hist(after, before, NAMES.ttft_by_isl, b), "itl": _hist(after, before, NAMES.itl_by_isl, b)}
              for b in BUCKETS.labels}
    return {"joined": joined, "server": server, "wall_s": wall_s, "sent": len(records),
            "ok": sum(r.ok for r in records)}


def _err(got: float, want: float) -> float:
    return (got - want) / want * 100 if want else math.nan


def tables(result: dict[str, Any]) -> dict[str, Any]:
    """The figures: per bucket and percentile, and per-token errors (see the module docstring)."""
    joined: list[Joined] = result["joined"]
    out: dict[str, Any] = {"buckets": {}, "per_token": {}}
    used = [b for b in BUCKETS.labels if any(j.bucket == b for j in joined)]
    for b in used:
        js = [j for j in joined if j.bucket == b]
        row: dict[str, Any] = {"requests": len(js)}
        for kind in ("ttft", "itl"):
            if kind == "ttft":
                truth = [j.ttft_truth for j in js]
                gw = [j.ttft_gateway for j in js]
                cl = [j.ttft_client for j in js]
                dyn = TTFT_EDGES_S
            else:
                truth = [v for j in js for v in j.itl_truth]
                gw = [v for j in js for v in j.itl_gateway]
                cl = [v for j in js for v in j.itl_client]
                dyn = ITL_EDGES_S
            hist = result["server"][b][kind]
            row[kind] = {"n": len(truth)}
            for q in QUANTILES:
                tv = float(np.percentile(truth, q))
                cv = float(np.percentile(cl, q))
                sv = histogram_quantile(q / 100, hist)
                row[kind][f"p{q}"] = {
                    "truth": tv, "client": cv, "server": sv, "gateway_exact": float(np.percentile(gw, q)),
                    "server_dynamo_edges": _binned(gw, dyn, q / 100),
                    "server_vs_truth_pct": _err(sv, tv), "client_vs_truth_pct": _err(cv, tv),
                    "server_vs_client_pct": _err(sv, cv), "dynamo_vs_client_pct": _err(_binned(gw, dyn, q / 100), cv),
                }
        out["buckets"][b] = row
    for q in QUANTILES:  # ranking of the buckets by each figure, worst first
        for kind in ("ttft", "itl"):
            for who in ("truth", "client", "server", "server_dynamo_edges"):
                key = f"rank_{kind}_p{q}_{who}"
                out[key] = sorted(used, key=lambda b: -out["buckets"][b][kind][f"p{q}"][who])
    for b in [*used, "all"]:
        js = [j for j in joined if b in ("all", j.bucket)]
        d: dict[str, Any] = {}
        for who in ("gateway", "client", "gateway_old", "client_old"):
            errs: list[float] = []
            zeros = n = 0
            for j in js:
                vals = getattr(j, f"itl_{who}")
                if len(vals) != len(j.itl_truth):
                    continue  # a token count that differs: not comparable token by token
                errs.extend((v - t) * 1e3 for v, t in zip(vals, j.itl_truth, strict=True))
                zeros += sum(v < 1e-6 for v in vals)  # the former definition puts 1 ns there
                n += len(vals)
            a = np.abs(np.asarray(errs)) if errs else np.zeros(1)
            d[who] = {"tokens": n, "zeros": zeros, "abs_err_ms_p50": float(np.percentile(a, 50)),
                      "abs_err_ms_p90": float(np.percentile(a, 90)), "abs_err_ms_p99": float(np.percentile(a, 99)),
                      "mean_err_ms": float(np.mean(errs)) if errs else math.nan}
        ttft_g = [(j.ttft_gateway - j.ttft_truth) * 1e3 for j in js]
        ttft_c = [(j.ttft_client - j.ttft_truth) * 1e3 for j in js]
        d["ttft_gateway_minus_truth_ms"] = [float(np.percentile(ttft_g, q)) for q in (50, 90, 99)]
        d["ttft_client_minus_truth_ms"] = [float(np.percentile(ttft_c, q)) for q in (50, 90, 99)]
        out["per_token"][b] = d
    return out


def _fmt(v: float) -> str:
    return f"{v * 1e3:.2f}" if v < 1 else f"{v * 1e3:.0f}"


def print_tables(t: dict[str, Any]) -> None:
    for kind in ("ttft", "itl"):
        print(f"\n{kind.upper()} (ms; errors in %): truth | server (fine edges) | client | server-truth | "
              "client-truth | server-client | Dynamo's edges-client")
        print("| bucket | requests | q | truth | server | client | server vs truth | client vs truth "
              "| server vs client | Dynamo edges vs client |")
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for b, row in t["buckets"].items():
            for q in QUANTILES:
                c = row[kind][f"p{q}"]
                print(f"| {b} | {row['requests']} | p{q} | {_fmt(c['truth'])} | {_fmt(c['server'])} | "
                      f"{_fmt(c['client'])} | {c['server_vs_truth_pct']:+.1f} | {c['client_vs_truth_pct']:+.1f} | "
                      f"{c['server_vs_client_pct']:+.1f} | {c['dynamo_vs_client_pct']:+.1f} |")
    print("\nranking of the buckets, worst first (truth / client / server / server with Dynamo's edges):")
    for kind in ("ttft", "itl"):
        for q in QUANTILES:
            r = [t[f"rank_{kind}_p{q}_{w}"] for w in ("truth", "client", "server", "server_dynamo_edges")]
            same = "same" if r[1] == r[2] else "DIFFERENT"
            print(f"  {kind} p{q}: client {' > '.join(r[1])}; server {same}; Dynamo's edges "
                  f"{'same' if r[1] == r[3] else 'different'}; truth {'same' if r[0] == r[1] else 'different'}")
    print("\nper token, |measured ITL - truth ITL| in ms (p50 / p90 / p99), mean signed error, zeros:")
    print("| bucket | who | tokens | p50 | p90 | p99 | mean | under 1 us |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for b, d in t["per_token"].items():
        for who in ("gateway", "client", "gateway_old", "client_old"):
            e = d[who]
            print(f"| {b} | {who} | {e['tokens']} | {e['abs_err_ms_p50']:.3f} | {e['abs_err_ms_p90']:.3f} | "
                  f"{e['abs_err_ms_p99']:.3f} | {e['mean_err_ms']:+.3f} | {e['zeros']} |")
    print("\nTTFT minus truth, ms (p50 / p90 / p99):")
    for b, d in t["per_token"].items():
        g, c = d["ttft_gateway_minus_truth_ms"], d["ttft_client_minus_truth_ms"]
        print(f"  {b:11s} gateway {g[0]:7.2f} {g[1]:7.2f} {g[2]:7.2f}   client {c[0]:7.2f} {c[1]:7.2f} {c[2]:7.2f}")


def _mix(spec: str) -> list[tuple[int, float]]:
    out = []
    for part in spec.split(","):
        isl, _, w = part.partition(":")
        out.append((int(isl), float(w or 1)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speedup", type=float, default=1.0, help="the sim's speedup (default 1: real H100 timing)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--isl", default="300:1,3000:1,12000:1", help="ISL mix TOKENS:WEIGHT,... (default the issue's)")
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sim-args", default="", help="more `servelens sim` flags, e.g. '--decode-base-s 0.002'")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    result = run(args.speedup, args.concurrency, args.requests, _mix(args.isl), args.osl, args.seed,
                 args.sim_args.split())
    t = tables(result)
    print(f"{result['sent']} requests ({result['ok']} ok, {len(result['joined'])} joined) in {result['wall_s']:.1f} s, "
          f"concurrency {args.concurrency}, sim speedup {args.speedup:g}, ISL {args.isl}, OSL {args.osl}")
    print_tables(t)
    if args.json:
        Path(args.json).write_text(json.dumps(t, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
