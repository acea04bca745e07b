"""Power and false-positive rate of ``servelens eval compare`` against known truth.

Simulated deployments answer eval items from the answer key with a set accuracy
(:mod:`servelens.sim.answers`): deterministic per item and seed, with a fraction ``independence`` of
items drawn per deployment (the rest share one difficulty draw per item, as two quantizations of one
model do). For each of ``--pairs`` simulated pairs (fresh seeds each) on ``--items`` items, compare's
statistics (:func:`servelens.eval.stats.compare_scores`, McNemar exact for single runs) say "real" or
not; the figures are how often, for true accuracies 0.80 vs 0.78 (power) and 0.80 vs 0.80 (false
positives; should be near alpha, McNemar exact is a little conservative).

``--http N`` also runs N pairs end to end (GSM8K items from ``--gsm8k``, the full file, through the
answering endpoint of :mod:`servelens.eval.testing`, ``run_eval`` and ``compare_dirs``) and checks
that each verdict is the one the direct computation gives.

    python benchmarks/eval_power.py --pairs 400 --items 1000 --http 4 --gsm8k ../shared/data/eval/gsm8k/test.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

from servelens.eval.compare import compare_dirs
from servelens.eval.runner import EvalConfig, run_eval
from servelens.eval.stats import compare_scores
from servelens.eval.suites import answer_key, read_text_suite
from servelens.eval.testing import answering_endpoint, key_of
from servelens.sim.answers import AnswerPolicy, answers_right


def policies(acc_a: float, acc_b: float, independence: float, pair: int) -> tuple[AnswerPolicy, AnswerPolicy]:
    """Deployments A and B of pair ``pair``: one shared difficulty seed, own seeds."""
    return (AnswerPolicy(acc_a, seed=2 * pair + 1, shared_seed=10_000 + pair, independence=independence),
            AnswerPolicy(acc_b, seed=2 * pair + 2, shared_seed=10_000 + pair, independence=independence))


def direct(items: list[str], a: AnswerPolicy, b: AnswerPolicy, alpha: float) -> tuple[bool, int, float]:
    """(real?, discordant items, p) of one pair, computed without HTTP."""
    sa = [[float(answers_right(i, a))] for i in items]
    sb = [[float(answers_right(i, b))] for i in items]
    p = compare_scores(sa, sb)
    return p.p_value < alpha, p.only_a + p.only_b, p.p_value


def unpaired_real(items: list[str], a: AnswerPolicy, b: AnswerPolicy, alpha: float) -> bool:
    """The unpaired two-proportion z-test (pooled; what lm-eval's model comparison does) says "real"."""
    n = len(items)
    pa = sum(answers_right(i, a) for i in items) / n
    pb = sum(answers_right(i, b) for i in items) / n
    pooled = (pa + pb) / 2
    se = float(np.sqrt(pooled * (1 - pooled) * 2 / n))
    return bool(se > 0 and 2 * stats.norm.sf(abs(pa - pb) / se) < alpha)


def scenario(items: list[str], acc_a: float, acc_b: float, independence: float, pairs: int,
             alpha: float) -> dict[str, float]:
    """Rate of "real" over ``pairs`` pairs, with the mean discordant count and the observed gap."""
    real, disc, gaps, unpaired = [], [], [], []
    for k in range(pairs):
        a, b = policies(acc_a, acc_b, independence, k)
        r, d, _ = direct(items, a, b, alpha)
        real.append(r)
        unpaired.append(unpaired_real(items, a, b, alpha))
        disc.append(d)
        gaps.append(np.mean([answers_right(i, a) for i in items]) - np.mean([answers_right(i, b) for i in items]))
    rate = float(np.mean(real))
    se = float(np.sqrt(rate * (1 - rate) / pairs))
    return {"rate": rate, "se": se, "discordant": float(np.mean(disc)), "gap": float(np.mean(gaps)),
            "unpaired": float(np.mean(unpaired))}


async def http_pairs(
    gsm8k: Path, n_items: int, pairs: int, independence: float, alpha: float
) -> list[tuple[bool, bool]]:
    """(verdict via HTTP + compare_dirs, verdict computed directly) for ``pairs`` 0.80/0.78 pairs."""
    items = read_text_suite("gsm8k", gsm8k)[:n_items]
    ids = [i.id for i in items]
    out = []
    async with answering_endpoint() as ep:
        ep.key = key_of(answer_key("gsm8k", items))
        for k in range(pairs):
            a, b = policies(0.80, 0.78, independence, k)
            with tempfile.TemporaryDirectory() as tmp:
                for name, pol in (("a", a), ("b", b)):
                    ep.policy = pol
                    await run_eval(EvalConfig(url=ep.url, suite="gsm8k", data=str(gsm8k), limit=n_items,
                                              output_dir=f"{tmp}/{name}", concurrency=16, temperature=0.0))
                row = compare_dirs(f"{tmp}/a", f"{tmp}/b", alpha).rows[0]
            out.append((row.real_difference, direct(ids, a, b, alpha)[0]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--independence", default="0.1,0.2,0.5,1.0", help="comma-separated fractions of own draws")
    ap.add_argument("--http", type=int, default=0, help="pairs to run end to end over HTTP too")
    ap.add_argument("--gsm8k", type=Path, help="the full GSM8K test.jsonl (for --http)")
    args = ap.parse_args()
    items = [f"item/{i}" for i in range(args.items)]
    print(f"{args.pairs} pairs x {args.items} items, alpha {args.alpha}, McNemar exact (one run per side)\n")
    print("| independence | mean discordant items (0.80 vs 0.78) | 'real' for 0.80 vs 0.78 (power) | "
          "'real' for 0.80 vs 0.80 (false positives) | unpaired z-test: power, false positives |")
    print("|---:|---:|---:|---:|---:|")
    t0 = time.perf_counter()
    for ind in (float(x) for x in args.independence.split(",")):
        power = scenario(items, 0.80, 0.78, ind, args.pairs, args.alpha)
        null = scenario(items, 0.80, 0.80, ind, args.pairs, args.alpha)
        print(f"| {ind:g} | {power['discordant']:.0f} | {power['rate']:.3f} ± {power['se']:.3f} | "
              f"{null['rate']:.3f} ± {null['se']:.3f} | {power['unpaired']:.3f}, {null['unpaired']:.3f} |")
    print(f"\n(direct computation: {time.perf_counter() - t0:.1f} s; ± is the binomial SE of the rate)")
    if args.http:
        if args.gsm8k is None:
            raise SystemExit("--http needs --gsm8k PATH (the full file)")
        t0 = time.perf_counter()
        res = asyncio.run(http_pairs(args.gsm8k, args.items, args.http, 0.2, args.alpha))
        same = sum(h == d for h, d in res)
        print(f"end to end over HTTP (independence 0.2): {args.http} pairs, verdicts equal to the direct "
              f"computation in {same}/{args.http}; 'real' in {sum(h for h, _ in res)}; "
              f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
