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
same run, default flags: the intervals' method is chosen by size) on the columns and, where there is
one, on the JSONL, and checks that the two outputs are the same; with ``--bootstrap-up-to N`` also
with ``--intervals bootstrap`` (what the default was before a million requests were in reach).

``--baseline-src DIR`` runs the previous code side by side: the ``src`` folder of an earlier commit
(``git archive COMMIT src | tar -x -C DIR``), as ``PYTHONPATH=DIR/src python -m servelens``: its report
on the columns at every size, its explain up to ``--baseline-explain-up-to`` (its bootstrap and
per-value windows need ~30 GB at a million requests), and whether its table is the same and its
verdict lines are.

The generated folders carry the writer's per-request ITL totals and bin counts for the default ISL
buckets (what the bench writes for its own buckets); ``report`` and ``explain`` are also timed with
``--isl-buckets 1000,4000,16000``, where those counts do not serve and the passes over the bins run.

Every measurement records the 1-minute load average just before it (the machine is shared).

Usage: ``python benchmarks/results_scale.py [--requests 20000,100000,1000000] [--jsonl-up-to 100000]
[--explain-up-to 1000000] [--bootstrap-up-to 20000] [--baseline-src DIR] [--baseline-explain-up-to 100000]
[--dir /work/tmp] [--keep] [--json out.json]``
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
OTHER = "1000,4000,16000"
"""ISL buckets other than the generated runs' own (the default ones the writer counts values for)."""
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


def measure(args: list[str], src: str | None = None) -> tuple[float, float, bytes, float]:
    """Wall time (s), peak RSS (MiB), stdout and CPU time (user + system, s) of one ``servelens``
    subprocess (the CPU time is the figure a loaded machine moves least); ``src``: run the code of
    that ``src`` folder instead (``PYTHONPATH``)."""
    cmd = [sys.executable, "-c", MEASURE, sys.executable, "-m", "servelens", *args]
    env = dict(os.environ, PYTHONPATH=src) if src else None
    p = subprocess.run(cmd, capture_output=True, check=False, env=env)
    tail = p.stderr.decode().strip().splitlines()
    wall, rss, rc, cpu = tail[-1].split()[1:]
    if int(rc) != 0:
        raise SystemExit(f"servelens {' '.join(args)} failed: {' '.join(tail[-3:-1])}")
    return float(wall), int(rss) / 1024, p.stdout, float(cpu)


def timed(row: dict[str, Any], key: str, args: list[str], src: str | None = None) -> bytes:
    """Measure one command into ``row`` as ``key_wall_s``, ``key_cpu_s``, ``key_rss_mib``, ``key_load1``."""
    row[f"{key}_load1"] = os.getloadavg()[0]
    wall, rss, out, cpu = measure(args, src)
    row |= {f"{key}_wall_s": wall, f"{key}_cpu_s": cpu, f"{key}_rss_mib": rss}
    print(f"  {key}: {wall:.2f} s wall, {cpu:.2f} s CPU, {rss:,.0f} MiB", file=sys.stderr)
    return out


def verdicts(out: bytes) -> list[str]:
    """The verdict lines of explain's text output (the first lines, up to the first blank one)."""
    return out.decode().split("\n\n")[0].splitlines()


def cell(r: dict[str, Any], key: str) -> str:
    """``wall, CPU, RSS (load)`` of a measurement, or ``not run``."""
    if f"{key}_wall_s" not in r:
        return "not run"
    return (f"{r[key + '_wall_s']:.2f} s, {r[key + '_cpu_s']:.2f} s, {r[key + '_rss_mib']:,.0f} MiB "
            f"({r[key + '_load1']:.1f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", default="20000,100000,1000000")
    ap.add_argument("--jsonl-up-to", type=int, default=100_000)
    ap.add_argument("--explain-up-to", type=int, default=1_000_000,
                    help="also time servelens explain (both windows this run) up to this many requests")
    ap.add_argument("--bootstrap-up-to", type=int, default=20_000,
                    help="also time explain --intervals bootstrap up to this many requests")
    ap.add_argument("--baseline-src", default=None, help="a src folder of earlier code to run side by side")
    ap.add_argument("--baseline-explain-up-to", type=int, default=100_000)
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    sizes = sorted(int(x) for x in a.requests.split(","))
    root = Path(tempfile.mkdtemp(prefix="results_scale_", dir=a.dir))
    base = a.baseline_src
    results: list[dict[str, Any]] = []
    try:
        for n in sizes:
            run = root / f"n{n}"
            run.mkdir()
            jsonl = run / "results.jsonl" if n <= a.jsonl_up_to else None
            t = time.perf_counter()
            generate(n, run / "results.cols", jsonl)
            gen_s = time.perf_counter() - t
            cols = str(run / "results.cols")
            row: dict[str, Any] = {"requests": n, "generate_s": gen_s, "cols_bytes": size_bytes(run / "results.cols")}
            print(f"{n:,} requests (generated in {gen_s:.0f} s)", file=sys.stderr)
            new = timed(row, "new", ["report", "--results", cols, "--format", "csv"])
            # buckets other than the run's: the writer's bin counts do not serve, both passes run
            timed(row, "new_other", ["report", "--results", cols, "--format", "csv", "--isl-buckets", OTHER])
            if base:
                got = timed(row, "base", ["report", "--results", cols, "--format", "csv"], base)
                row["base_same_table"] = got == new
            if n <= a.explain_up_to:  # both windows the same run: the cost of reading two, verdict "none"
                ex = timed(row, "explain", ["explain", "--results", cols, cols])
                row["explain_method"] = [x for x in ex.decode().splitlines() if x.startswith("uncertainty:")]
                timed(row, "explain_other", ["explain", "--results", cols, cols, "--isl-buckets", OTHER])
                if n <= a.bootstrap_up_to:
                    boot = timed(row, "explain_boot", ["explain", "--results", cols, cols, "--intervals", "bootstrap"])
                    row["explain_boot_same_verdicts"] = verdicts(boot) == verdicts(ex)
                if base and n <= a.baseline_explain_up_to:
                    old = timed(row, "explain_base", ["explain", "--results", cols, cols], base)
                    row["explain_base_same_verdicts"] = verdicts(old) == verdicts(ex)
                if jsonl is not None:
                    ex_old = timed(row, "explain_old", ["explain", "--results", str(jsonl), str(jsonl)])
                    row["explain_same"] = ex_old == ex.replace(cols.encode(), str(jsonl).encode())
            if jsonl is not None:
                old = timed(row, "old", ["report", "--results", str(jsonl), "--format", "csv"])
                row |= {"jsonl_bytes": jsonl.stat().st_size, "same_table": old == new}
                if n == max(s for s in sizes if s <= a.jsonl_up_to):
                    shutil.rmtree(run / "results.cols")
                    conv = measure(["report", "--results", str(jsonl), "--convert"])
                    cached = measure(["report", "--results", str(jsonl), "--format", "csv"])
                    row |= {"convert_wall_s": conv[0], "convert_rss_mib": conv[1], "convert_cpu_s": conv[3],
                            "after_convert_wall_s": cached[0], "after_convert_same": cached[2] == new}
                jsonl.unlink()
            shutil.rmtree(run)
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print_tables(results)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


def print_tables(results: list[dict[str, Any]]) -> None:
    """The tables for docs/benchmarks.md: wall, CPU, peak RSS (load average at the start)."""
    print("| requests | JSONL | columns | report, JSONL path | report, columns, previous code | report, columns "
          "| report, columns, other buckets | same table |\n|---|---|---|---|---|---|---|---|")
    for r in results:
        same = [str(r[k]) for k in ("same_table", "base_same_table") if k in r]
        jsonl = f"{r['jsonl_bytes'] / 1e9:.2f} GB" if "jsonl_bytes" in r else "not written"
        print(f"| {r['requests']:,} | {jsonl} | {r['cols_bytes'] / 1e9:.2f} GB | {cell(r, 'old')} | {cell(r, 'base')} "
              f"| {cell(r, 'new')} | {cell(r, 'new_other')} | {', '.join(same) or 'n/a'} |")
    print("\n| requests | explain, JSONL path | explain, columns, previous code | explain, columns, "
          "--intervals bootstrap | explain, columns | explain, columns, other buckets | same output / verdicts |"
          "\n|---|---|---|---|---|---|---|")
    for r in results:
        if "explain_wall_s" not in r:
            continue
        same = [f"{k}: {r[k]}" for k in ("explain_same", "explain_base_same_verdicts", "explain_boot_same_verdicts")
                if k in r]
        print(f"| {r['requests']:,} | {cell(r, 'explain_old')} | {cell(r, 'explain_base')} | {cell(r, 'explain_boot')} "
              f"| {cell(r, 'explain')} | {cell(r, 'explain_other')} | {'; '.join(same) or 'n/a'} |")
    for r in results:
        if "convert_wall_s" in r:
            print(f"\n--convert of {r['requests']:,} requests: {r['convert_wall_s']:.1f} s "
                  f"({r['convert_cpu_s']:.1f} s CPU), "
                  f"{r['convert_rss_mib']:,.0f} MiB peak; the report of that JSONL afterwards (reads the "
                  f"columns): {r['after_convert_wall_s']:.2f} s, same table: {r['after_convert_same']}")
    for r in results:
        for line in r.get("explain_method", [])[:1]:
            print(f"\n{r['requests']:,} requests, explain's {line}")


if __name__ == "__main__":
    sys.exit(main())
