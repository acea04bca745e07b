"""How many concurrent streams and chunks per second one `servelens sim` process sustains on one
core, at --speedup 1 and 10, while its step timing stays within 1 ms of the model.

Each point starts a fresh sim child (``--debug`` for /debug/stats; with ``--pin`` the sim is pinned
to CPU 0 and the client to the others, which only helps on an otherwise idle machine) and runs a
closed loop of C streaming /v1/completions clients (ISL 128 unique tokens, OSL 64, ignore_eos) for
``--seconds``, the client pinned to the other CPUs. Reported per point: chunks/s received, the
sim's CPU use (from /proc, 1.0 = one core saturated) and its CPU time per chunk (the figure that
survives a shared machine: one free core sustains about 1e6 / (us per chunk) chunks/s), the
time the sim spent runnable but waiting for a CPU per step (/proc schedstat: when this is as large
as the lateness, the host, not the sim, made the steps late), and the
lateness of step ends against the model (p50/p99 ms and the share of steps ending <= 1 ms late,
from /debug/stats). A point "holds" when >= 95 % of steps end within 1 ms of the model. A first
row per speedup runs the bare step loop in this process (64 sequences, no HTTP): the machine's
noise floor for lateness.

    python benchmarks/sim_capacity.py                 # full grid (~1 minute)
    python benchmarks/sim_capacity.py --quick         # 2 points, for a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from servelens.process import ServerProcess
from servelens.sim.presets import get_preset
from servelens.sim.scheduler import Engine, SimRequest
from servelens.sim.steploop import MonotonicClock, StepLoop
from servelens.sim.tokenizer import make_text


def sched_s(pid: int) -> tuple[float, float]:
    """(CPU time, time spent runnable but waiting for a CPU) of all threads of ``pid``, seconds
    (/proc/PID/task/*/schedstat)."""
    cpu = wait = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            a = f.read().split()
        cpu += int(a[0])
        wait += int(a[1])
    return cpu / 1e9, wait / 1e9


async def run_point(url: str, concurrency: int, seconds: float, osl: int) -> tuple[int, int, float]:
    stop_at = time.perf_counter() + seconds
    chunks = 0
    requests = 0

    async def worker(i: int, s: aiohttp.ClientSession) -> None:
        nonlocal chunks, requests
        k = 0
        while time.perf_counter() < stop_at:
            body = {"prompt": make_text(128, ("bench", i, k)), "max_tokens": osl, "ignore_eos": True,
                    "stream": True}
            k += 1
            async with s.post(url + "/v1/completions", json=body) as r:
                async for data in r.content.iter_any():
                    chunks += data.count(b"data: {")
            requests += 1

    conn = aiohttp.TCPConnector(limit=0)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=seconds + 60)) as s:
        await asyncio.gather(*[worker(i, s) for i in range(concurrency)])
    return chunks, requests, time.perf_counter() - t0


async def bare_loop(speedup: float, seconds: float) -> dict[str, float]:
    """The step loop alone (no HTTP, no handlers): 64 long decodes for ``seconds``."""
    engine = Engine(get_preset("llama-3.1-8b-h100").params)
    loop = StepLoop(engine, MonotonicClock(), speedup)
    loop.start()
    for i in range(64):
        loop.submit(SimRequest(f"b{i}", [], 128, 5000, time.perf_counter_ns()))
    await asyncio.sleep(seconds)
    await loop.stop()
    return loop.stats.summary()


async def stats(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(url + "/debug/stats") as r:
        return dict(await r.json())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--speedups", default="1,10")
    ap.add_argument("--concurrency", default="4,16,64,256,512")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pin", action="store_true", help="pin the sim to CPU 0 and the client to the rest")
    args = ap.parse_args()
    speedups = [float(x) for x in args.speedups.split(",")]
    levels = [int(x) for x in args.concurrency.split(",")]
    if args.quick:
        speedups, levels, args.seconds = [10.0], [16, 128], 2.0
    ncpu = os.cpu_count() or 1
    pin = args.pin and ncpu > 1
    if pin:
        os.sched_setaffinity(0, set(range(1, ncpu)))
    try:
        import uvloop

        run: Callable[..., Any] = uvloop.run
    except ImportError:
        run = asyncio.run
    where = f"sim on CPU 0, client on CPUs 1-{ncpu - 1}" if pin else "no CPU pinning"
    print(f"# sim capacity: ISL 128, OSL {args.osl}, {args.seconds:g} s per point, {where}, "
          f"{ncpu} CPUs, load average before: {os.getloadavg()[0]:.2f}")
    print("| speedup | streams | chunks/s | steps/s | sim CPU | sim CPU us/chunk | sim run-queue wait ms/step "
          "| late p50 ms | late p99 ms | steps <= 1 ms late | holds |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for sp in speedups:
        base = run(bare_loop(sp, args.seconds))
        print(f"| {sp:g} | bare loop, 64 seqs | - | - | - | - | - | {base['late_p50_ms']:.3f} "
              f"| {base['late_p99_ms']:.3f} "
              f"| {base['within_1ms']:.1%} | - |", flush=True)
        for c in levels:
            srv = ServerProcess(["sim", "--speedup", str(sp), "--debug", "--preset", "llama-3.1-8b-h100"]).start()
            try:
                assert srv.proc is not None
                if pin:
                    os.sched_setaffinity(srv.proc.pid, {0})
                st0 = run(stats(srv.url))
                cpu0, wait0 = sched_s(srv.proc.pid)
                chunks, _requests, wall = run(run_point(srv.url, c, args.seconds, args.osl))
                cpu1, wait1 = sched_s(srv.proc.pid)
                cpu = (cpu1 - cpu0) / wall
                st = run(stats(srv.url))
                steps = max(1, int(st["steps"] - st0["steps"]))
                runq_ms = (wait1 - wait0) / steps * 1e3
            finally:
                srv.stop()
            holds = "yes" if st["within_1ms"] >= 0.95 else "no"
            print(f"| {sp:g} | {c} | {chunks / wall:,.0f} | {steps / wall:,.0f} | {cpu:.2f} "
                  f"| {cpu * wall / max(chunks, 1) * 1e6:.1f} | {runq_ms:.2f} | {st['late_p50_ms']:.3f} "
                  f"| {st['late_p99_ms']:.3f} | {st['within_1ms']:.1%} | {holds} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
