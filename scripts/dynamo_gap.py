#!/usr/bin/env python3
"""Gateway vs NVIDIA Dynamo 1.6.1's own frontend metrics, driven by ``servelens bench`` (issue 7).

One measured pass (:func:`measure`): a fresh Dynamo mocker + frontend (``dynamo_harness.serve``), a
``servelens gateway --metrics-prefix dynamo_frontend`` in front of it (child process, request log
on), and ``servelens bench`` (child process) replaying the first requests of the packaged Mooncake
conversation cut (shared 512-token prefix blocks, so the mocker's prefix cache hits) through the
gateway at a fixed concurrency. Afterwards both ``/metrics`` pages are scraped and the bench's
results file and the gateway's request log are read back.

Three clocks see each request: Dynamo's frontend (arrival at Dynamo to its first output token),
the gateway (arrival at the gateway to the first output-bearing chunk it relays) and the bench
(send to first output-bearing chunk received). The conformance test (tests/engines/
test_dynamo_conformance.py) checks the sums; run as a script this prints the TTFT gaps per
concurrency for docs/benchmarks.md. Must run inside a private network namespace::

    python scripts/dynamo_harness.py run-in-netns -- python scripts/dynamo_gap.py --concurrency 1,8,32

Timings are noisy on a shared 2-core machine; compare the gaps, not the absolute TTFTs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dynamo_harness as harness

from servelens.formats.results import BenchRecord, load_results
from servelens.process import ServerProcess
from servelens.prometheus.names import DYNAMO_PREFIX, MetricNames

TRACE = "mooncake_conversation_400.jsonl"
ISL_BUCKETS = "512,1024,2048,4096,8192,16384"
NAMES = MetricNames(DYNAMO_PREFIX)
STOCK = {"ttft": NAMES.ttft, "itl": NAMES.itl, "duration": NAMES.duration, "isl": NAMES.isl,
         "osl": NAMES.osl, "cached": NAMES.cached}


@dataclass(frozen=True)
class HistSums:
    """``_sum`` and ``_count`` of the six stock histograms for one model (seconds or tokens)."""

    sums: dict[str, float]
    counts: dict[str, float]


@dataclass(frozen=True)
class Pass:
    """What one measured pass saw.

    Attributes:
        concurrency: bench workers.
        dynamo, gateway: stock histogram sums/counts from each ``/metrics`` (all requests the
            gateway relayed, including the bench's one-token probe if it sent one).
        gateway_by_isl_text: the gateway's full exposition (for by-ISL checks).
        records: the bench's per-request records (trace requests only).
        gateway_log: the gateway's request log entries (every relayed request).
        wall_s: bench wall time.
    """

    concurrency: int
    dynamo: HistSums
    gateway: HistSums
    gateway_text: str
    dynamo_text: str
    records: tuple[BenchRecord, ...]
    gateway_log: tuple[dict[str, Any], ...]
    wall_s: float

    def bench_ttfts_s(self) -> list[float]:
        """TTFT per successful bench request (s)."""
        return [r.ttft_s for r in self.records if r.ok and r.ttft_s is not None]

    def paired_ttft_s(self) -> list[tuple[float, float]]:
        """(bench TTFT, gateway TTFT) per trace request, joined on (ISL, OSL) and TTFT rank.

        Dynamo sends no ``x-request-id``, so requests are matched by their prompt and output
        lengths; equal keys are paired in TTFT order.
        """
        by_key: dict[tuple[int, int], list[float]] = defaultdict(list)
        for e in self.gateway_log:
            if e.get("status") == "success" and e.get("ttft_s") is not None:
                by_key[(int(e["isl"]), int(e["osl"]))].append(float(e["ttft_s"]))
        bench: dict[tuple[int, int], list[float]] = defaultdict(list)
        for r in self.records:
            if r.ok and r.ttft_s is not None and r.isl_server is not None and r.osl is not None:
                bench[(r.isl_server, r.osl)].append(r.ttft_s)
        pairs = []
        for key, b in bench.items():
            g = sorted(by_key.get(key, []))
            for bt, gt in zip(sorted(b), g, strict=False):
                pairs.append((bt, gt))
        return pairs


def scrape(url: str) -> str:
    """GET ``url`` (a /metrics page) as text."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def hist_sums(text: str, model: str) -> HistSums:
    """The six stock histograms' ``_sum``/``_count`` for ``model`` from an exposition text."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    wanted = {v: k for k, v in STOCK.items()}
    for fam in text_string_to_metric_families(text):
        key = wanted.get(fam.name)
        if key is None:
            continue
        for s in fam.samples:
            if s.labels.get("model") != model:
                continue
            if s.name.endswith("_sum"):
                sums[key] = s.value
            elif s.name.endswith("_count"):
                counts[key] = s.value
    return HistSums(sums, counts)


def start_gateway(stack: Any, out_dir: Path, by_isl_only: bool = False) -> ServerProcess:
    """``servelens gateway`` in front of ``stack`` (prefix ``dynamo_frontend``, request log in
    ``out_dir/gateway-requests.jsonl``); use as a context manager (stopped with SIGTERM)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["gateway", "--upstream", stack.frontend_url, "--metrics-prefix", DYNAMO_PREFIX,
            "--isl-buckets", ISL_BUCKETS, "--request-log", str(out_dir / "gateway-requests.jsonl")]
    if by_isl_only:
        args.append("--by-isl-only")
    return ServerProcess(args, log_path=out_dir / "gateway.log")


def run_bench(
    url: str, tokenizer: Path, concurrency: int, max_requests: int, out_dir: Path,
    timeout_s: float = 300.0, synthetic: tuple[str, str] | None = None,
) -> tuple[tuple[BenchRecord, ...], float]:
    """``servelens bench`` against ``url``: the first ``max_requests`` rows of the packaged Mooncake
    cut (clipped to the mocker's 32768-token context), ``concurrency`` workers,
    ``--no-continuous-usage`` (the mocker sends one token per chunk; this skips the bench's options
    probe, but the cut comes near the context, so one probe still asks for the chat template's tokens:
    one request more on the servers' counters, of one output token). ``synthetic=(isl_spec,
    osl_spec)`` replaces the trace with a synthetic workload. Returns (records, wall seconds).
    Raises RuntimeError when the bench fails.
    """
    workload = (["--isl", synthetic[0], "--osl", synthetic[1], "--num-requests", str(max_requests)]
                if synthetic else ["--trace", TRACE])
    cmd = [sys.executable, "-m", "servelens", "bench", "--url", url, *workload,
           "--tokenizer", str(tokenizer), "--max-requests", str(max_requests),
           "--concurrency", str(concurrency), "--max-context", str(harness.DEFAULT_MAX_MODEL_LEN),
           "--long-requests", "clip", "--no-continuous-usage", "--no-progress", "--output-dir", str(out_dir)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"servelens bench exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return tuple(load_results(out_dir / "results.jsonl")), wall


def read_request_log(out_dir: Path) -> tuple[dict[str, Any], ...]:
    """The gateway's request log lines written by :func:`start_gateway`."""
    log = out_dir / "gateway-requests.jsonl"
    return tuple(json.loads(line) for line in log.read_text().splitlines() if line.strip())


def measure(stack: Any, concurrency: int, max_requests: int, out_dir: Path, by_isl_only: bool = False,
            synthetic: tuple[str, str] | None = None) -> Pass:
    """One pass against a running Dynamo ``stack`` (a ``dynamo_harness.DynamoStack``): gateway,
    bench through it, then both ``/metrics`` scraped. Raises RuntimeError when the bench fails."""
    with start_gateway(stack, out_dir, by_isl_only) as gw:
        records, wall = run_bench(gw.url, Path(stack.model_dir) / "tokenizer.json", concurrency, max_requests,
                                  out_dir / "bench", synthetic=synthetic)
        gw_text = scrape(f"{gw.url}/metrics")
        dyn_text = scrape(f"{stack.frontend_url}/metrics")
    return Pass(concurrency, hist_sums(dyn_text, stack.model), hist_sums(gw_text, stack.model),
                gw_text, dyn_text, records, read_request_log(out_dir), wall)


@dataclass(frozen=True)
class GapRow:
    """Mean TTFT per request (ms) seen by Dynamo, the gateway and the bench, and their gaps."""

    concurrency: int
    requests: int
    dynamo_ms: float
    gateway_ms: float
    bench_ms: float
    gateway_minus_dynamo_ms: float
    bench_minus_gateway_ms: float
    bench_minus_dynamo_ms: float
    paired_bench_minus_gateway_p50_ms: float
    paired_bench_minus_gateway_max_ms: float
    first_two_chunks_together_pct: float
    mean_isl_tokens: float
    wall_s: float


def gap_row(p: Pass) -> GapRow:
    """Summarise one pass (means over the same requests: Dynamo and gateway sums include the same set)."""
    n = p.dynamo.counts["ttft"]
    dyn = p.dynamo.sums["ttft"] / n * 1e3
    gwm = p.gateway.sums["ttft"] / p.gateway.counts["ttft"] * 1e3
    bench = statistics.fmean(p.bench_ttfts_s()) * 1e3
    diffs = sorted((b - g) * 1e3 for b, g in p.paired_ttft_s())
    multi = [r for r in p.records if r.ok and len(r.chunk_offsets_ns) > 1]
    together = sum(1 for r in multi if r.chunk_offsets_ns[1] - r.chunk_offsets_ns[0] < 1_000_000)
    together_pct = round(100.0 * together / len(multi), 1) if multi else float("nan")
    mean_isl = round(p.dynamo.sums["isl"] / p.dynamo.counts["isl"], 0)
    return GapRow(p.concurrency, len(p.records), round(dyn, 2), round(gwm, 2), round(bench, 2),
                  round(gwm - dyn, 2), round(bench - gwm, 2), round(bench - dyn, 2),
                  round(statistics.median(diffs), 2) if diffs else float("nan"),
                  round(max(diffs), 2) if diffs else float("nan"), together_pct, mean_isl, round(p.wall_s, 1))


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: one pass per concurrency, print a Markdown table and write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated concurrencies")
    ap.add_argument("--requests", default="", help="requests per concurrency (comma list; default 4x conc, >= 12)")
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--isl", default="", help="synthetic ISL spec instead of the Mooncake cut (with --osl)")
    ap.add_argument("--osl", default="64", help="synthetic OSL spec (with --isl)")
    args = ap.parse_args(argv)
    concs = [int(c) for c in args.concurrency.split(",")]
    reqs = [int(r) for r in args.requests.split(",")] if args.requests else [max(12, 4 * c) for c in concs]
    try:
        venv = harness.install()
        model_dir = harness.build_tiny_model()
        rows = []
        for c, n in zip(concs, reqs, strict=True):
            with tempfile.TemporaryDirectory(prefix="servelens-dyngap-") as d, harness.serve(venv, model_dir) as st:
                syn = (args.isl, args.osl) if args.isl else None
                rows.append(gap_row(measure(st, c, n, Path(d), synthetic=syn)))
                print(json.dumps(asdict(rows[-1])), file=sys.stderr, flush=True)
    except (harness.HarnessError, RuntimeError) as e:
        print(f"dynamo_gap: error: {e}", file=sys.stderr)
        return 2
    print("| concurrency | requests | mean ISL | Dynamo TTFT mean (ms) | gateway | bench | gateway - Dynamo | "
          "bench - gateway | bench - Dynamo | bench - gateway per request p50 / max | first 2 chunks together |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.concurrency} | {r.requests} | {r.mean_isl_tokens:.0f} | {r.dynamo_ms:.1f} | {r.gateway_ms:.1f} | "
              f"{r.bench_ms:.1f} | {r.gateway_minus_dynamo_ms:+.1f} | {r.bench_minus_gateway_ms:+.1f} | "
              f"{r.bench_minus_dynamo_ms:+.1f} | {r.paired_bench_minus_gateway_p50_ms:+.1f} / "
              f"{r.paired_bench_minus_gateway_max_ms:+.1f} | {r.first_two_chunks_together_pct:.0f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
