#!/usr/bin/env python3
"""Bench client capacity and accuracy (issue 5): requests/s and chunks/s one ``servelens bench``
process sustains on one core against the sim, and its TTFT error vs the sim's truth at 100 and
1,000 concurrent streams; optionally aiperf on the same workload in the same run.

Layout: the sim runs as a child process pinned to CPU 1 with ``--truth-log``; each load generator
runs as a child process pinned to CPU 0. Both read ``CLOCK_MONOTONIC`` (``time.perf_counter_ns`` on
Linux), so the truth log and the clients' records compare directly; requests are joined by
``x-request-id`` (the sim echoes a client-sent id, and the bench records the id the sim returns).

TTFT error per request = client TTFT - truth TTFT, where truth TTFT is the sim's
``first_token_ns - arrival_ns`` (handler received the request -> engine step that emitted the first
token ended). The error therefore includes the HTTP round trip and both processes' scheduling delay.

CPU per chunk = the load generator's CPU seconds / output chunks received (the sim sends one token per
chunk); ``1 / cpu_per_chunk`` is the chunk rate it could sustain with one full core. For servelens the
CPU is the bench process's own during the run (``summary.json`` ``client_cpu_s``); for aiperf it is all
its processes from start to exit (it has no in-run figure), so its startup is included.

Run:  python benchmarks/bench_client.py [--aiperf PATH/TO/venv/bin/aiperf]
      [--concurrency 100,1000] [--requests-per-stream 4] [--isl 200] [--osl 64] [--speedup 10]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servelens.core.quantiles import percentile
from servelens.formats.results import load_results
from servelens.process import ServerProcess


def cpu_children_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def load_truth(path: Path, want: set[str], timeout_s: float = 30.0) -> dict[str, dict]:
    """Truth records by request id; waits (bounded) until every wanted id is in the file."""
    deadline = time.monotonic() + timeout_s
    while True:
        out: dict[str, dict] = {}
        if path.exists():
            with open(path) as f:
                for line in f:
                    if line.strip():
                        rec = json.loads(line)
                        out[rec["request_id"]] = rec
        if want <= out.keys() or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def stats_ms(xs: list[float]) -> dict[str, float]:
    return {"p50": percentile(xs, 50), "p99": percentile(xs, 99), "max": max(xs), "min": min(xs)} if xs else {}


def run_servelens(url: str, conc: int, n: int, isl: int, osl: int, out: Path, truth_path: Path) -> dict:
    cmd = ["taskset", "-c", "0", sys.executable, "-m", "servelens", "bench", "--url", url,
           "--concurrency", str(conc), "--num-requests", str(n), "--isl", str(isl), "--osl", str(osl),
           "--output-dir", str(out), "--no-progress", "--max-loop-lag-ms", "10"]
    c0 = cpu_children_s()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    cpu = cpu_children_s() - c0
    if proc.returncode != 0:
        raise SystemExit(f"servelens bench failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    records = load_results(out / "results.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    truth = load_truth(truth_path, {r.request_id for r in records if r.request_id})
    errs, pre, post = [], [], []
    for r in records:
        t = truth.get(r.request_id or "")
        if r.ok and t and t.get("first_token_ns") is not None and r.first_output_ns is not None:
            errs.append((r.first_output_ns - r.send_ns - (t["first_token_ns"] - t["arrival_ns"])) / 1e6)
            pre.append((t["arrival_ns"] - r.send_ns) / 1e6)  # client send -> sim handler
            post.append((r.first_output_ns - t["first_token_ns"]) / 1e6)  # engine step end -> client stamp
    chunks = sum(len(r.chunk_offsets_ns) for r in records)
    return {
        "tool": "servelens bench", "concurrency": conc, "requests": len(records),
        "errors": sum(1 for r in records if not r.ok), "joined": len(errs),
        "elapsed_s": summary["elapsed_s"], "wall_s": wall, "req_per_s": summary["requests_per_s"],
        "chunks_per_s": summary["chunks_per_s"], "chunks": chunks, "cpu_s": cpu,
        "cpu_us_per_chunk": summary["client_cpu_us_per_chunk"], "process_cpu_s_with_startup": cpu,
        "ttft_err_ms": stats_ms(errs), "send_to_sim_arrival_ms": stats_ms(pre),
        "sim_token_to_client_ms": stats_ms(post),
        "ttft_client_ms": stats_ms([r.ttft_s * 1e3 for r in records if r.ttft_s]),
        "loop_lag_p99_ms": summary["event_loop_lag"]["p99_ms"],
        "trustworthy": summary["event_loop_lag"]["trustworthy"],
    }


def make_hf_cache(root: Path) -> str:
    """A Hugging Face cache under ``root`` holding the sim's tokenizer as ``local/sim-words``
    (:mod:`servelens.sim.hf_tokenizer`), so aiperf can load a tokenizer with ``HF_HUB_OFFLINE=1``."""
    from servelens.sim.hf_tokenizer import write_hf_cache

    return write_hf_cache(root)


def run_aiperf(aiperf: str, tokenizer: str, hf_home: Path, url: str, model: str, conc: int, n: int, isl: int,
               osl: int, out: Path, truth_path: Path) -> dict:
    cmd = ["taskset", "-c", "0", aiperf, "profile", "--model", model, "--url", url, "--endpoint-type", "chat",
           "--streaming", "--tokenizer", tokenizer, "--concurrency", str(conc), "--request-count", str(n),
           "--prompt-input-tokens-mean", str(isl), "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(osl), "--prompt-output-tokens-stddev", "0",
           "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{osl}",
           "--output-artifact-dir", str(out), "--ui-type", "none"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(hf_home))
    c0 = cpu_children_s()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    wall = time.perf_counter() - t0
    cpu = cpu_children_s() - c0
    if proc.returncode != 0:
        return {"tool": "aiperf", "concurrency": conc, "failed": proc.stdout[-1500:] + proc.stderr[-1500:]}
    with open(out / "profile_export.jsonl") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    recs = [r for r in recs if r["metadata"].get("benchmark_phase") == "profiling"]
    truth = load_truth(truth_path, {r["metadata"]["x_request_id"] for r in recs})
    errs = []
    chunks = 0
    for r in recs:
        t = truth.get(r["metadata"]["x_request_id"])
        m = r["metrics"]
        # aiperf's http_req_chunks_received counts socket reads, not SSE events; the sim sends one token
        # per event, so completion tokens count the events
        chunks += int(m.get("usage_completion_tokens", m.get("output_sequence_length", {})).get("value", 0))
        if t and t.get("first_token_ns") is not None and "time_to_first_token" in m:
            errs.append(m["time_to_first_token"]["value"] - (t["first_token_ns"] - t["arrival_ns"]) / 1e6)
    starts = [r["metadata"]["request_start_ns"] for r in recs]
    ends = [r["metadata"]["request_end_ns"] for r in recs]
    elapsed = (max(ends) - min(starts)) / 1e9 if recs else 0.0
    return {
        "tool": "aiperf", "concurrency": conc, "requests": len(recs), "joined": len(errs),
        "elapsed_s": elapsed, "wall_s": wall, "req_per_s": len(recs) / elapsed if elapsed else None,
        "chunks_per_s": chunks / elapsed if elapsed else None, "chunks": chunks, "cpu_s": cpu,
        "cpu_us_per_chunk": cpu / chunks * 1e6 if chunks else None, "ttft_err_ms": stats_ms(errs),
    }


def _pair(d: dict[str, float] | None) -> str:
    return f"{d['p50']:.2f} / {d['p99']:.2f} ms" if d else "n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="100,1000")
    ap.add_argument("--requests-per-stream", type=int, default=4)
    ap.add_argument("--isl", type=int, default=200)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--speedup", type=float, default=10.0)
    ap.add_argument("--aiperf", help="path of an aiperf executable (its own venv)")
    ap.add_argument("--json", help="write the results here as JSON")
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs 2 CPUs (sim on CPU 1, load generator on CPU 0)")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        hf_home = tmpd / "hf"
        aiperf_tok = make_hf_cache(hf_home) if args.aiperf else ""
        for conc in [int(c) for c in args.concurrency.split(",")]:
            truth = tmpd / f"truth-{conc}.jsonl"
            os.sched_setaffinity(0, {1})  # the sim child inherits CPU 1
            sim = ServerProcess(["sim", "--speedup", str(args.speedup), "--truth-log", str(truth),
                                 "--max-num-seqs", str(max(256, conc)), "--max-num-batched-tokens", "1000000",
                                 "--kv-capacity-tokens", "100000000"], log_path=tmpd / f"sim-{conc}.log").start()
            os.sched_setaffinity(0, {0, 1})
            try:
                n = conc * args.requests_per_stream
                results.append(run_servelens(sim.url, conc, n, args.isl, args.osl, tmpd / f"sl-{conc}", truth))
                print(json.dumps(results[-1]), flush=True)
                if args.aiperf:
                    results.append(run_aiperf(args.aiperf, aiperf_tok, hf_home, sim.url, "sim-model", conc, n,
                                              args.isl, args.osl, tmpd / f"ap-{conc}", truth))
                    print(json.dumps(results[-1]), flush=True)
            finally:
                sim.stop()
    print()
    print("| tool | streams | requests | req/s | chunks/s | CPU µs/chunk | chunks/s per core | TTFT err p50 | "
          "TTFT err p99 | of which send->sim p50/p99 | of which sim->client p50/p99 | loop lag p99 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if "failed" in r:
            print(f"| {r['tool']} | {r['concurrency']} | failed | | | | | | | | | |")
            continue
        e = r["ttft_err_ms"]
        cpc = r["cpu_us_per_chunk"]
        print(f"| {r['tool']} | {r['concurrency']} | {r['requests']} | {r['req_per_s']:.0f} | "
              f"{r['chunks_per_s']:.0f} | {cpc:.1f} | {1e6 / cpc:,.0f} | {e.get('p50', float('nan')):.2f} ms | "
              f"{e.get('p99', float('nan')):.2f} ms | "
              f"{_pair(r.get('send_to_sim_arrival_ms'))} | {_pair(r.get('sim_token_to_client_ms'))} | "
              f"{r.get('loop_lag_p99_ms', float('nan')):.1f} ms |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
