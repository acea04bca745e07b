#!/usr/bin/env python3
"""Accuracy of ``servelens explain`` against the truth (issue 17): runs of the sim's step planner in
virtual time, one request at a time (:mod:`servelens.testing.sim_runs`), so every bucket's true
mean TTFT is the engine model's (``idle_ttft_s`` averaged over the bucket's lengths) and the true
shift-share split is known. For each seed: a phase at the early mix on the base engine against a
phase at the late mix on an engine with attention x6 (traffic shift and a slowdown of long prompts).

Per source (bench results: bootstrap; the same requests as histograms, with Dynamo 1.6.1's TTFT
``le`` edges and with servelens' fine default edges, 2^(1/8) apart: normal approximation from
counts), over the seeds:

* coverage: how often the 95% intervals of the mix and the latency effect hold the true split;
* width: the intervals' mean width, histograms over samples;
* counterfactual p95: the histogram's against the reweighted samples' exact one, in ``le`` buckets
  apart (0: the same ``le`` bucket, the documented bound) and relative error;
* time: seconds per explanation (TTFT only).

Run:  python benchmarks/explain_accuracy.py [--seeds 40] [--requests 600] [--resamples 2000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from servelens.core.buckets import IslBuckets
from servelens.core.decompose import explain
from servelens.core.edges import FINE_TTFT_EDGES_S, TTFT_EDGES_S
from servelens.core.quantiles import bucket_bounds
from servelens.core.windows import sample_window
from servelens.formats.results import to_samples
from servelens.sim.model import ModelParams, idle_ttft_s
from servelens.testing.latency_windows import EARLY_MIX, LATE_MIX, binned
from servelens.testing.sim_runs import BASE, run_phase, slowed

BUCKETS = IslBuckets.default()


def true_means(params: ModelParams) -> np.ndarray:
    lows = [1, *(b + 1 for b in BUCKETS.boundaries)]
    highs = [*BUCKETS.boundaries, 2 * BUCKETS.boundaries[-1]]
    return np.array([np.mean([idle_ttft_s(params, x) for x in range(lo, hi + 1, 7)]) for lo, hi in
                     zip(lows, highs, strict=True)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--resamples", type=int, default=2000)
    args = ap.parse_args()
    slow = slowed(attention=6.0)
    m_a, m_b = true_means(BASE), true_means(slow)
    edge_sets = {"Dynamo's edges": tuple(float(e) for e in TTFT_EDGES_S), "fine edges": FINE_TTFT_EDGES_S}
    kinds = ("samples", *edge_sets)
    stats: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
    for seed in range(args.seeds):
        a = sample_window(to_samples(run_phase(2 * seed, BUCKETS, EARLY_MIX, args.requests)), BUCKETS, "ttft")
        b = sample_window(to_samples(run_phase(2 * seed + 1, BUCKETS, LATE_MIX, args.requests, slow)), BUCKETS, "ttft")
        w_a, w_b = a.counts() / a.counts().sum(), b.counts() / b.counts().sum()
        truth = {"mix": float(((w_b - w_a) * m_a).sum()), "latency": float((w_b * (m_b - m_a)).sum())}
        exact_cf = None
        pairs = [("samples", (a, b))] + [(k, (binned(a, e), binned(b, e))) for k, e in edge_sets.items()]
        for kind, (x, y) in pairs:
            t0 = time.perf_counter()
            e = explain(x, y, resamples=args.resamples, seed=seed)
            s = stats[kind]
            s.setdefault("seconds", []).append(time.perf_counter() - t0)
            for name, ci in (("mix", e.mix_effect_ci_s), ("latency", e.latency_effect_ci_s)):
                s.setdefault(f"{name}_covered", []).append(float(ci[0] <= truth[name] <= ci[1]))
                s.setdefault(f"{name}_width", []).append(ci[1] - ci[0])
            s.setdefault("verdict_both", []).append(float(e.verdict == "both"))
            cf = e.quantile(0.95).counterfactual_s
            assert cf is not None
            if kind == "samples":
                exact_cf = cf
            else:
                assert exact_cf is not None
                lo, hi = bucket_bounds(exact_cf, edge_sets[kind])
                s.setdefault("cf_p95_same_le_bucket", []).append(float(lo <= cf <= hi))
                s.setdefault("cf_p95_rel_error", []).append(abs(cf - exact_cf) / exact_cf)
                s.setdefault("cf_p95_error_of_le_width", []).append(abs(cf - exact_cf) / (hi - lo))
    print(f"{args.seeds} seeds, {args.requests} requests per window, {args.resamples} resamples; "
          "early mix on the base engine against the late mix with attention x6")
    print("| figure | bench results (bootstrap) | " + " | ".join(f"histograms, {k}" for k in edge_sets) + " |")
    print("|---|" + "---:|" * len(kinds))
    for key in ("mix_covered", "latency_covered", "mix_width", "latency_width", "verdict_both", "seconds"):
        fmt = "{:.0%}" if key.endswith(("covered", "both")) else "{:.4f}"
        print(f"| {key} | " + " | ".join(fmt.format(np.mean(stats[k][key])) for k in kinds) + " |")
    for key, what in (("cf_p95_same_le_bucket", "counterfactual p95 in the exact one's le bucket"),
                      ("cf_p95_rel_error", "counterfactual p95 relative error, median / max"),
                      ("cf_p95_error_of_le_width", "counterfactual p95 error / le bucket width, max")):
        cells = []
        for k in edge_sets:
            v = np.array(stats[k][key])
            cells.append(f"{v.mean():.0%}" if key == "cf_p95_same_le_bucket" else
                         f"{np.median(v):.1%} / {v.max():.1%}" if key == "cf_p95_rel_error" else f"{v.max():.2f}")
        print(f"| {what} | - | " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main()
