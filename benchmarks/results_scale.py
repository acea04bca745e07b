"""``servelens report --results`` at the size of a day's traffic: results.jsonl against results.cols.

Generates (seeded, numpy, bounded time) bench results of N requests with Mooncake-like prompt and
output lengths (drawn from the packaged trace cut ``mooncake_conversation_400.jsonl``), one token per
chunk as a streaming engine sends them, every chunk's arrival time kept: the columns folder
(``results.cols``, :mod:`servelens.formats.columnar`) for every N, and the JSONL too for N up to
``--jsonl-up-to`` (the old path at a million requests needs ~18 GB). Then, side by side in one run,
times ``servelens report --results PATH --format csv`` as a subprocess on each: wall time and peak
RSS (``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a wrapper process whose only child is the
report), checks that the two tables are identical where both exist, and times the converter
(``--convert``) on the largest JSONL. The old path's time and memory at the sizes without a JSONL
are extrapolated linearly from the two largest measured sizes (marked so). Files are deleted after.

With ``--explain-up-to N`` it also times ``servelens explain --results RUN RUN`` (both windows the
same run, default flags) on the columns and, where there is one, on the JSONL, and checks that the
two outputs are the same.

Usage: ``python benchmarks/results_scale.py [--requests 20000,100000,1000000] [--jsonl-up-to 100000]
[--explain-up-to 100000] [--dir /work/tmp] [--keep] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from servelens.bench.traces import packaged_trace, read_trace
from servelens.formats.columnar import BOOL_FIELDS, INT_FIELDS, NULL, size_bytes
from servelens.formats.columnar_write import ColumnarWriter
from servelens.formats.results import BenchRecord, encode_record

BATCH = 50_000
MEASURE = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
           "p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE); "
           "w = time.perf_counter() - t; u = resource.getrusage(resource.RUSAGE_CHILDREN); "
           "sys.stderr.buffer.write(p.stderr); sys.stdout.buffer.write(p.stdout); "
           "print(f'@@ {w} {u.ru_maxrss} {p.returncode} {u.ru_utime + u.ru_stime}', file=sys.stderr)")


def generate(n: int, cols: Path, jsonl: Path | None, seed: int = 20) -> None:
    """Write ``n`` synthetic requests as columns (and as JSONL when ``jsonl``), in batches."""
    rows = read_trace(packaged_trace())
    isl_pool = np.array([r.isl_tokens for r in rows], dtype=np.int64)
    osl_pool = np.maximum(np.array([r.osl_tokens for r in rows], dtype=np.int64), 1)
    rng = np.random.default_rng(seed)
    out = open(jsonl, "wb") if jsonl is not None else None  # noqa: SIM115 (closed in finally)
    try:
        with ColumnarWriter(cols) as w:
            for a in range(0, n, BATCH):
                b = min(n, a + BATCH)
                k = b - a
                pick = rng.integers(0, isl_pool.size, k)
                isl, osl = isl_pool[pick], osl_pool[pick]
                ok = rng.random(k) > 0.01
                counts = np.where(ok, osl, 0)
                send = (np.arange(a, b, dtype=np.int64) * 50_000_000) + 1_000_000_000
                ttft = ((0.05 + isl * 2e-5) * rng.lognormal(0.0, 0.3, k) * 1e9).astype(np.int64) + 1
                total = int(counts.sum())
                gaps = np.maximum((rng.lognormal(np.log(0.025), 0.35, total) * 1e9).astype(np.int64), 1)
                starts = np.cumsum(counts) - counts
                has = counts > 0
                gaps[starts[has]] = ttft[has]
                cs = np.cumsum(gaps)
                offsets = cs - np.repeat(cs[starts[has]] - ttft[has], counts[has])
                last = np.where(has, offsets[np.maximum(starts + counts - 1, 0)] if total else 0, 0)
                cached = (isl * rng.random(k) * 0.6).astype(np.int64)
                fields = {
                    "index": np.arange(a, b, dtype=np.int64), "scheduled_ns": send - 1_000_000_000,
                    "send_ns": send, "wall_send_ns": send + 1_764_000_000_000_000_000,
                    "first_output_ns": np.where(has, send + ttft, NULL), "end_ns": send + last + 1_000_000,
                    "isl_target": isl, "isl_server": isl, "osl_target": osl,
                    "osl": np.where(ok, osl, NULL), "cached_tokens": np.where(ok, cached, NULL),
                    "http_status": np.where(ok, 200, 503), "ok": ok, "tokens_from_usage": np.ones(k, dtype=bool),
                }
                tokens = np.ones(total, dtype=np.int64)
                w.add_arrays(fields, counts, offsets, tokens)
                if out is not None:
                    ints = {f: fields[f].tolist() for f in INT_FIELDS}
                    okl = ok.tolist()
                    for i in range(k):
                        s, c = int(starts[i]), int(counts[i])
                        vals = {f: (None if ints[f][i] == NULL else ints[f][i]) for f in INT_FIELDS}
                        out.write(encode_record(BenchRecord(
                            request_id=None, chunk_offsets_ns=tuple(offsets[s:s + c].tolist()),
                            chunk_tokens=(1,) * c, tokens_from_usage=True,
                            status="success" if okl[i] else "error", **vals,  # type: ignore[arg-type]
                        )))
    finally:
        if out is not None:
            out.close()
    assert set(fields) == set(INT_FIELDS + BOOL_FIELDS)


def measure(args: list[str]) -> tuple[float, float, bytes, float]:
    """Wall time (s), peak RSS (MiB), stdout and CPU time (user + system, s) of one ``servelens``
    subprocess (the CPU time is the figure a loaded machine moves least)."""
    cmd = [sys.executable, "-c", MEASURE, sys.executable, "-m", "servelens", *args]
    p = subprocess.run(cmd, capture_output=True, check=False)
    tail = p.stderr.decode().strip().splitlines()
    wall, rss, rc, cpu = tail[-1].split()[1:]
    if int(rc) != 0:
        raise SystemExit(f"servelens {' '.join(args)} failed: {' '.join(tail[-3:-1])}")
    return float(wall), int(rss) / 1024, p.stdout, float(cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", default="20000,100000,1000000")
    ap.add_argument("--jsonl-up-to", type=int, default=100_000)
    ap.add_argument("--explain-up-to", type=int, default=100_000,
                    help="also time servelens explain (both windows this run) up to this many requests")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    sizes = sorted(int(x) for x in a.requests.split(","))
    root = Path(tempfile.mkdtemp(prefix="results_scale_", dir=a.dir))
    results: list[dict[str, Any]] = []
    try:
        for n in sizes:
            run = root / f"n{n}"
            run.mkdir()
            jsonl = run / "results.jsonl" if n <= a.jsonl_up_to else None
            t = time.perf_counter()
            generate(n, run / "results.cols", jsonl)
            gen_s = time.perf_counter() - t
            load = os.getloadavg()[0]
            new = measure(["report", "--results", str(run / "results.cols"), "--format", "csv"])
            row: dict[str, Any] = {"requests": n, "generate_s": gen_s, "load1": load,
                                   "cols_bytes": size_bytes(run / "results.cols"),
                                   "new_wall_s": new[0], "new_rss_mib": new[1], "new_cpu_s": new[3]}
            if n <= a.explain_up_to:  # both windows the same run: the cost of reading two, verdict "none"
                cols = str(run / "results.cols")
                ex = measure(["explain", "--results", cols, cols])
                row |= {"explain_wall_s": ex[0], "explain_rss_mib": ex[1], "explain_cpu_s": ex[3]}
                if jsonl is not None:
                    ex_old = measure(["explain", "--results", str(jsonl), str(jsonl)])
                    row |= {"explain_old_wall_s": ex_old[0], "explain_old_rss_mib": ex_old[1],
                            "explain_old_cpu_s": ex_old[3],
                            "explain_same": ex_old[2] == ex[2].replace(cols.encode(), str(jsonl).encode())}
            if jsonl is not None:
                old = measure(["report", "--results", str(jsonl), "--format", "csv"])
                row |= {"jsonl_bytes": jsonl.stat().st_size, "old_wall_s": old[0], "old_rss_mib": old[1],
                        "old_cpu_s": old[3],
                        "same_table": old[2] == new[2], "load1_after": os.getloadavg()[0]}
                if n == max(s for s in sizes if s <= a.jsonl_up_to):
                    shutil.rmtree(run / "results.cols")
                    conv = measure(["report", "--results", str(jsonl), "--convert"])
                    cached = measure(["report", "--results", str(jsonl), "--format", "csv"])
                    row |= {"convert_wall_s": conv[0], "convert_rss_mib": conv[1], "convert_cpu_s": conv[3],
                            "after_convert_wall_s": cached[0], "after_convert_same": cached[2] == new[2]}
                jsonl.unlink()
            shutil.rmtree(run)
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    measured = [r for r in results if "old_wall_s" in r]
    if len(measured) >= 2:  # linear in requests, from the two largest measured sizes
        r0, r1 = measured[-2], measured[-1]
        for r in results:
            if "old_wall_s" not in r:
                for key in ("old_wall_s", "old_rss_mib", "old_cpu_s", "jsonl_bytes"):
                    slope = (r1[key] - r0[key]) / (r1["requests"] - r0["requests"])
                    r[key + "_extrapolated"] = r1[key] + slope * (r["requests"] - r1["requests"])
    print("| requests | load 1 min | JSONL | columns | JSONL path: wall, CPU, peak RSS | columns: wall, CPU, peak RSS "
          "| ratio CPU, RSS | same table |\n|---|---|---|---|---|---|---|---|")
    for r in results:
        ext = "old_wall_s" not in r
        if ext and "old_wall_s_extrapolated" not in r:  # one JSONL size: nothing to extrapolate from
            print(f"| {r['requests']:,} | {r['load1']:.2f} | not run | {r['cols_bytes'] / 1e9:.2f} GB | not run "
                  f"| {r['new_wall_s']:.2f} s, {r['new_cpu_s']:.2f} s, {r['new_rss_mib']:,.0f} MiB | n/a | n/a |")
            continue
        sfx = "_extrapolated" if ext else ""
        ow, orss, ob = r["old_wall_s" + sfx], r["old_rss_mib" + sfx], r["jsonl_bytes" + sfx]
        ocpu = r["old_cpu_s" + sfx]
        mark = " (extrapolated)" if ext else ""
        print(f"| {r['requests']:,} | {r['load1']:.2f} | {ob / 1e9:.2f} GB{mark} | {r['cols_bytes'] / 1e9:.2f} GB "
              f"| {ow:.1f} s, {ocpu:.1f} s, {orss:,.0f} MiB{mark} | {r['new_wall_s']:.2f} s, {r['new_cpu_s']:.2f} s, "
              f"{r['new_rss_mib']:,.0f} MiB | {ocpu / r['new_cpu_s']:.0f}x, {orss / r['new_rss_mib']:.0f}x "
              f"| {r.get('same_table', 'n/a (no JSONL)')} |")
    print("\n| requests | explain, JSONL path: wall, CPU, peak RSS | explain, columns: wall, CPU, peak RSS "
          "| ratio CPU | same output |\n|---|---|---|---|---|")
    for r in results:
        if "explain_wall_s" in r:
            old_ex = (f"{r['explain_old_wall_s']:.1f} s, {r['explain_old_cpu_s']:.1f} s, "
                      f"{r['explain_old_rss_mib']:,.0f} MiB" if "explain_old_wall_s" in r else "not run")
            ratio = f"{r['explain_old_cpu_s'] / r['explain_cpu_s']:.1f}x" if "explain_old_cpu_s" in r else "n/a"
            print(f"| {r['requests']:,} | {old_ex} | {r['explain_wall_s']:.1f} s, {r['explain_cpu_s']:.1f} s, "
                  f"{r['explain_rss_mib']:,.0f} MiB | {ratio} | {r.get('explain_same', 'n/a (no JSONL)')} |")
    for r in results:
        if "convert_wall_s" in r:
            print(f"\n--convert of {r['requests']:,} requests: {r['convert_wall_s']:.1f} s "
                  f"({r['convert_cpu_s']:.1f} s CPU), "
                  f"{r['convert_rss_mib']:,.0f} MiB peak; the report of that JSONL afterwards (reads the "
                  f"columns): {r['after_convert_wall_s']:.2f} s, same table: {r['after_convert_same']}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
