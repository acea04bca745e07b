#!/usr/bin/env python3
"""Where the capacity is short (issue 17, section 5): how well the analysis finds what the sim knows.

Part 1, virtual time (deterministic, independent of the machine): runs of the sim's step planner in a
closed loop (:func:`servelens.testing.sim_runs.run_loaded`), two engines: prefill cost x4 at
concurrency 2 (short of prefill) and max_num_seqs 4 at concurrency 32 (short of batch slots, the
requests queue). Per seed: the verdict per bucket from the engine's per-request times (the truth)
against the fit's split (no engine times) and the engine-wide split from histograms (the gateway's
by-ISL TTFT beside vLLM-named queue and prefill histograms); the fitted prefill throughput against
the configured rate (1 / prefill_s_per_token), and the time one analysis takes.

Part 2, wall clock: the sim server (``--speedup``) loaded by the bench over HTTP, its truth log as
the engine log; the same two engines. Times are wall times: the configured rate is
``speedup / prefill_s_per_token`` tokens per wall second. Depends on the machine (event-loop lag
adds to TTFT): record ``uptime`` beside it.

Run:  python benchmarks/capacity_split.py [--seeds 20] [--requests 400] [--wall-requests 150] [--speedup 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from servelens.bench import BenchConfig, run_bench
from servelens.core.buckets import IslBuckets
from servelens.core.capacity import BucketMeans, EngineTimes, capacity_from_histograms, capacity_from_samples
from servelens.formats.engine_log import capacity_samples, load_engine_times
from servelens.sim.model import ModelParams
from servelens.sim.testing import run_sim
from servelens.testing.sim_runs import BASE, run_loaded, slowed

BUCKETS = IslBuckets.default()
EVEN = (1, 1, 1, 1, 1, 1, 1)
WALL_ISL = "300:1,800:1,1500:1,3000:1,6000:1,12000:1,24000:1"  # one length per bucket
ENGINES: dict[str, tuple[ModelParams, int]] = {
    "prefill x4, concurrency 2": (slowed(prefill=4.0), 2),
    "max_num_seqs 4, concurrency 32": (BASE.with_overrides(max_num_seqs=4), 32),
}


def histogram_view(records: list, times: dict) -> tuple[list[BucketMeans], EngineTimes]:  # type: ignore[type-arg]
    """What scrapes give: per-bucket TTFT sums/counts and the engine-wide queue/prefill sums."""
    means = []
    for label in BUCKETS.labels:
        ttfts = [r.ttft_s for r in records if BUCKETS.label(r.isl) == label and r.ttft_s is not None]
        means.append(BucketMeans(label, len(ttfts), float(np.mean(ttfts)) if ttfts else None, None))
    q = [v[0] for v in times.values()]
    p = [v[1] for v in times.values()]
    return means, EngineTimes(sum(q), len(q), sum(p), len(p))


def virtual(seeds: int, n: int) -> None:
    print(f"## virtual time: {seeds} seeds x {n} requests, 7 buckets")
    for name, (params, conc) in ENGINES.items():
        rate = 1 / params.prefill_s_per_token
        agree_fit = agree_hist = judged = 0
        ratios, secs = [], []
        truth_kinds: dict[str, int] = {}
        for seed in range(seeds):
            recs, times = run_loaded(seed, BUCKETS, EVEN, n, conc, params)
            t0 = time.perf_counter()
            truth = capacity_from_samples(capacity_samples(recs, times), BUCKETS)
            secs.append(time.perf_counter() - t0)
            fit = capacity_from_samples(capacity_samples(recs), BUCKETS)
            hist = capacity_from_histograms(*histogram_view(recs, times))
            for t, f, h in zip(truth.buckets, fit.buckets, hist.buckets, strict=True):
                if t.limited_by is None:
                    continue
                judged += 1
                truth_kinds[t.limited_by] = truth_kinds.get(t.limited_by, 0) + 1
                agree_fit += f.limited_by == t.limited_by
                agree_hist += h.limited_by == t.limited_by
            if fit.fit is not None:
                ratios.append(fit.fit.throughput_tps / rate)
        r = np.array(ratios)
        print(f"- {name}: truth {truth_kinds}; fit's split agrees {agree_fit}/{judged}, engine-wide histograms "
              f"{agree_hist}/{judged}; fitted / configured prefill rate ({rate:,.0f} tokens/s): median "
              f"{np.median(r):.3f}, range {r.min():.3f}-{r.max():.3f} ({len(r)} fits); "
              f"analysis {np.median(secs) * 1000:.1f} ms (median)")


async def wall(n: int, speedup: float) -> None:
    print(f"## wall clock: the sim at speedup {speedup:g}, {n} requests each, bench over HTTP")
    for name, (params, conc) in ENGINES.items():
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "truth.jsonl"
            kw = {f: getattr(params, f) for f in ("prefill_s_per_token", "max_num_seqs")}
            async with run_sim(speedup=speedup, truth_log=str(log), prefix_cache_blocks=0, **kw) as sim:
                t0 = time.perf_counter()
                res = await run_bench(BenchConfig(url=sim.url, isl=WALL_ISL, osl="16", concurrency=conc,
                                                  num_requests=n, seed=1, output_dir=tmp, progress=False))
                took = time.perf_counter() - t0
            times = load_engine_times(log)
            recs = list(res.records)
            truth = capacity_from_samples(capacity_samples(recs, times), BUCKETS)
            fit = capacity_from_samples(capacity_samples(recs), BUCKETS)
            rate = speedup / params.prefill_s_per_token
            agree = sum(f.limited_by == t.limited_by for t, f in zip(truth.buckets, fit.buckets, strict=True)
                        if t.limited_by is not None)
            judged = sum(t.limited_by is not None for t in truth.buckets)
            got = f"{fit.fit.throughput_tps / rate:.3f}" if fit.fit else "no fit"
            print(f"- {name}: {took:.1f} s; truth waiting {list(truth.waiting())} prefilling "
                  f"{list(truth.prefilling())}; fit's split agrees {agree}/{judged}; fitted / configured rate "
                  f"{got}; {truth.notes or ''}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--wall-requests", type=int, default=150)
    ap.add_argument("--speedup", type=float, default=10.0)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    virtual(args.seeds, args.requests)
    if args.wall_requests:
        asyncio.run(wall(args.wall_requests, args.speedup))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
