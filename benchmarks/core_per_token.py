"""Per-token cost of the request-local ITL path vs prometheus_client observe (issue 2).

Run: python benchmarks/core_per_token.py [--requests 2000] [--repeats 5] [--seed 1]

Requests with output lengths drawn from a lognormal around the Mooncake conversation trace's
OSL (median ~350 tokens, clipped to 1..2000), one token per chunk, ~10 ms gaps. Four ways to
record one ITL observation per token, timed side by side (interleaved) in one process:

  local      RequestTimer.output(t) per chunk + finish() per request (request-local histogram
             built once; the cost of finish is included, amortised over the request's tokens)
  local-raw  timer.times_ns.append(t) per chunk (bound once) + finish(): the bare timer
  live       the gateway's path end to end: FrontendMetrics.begin, set_isl, LiveRequest.output for
             the first chunk (observes TTFT), then live.chunk_times_ns.append bound once (what
             gateway.meter.StreamMeter does), and LiveRequest.finish (builds the request-local
             histogram and merges it into the stock and by-ISL families under the lock)
  labels     Histogram.labels(model, isl_bucket).observe(v): a label lookup per token
  child      a bound child's .observe(v): the cheapest prometheus_client path

Prints ns/token (best of --repeats) and the ratios against a bound child's observe.
"""

from __future__ import annotations

import argparse
import itertools
import random
import time

from prometheus_client import CollectorRegistry, Histogram

from servelens.core.edges import ITL_EDGES_S
from servelens.core.timing import RequestTimer
from servelens.prometheus import FrontendMetrics

EDGES = tuple(float(e) for e in ITL_EDGES_S)


def workload(n_requests: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n_requests):
        osl = min(2000, max(1, int(rng.lognormvariate(5.86, 0.6))))
        t, stamps = 0, []
        for _ in range(osl):
            t += int(rng.lognormvariate(-4.6, 0.5) * 1e9)
            stamps.append(t)
        out.append(stamps)
    return out


def bench_local(reqs: list[list[int]]) -> float:
    start = time.perf_counter_ns()
    for stamps in reqs:
        t = RequestTimer(0, EDGES)
        output = t.output
        for s in stamps:
            output(s)
        t.finish(stamps[-1], "success")
    return time.perf_counter_ns() - start


def bench_local_raw(reqs: list[list[int]]) -> float:
    start = time.perf_counter_ns()
    for stamps in reqs:
        t = RequestTimer(0, EDGES)
        append = t.times_ns.append
        for s in stamps:
            append(s)
        t.finish(stamps[-1], "success")
    return time.perf_counter_ns() - start


def bench_live(reqs: list[list[int]]) -> float:
    metrics = FrontendMetrics(isl_buckets="512,1024,2048,4096,8192,16384")
    metrics.register_model("m")
    begin = metrics.begin
    start = time.perf_counter_ns()
    for stamps in reqs:
        live = begin("m", "completions", "stream", 0)
        live.set_isl(700, "first_chunk_usage")
        live.output(stamps[0])
        append = live.chunk_times_ns.append
        for s in stamps[1:]:
            append(s)
        live.finish(stamps[-1], "success", osl=len(stamps), cached_tokens=0)
    return time.perf_counter_ns() - start


def _gaps(reqs: list[list[int]]) -> list[list[float]]:
    return [[(b - a) / 1e9 for a, b in itertools.pairwise(s)] for s in reqs]


def bench_labels(gaps: list[list[float]]) -> float:
    h = Histogram("itl_by_isl_seconds", "x", ["model", "isl_bucket"], buckets=EDGES, registry=CollectorRegistry())
    start = time.perf_counter_ns()
    for g in gaps:
        for v in g:
            h.labels("m", "513-1024").observe(v)
    return time.perf_counter_ns() - start


def bench_child(gaps: list[list[float]]) -> float:
    h = Histogram("itl_by_isl_seconds", "x", ["model", "isl_bucket"], buckets=EDGES, registry=CollectorRegistry())
    observe = h.labels("m", "513-1024").observe
    start = time.perf_counter_ns()
    for g in gaps:
        for v in g:
            observe(v)
    return time.perf_counter_ns() - start


def main() -> None:
    ap = argparse.ArgumentParser(description="Per-token cost: request-local ITL path vs prometheus_client")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    reqs = workload(args.requests, args.seed)
    gaps = _gaps(reqs)
    tokens = sum(len(s) for s in reqs)
    itl_obs = sum(len(g) for g in gaps)
    best = dict.fromkeys(("local", "local-raw", "live", "labels", "child"), float("inf"))
    for _ in range(args.repeats):  # interleaved, so machine noise hits all of them alike
        best["local"] = min(best["local"], bench_local(reqs) / tokens)
        best["local-raw"] = min(best["local-raw"], bench_local_raw(reqs) / tokens)
        best["live"] = min(best["live"], bench_live(reqs) / tokens)
        best["labels"] = min(best["labels"], bench_labels(gaps) / itl_obs)
        best["child"] = min(best["child"], bench_child(gaps) / itl_obs)
    print(f"{args.requests} requests, {tokens} tokens (mean OSL {tokens / args.requests:.0f})")
    for k, v in best.items():
        print(f"{k:10s} {v:8.1f} ns/token")
    print(f"child/local     = {best['child'] / best['local']:.1f}x (target >= 7x)")
    print(f"child/local-raw = {best['child'] / best['local-raw']:.1f}x")
    print(f"child/live      = {best['child'] / best['live']:.1f}x (the gateway's whole path, target >= 7x)")
    print(f"labels/local    = {best['labels'] / best['local']:.1f}x")


if __name__ == "__main__":
    main()
