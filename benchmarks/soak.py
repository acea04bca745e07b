"""Soak: many concurrent streams through the gateway into the sim for minutes; every request counted once.

``servelens sim --truth-log`` and ``servelens gateway`` run as their own processes; this process keeps
``--streams`` streams open at all times (a closed loop) for ``--duration-s`` seconds. A small, seeded
share of the requests ask the sim for a fault (``x-servelens-fault: http_503`` or
``error_mid_stream``) and another share are dropped by the client after their second read, so
several statuses are counted, not only successes. Every ``--sample-s`` seconds the gateway's (and the
sim's) resident memory and open file descriptors are read from ``/proc``. At the end:

* every request counted exactly once, by outcome: the client's count (what it sent and saw) equals the
  gateway's ``requests_total`` (by ``status``/``error_type``) and the sim's truth log (by outcome and
  HTTP status);
* ``inflight_requests`` back to 0 on the gateway, running and waiting back to 0 on the sim;
* RSS and descriptors: at the end of the warm-up, at the end of the load and after it, and the
  growth between the last two thirds of the run (a leak grows with the requests served);
* one more request after the load is served normally.

The open-files soft limit of this process is raised to its hard limit first: its 500 client sockets need
it, and the children inherit it (500 streams hold ~1,000 descriptors in the gateway: client and upstream
sockets; the gateway also raises its own limit at start and says the streams it allows).

Usage: ``python benchmarks/soak.py [--duration-s 600] [--streams 500] [--json soak.json]``; exit status
1 when a count differs or inflight is not back to 0 (speeds are reported, never judged).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from servelens.bench.client import RequestSpec, build_body, send_request
from servelens.bench.prompts import PromptBuilder, SimTokenizer
from servelens.process import ServerProcess
from servelens.prometheus.parse import parse_exposition

MODEL = "sim-model"
SIM_ARGS = ["--decode-base-s", "0.1", "--max-num-seqs", "1024"]
"""A slow decode step (~0.12 s at 500 sequences: ~4,000 tokens/s in all), so the three processes fit
on two shared cores; every stream is decoding (none waits for a batch slot)."""
FAULT_503 = 0.02
FAULT_MID_STREAM = 0.01
CLIENT_DROP = 0.02
"""Shares of the requests: a 503 before any chunk, an error event mid-stream, the client leaving after
its second read (those ask for 256 tokens, so the engine is still generating when the client leaves)."""


@dataclass
class Tally:
    """What the client sent and saw, by outcome (``success`` or Dynamo's ``error_type``)."""

    outcomes: Counter[str] = field(default_factory=Counter)
    sent: int = 0


def _outcome(status: str, error_type: str) -> str:
    return "success" if status == "success" else error_type


def _proc_sample(pid: int) -> tuple[int, int]:
    """(RSS bytes, open file descriptors) of ``pid`` from /proc."""
    rss = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        return parse_exposition(r.read().decode())


def gateway_counts(url: str) -> tuple[Counter[str], float]:
    """The gateway's ``requests_total`` by outcome, and its ``inflight_requests`` (all models)."""
    counts: Counter[str] = Counter()
    inflight = 0.0
    for (name, labels), v in _scrape(url).items():
        d = dict(labels)
        if name == "servelens_requests_total" and v:
            counts[_outcome(d["status"], d["error_type"])] += int(v)
        elif name == "servelens_inflight_requests":
            inflight += v
    return counts, inflight


def sim_counts(truth_path: Path) -> Counter[str]:
    """The sim's truth log by outcome, in the gateway's words (503 -> overload, an error event in a 200
    stream -> backend_error, a client that left -> cancelled)."""
    dec = msgspec.json.Decoder()
    counts: Counter[str] = Counter()
    with open(truth_path, "rb") as fh:
        for line in fh:
            rec = dec.decode(line)
            outcome = rec["outcome"]
            if outcome == "ok":
                counts["success"] += 1
            elif outcome == "cancelled":
                counts["cancelled"] += 1
            elif outcome == "error":
                counts["overload" if rec["http_status"] == 503 else "backend_error"] += 1
            else:
                counts[outcome] += 1
    return counts


def sim_busy(url: str) -> float:
    """The sim's running plus waiting requests."""
    s = _scrape(url)
    return sum(v for (name, _), v in s.items() if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"))


async def _dropped(session: aiohttp.ClientSession, url: str, body: bytes) -> str:
    """A stream the client leaves after its second read (the connection is closed under it)."""
    reads = 0
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
            if r.status != 200:
                return "http_" + str(r.status)
            async for _ in r.content.iter_any():
                reads += 1
                if reads >= 2:
                    break
            r.close()  # leave: the rest is not read, the connection is dropped
    except aiohttp.ClientError as exc:
        return f"client_error {type(exc).__name__}"
    return "cancelled" if reads >= 2 else "finished_before_drop"


async def load(gw_url: str, streams: int, duration_s: float, seed: int, tally: Tally) -> None:
    """``streams`` workers, each sending one request after the other until ``duration_s`` is over."""
    builder = PromptBuilder(SimTokenizer())
    url = gw_url + "/v1/chat/completions"
    deadline = time.monotonic() + duration_s
    counter = iter(range(10**9))

    async def worker(w: int, session: aiohttp.ClientSession) -> None:
        rng = random.Random(seed * 100_003 + w)
        await asyncio.sleep(w * 0.002)  # arrivals spread over the first second, not one burst
        while time.monotonic() < deadline:
            i = next(counter)
            draw = rng.random()
            drop = draw < CLIENT_DROP
            osl = 256 if drop else rng.randint(8, 128)
            prompt = builder.build(rng.randint(50, 400), key=("soak", seed, i))
            body = build_body("chat", MODEL, prompt, osl)
            tally.sent += 1
            if drop:
                tally.outcomes[await _dropped(session, url, body)] += 1
                continue
            headers = {}
            if draw < CLIENT_DROP + FAULT_503:
                headers["x-servelens-fault"] = "http_503"
            elif draw < CLIENT_DROP + FAULT_503 + FAULT_MID_STREAM:
                headers["x-servelens-fault"] = "error_mid_stream"
            rec = await send_request(session, url, RequestSpec(i, 0, 0, osl, body), headers=headers)
            tally.outcomes[_outcome(rec.status, rec.error_type)] += 1

    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(worker(w, session) for w in range(streams)))


async def _sampler(pids: dict[str, int], every_s: float, samples: list[dict[str, Any]], stop: asyncio.Event) -> None:
    t0 = time.monotonic()
    while True:
        row: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 1), "load1": os.getloadavg()[0]}
        for name, pid in pids.items():
            row[f"{name}_rss_mib"], row[f"{name}_fds"] = _proc_sample(pid)
            row[f"{name}_rss_mib"] = round(row[f"{name}_rss_mib"] / 2**20, 1)
        samples.append(row)
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except TimeoutError:
            pass


async def _run_load(gw_url: str, pids: dict[str, int], streams: int, duration_s: float, seed: int,
                    sample_s: float) -> tuple[Tally, list[dict[str, Any]], float]:
    tally = Tally()
    samples: list[dict[str, Any]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sampler(pids, sample_s, samples, stop))
    t0 = time.perf_counter()
    await load(gw_url, streams, duration_s, seed, tally)
    wall = time.perf_counter() - t0
    stop.set()
    await sampler
    return tally, samples, wall


def _raise_nofile() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _wait(cond: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)  # polling another process's counters, with a deadline
    return bool(cond())


def run(duration_s: float, streams: int, seed: int = 1, sample_s: float = 5.0) -> dict[str, Any]:
    """Run the soak; returns the figures and the verdicts (``ok``: counts equal, inflight 0, served after)."""
    nofile = _raise_nofile()
    with tempfile.TemporaryDirectory() as tmp:
        truth = Path(tmp) / "truth.jsonl"
        with ServerProcess(["sim", "--truth-log", str(truth), "--seed", str(seed), *SIM_ARGS],
                           log_path=Path(tmp) / "sim.log") as sim, \
                ServerProcess(["gateway", "--upstream", sim.url], log_path=Path(tmp) / "gw.log") as gw:
            assert sim.proc is not None and gw.proc is not None
            pids = {"gateway": gw.proc.pid, "sim": sim.proc.pid}
            before = {name: _proc_sample(pid) for name, pid in pids.items()}
            tally, samples, wall = asyncio.run(_run_load(gw.url, pids, streams, duration_s, seed, sample_s))
            client = Counter({k: v for k, v in tally.outcomes.items()})
            _wait(lambda: sum(gateway_counts(gw.url)[0].values()) >= tally.sent, 60)
            _wait(lambda: gateway_counts(gw.url)[1] == 0 and sim_busy(sim.url) == 0, 60)
            gw_counts, inflight = gateway_counts(gw.url)
            busy = sim_busy(sim.url)
            _wait(lambda: _proc_sample(pids["gateway"])[1] <= before["gateway"][1] + 2, 15)  # keep-alives expire
            after = {name: _proc_sample(pid) for name, pid in pids.items()}
            # served normally afterwards: one more request, counted like the others
            rec = asyncio.run(_one(gw.url))
            served_after = rec == "success"
        sim_outcomes = sim_counts(truth)
    if served_after:  # the request after the load is not part of the tally (the gateway was read before it)
        sim_outcomes["success"] -= 1
    warm = next((s for s in samples if s["t_s"] >= min(60.0, duration_s / 5)), samples[0])
    third = [s for s in samples if s["t_s"] >= duration_s / 3]
    result: dict[str, Any] = {
        "duration_s": duration_s, "streams": streams, "wall_s": round(wall, 1), "nofile": nofile,
        "sent": tally.sent, "client": dict(client), "gateway": dict(gw_counts), "sim": dict(sim_outcomes),
        "gateway_inflight_after": inflight, "sim_busy_after": busy, "served_after": served_after,
        "before": {k: {"rss_mib": round(v[0] / 2**20, 1), "fds": v[1]} for k, v in before.items()},
        "after_idle": {k: {"rss_mib": round(v[0] / 2**20, 1), "fds": v[1]} for k, v in after.items()},
        "warm": warm, "end": samples[-1], "samples": samples,
        "requests_per_s": round(tally.sent / wall, 1),
    }
    if len(third) >= 2:
        result["rss_growth_last_two_thirds_mib"] = round(third[-1]["gateway_rss_mib"] - third[0]["gateway_rss_mib"], 1)
        result["max_fds_under_load"] = max(s["gateway_fds"] for s in samples)
    gw_expected = Counter(client)
    result["counts_match"] = gw_expected == gw_counts and gw_expected == sim_outcomes
    result["ok"] = bool(result["counts_match"] and inflight == 0 and busy == 0 and served_after)
    return result


async def _one(gw_url: str) -> str:
    body = build_body("chat", MODEL, "one more after the soak", 4)
    async with aiohttp.ClientSession() as s:
        rec = await send_request(s, gw_url + "/v1/chat/completions", RequestSpec(0, 0, 0, 4, body))
    return _outcome(rec.status, rec.error_type)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=600.0, help="seconds of load (default 600: 10 minutes)")
    ap.add_argument("--streams", type=int, default=500, help="concurrent streams (default 500)")
    ap.add_argument("--sample-s", type=float, default=5.0, help="RSS/descriptor sampling period (default 5 s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the figures (with every sample) here")
    args = ap.parse_args(argv)
    r = run(args.duration_s, args.streams, args.seed, args.sample_s)
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))
    print(f"{r['streams']} streams for {r['duration_s']:g} s (open files limit {r['nofile'][0]}): "
          f"{r['sent']} requests, {r['requests_per_s']} req/s")
    print(f"  client  {dict(sorted(r['client'].items()))}")
    print(f"  gateway {dict(sorted(r['gateway'].items()))}")
    print(f"  sim     {dict(sorted(r['sim'].items()))}")
    print(f"  counts match: {r['counts_match']}; gateway inflight after: {r['gateway_inflight_after']:g}; sim running+"
          f"waiting after: {r['sim_busy_after']:g}; served normally after: {r['served_after']}")
    for label, s in (("before", r["before"]), ("after, idle", r["after_idle"])):
        print(f"  {label:12s} gateway RSS {s['gateway']['rss_mib']} MiB, {s['gateway']['fds']} fds; "
              f"sim RSS {s['sim']['rss_mib']} MiB, {s['sim']['fds']} fds")
    for label, s in (("warm", r["warm"]), ("end of load", r["end"])):
        print(f"  {label:12s} (t={s['t_s']} s, load {s['load1']:.1f}) gateway RSS {s['gateway_rss_mib']} MiB, "
              f"{s['gateway_fds']} fds; sim RSS {s['sim_rss_mib']} MiB, {s['sim_fds']} fds")
    if "rss_growth_last_two_thirds_mib" in r:
        print(f"  gateway RSS growth over the last two thirds: {r['rss_growth_last_two_thirds_mib']} MiB; "
              f"max fds under load {r['max_fds_under_load']}")
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
