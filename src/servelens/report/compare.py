"""``servelens report --results A --compare B``: two bench runs bucket by bucket
(:func:`servelens.core.compare.compare_runs`): per bucket, TTFT and ITL p50/p95/p99 in both runs,
a bootstrap interval on the difference (B minus A; A is the baseline) and a verdict per bucket:
faster, slower, no significant change (or mixed, too few requests). Text tables fit 80 columns;
``--format json`` gives every figure."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from servelens.core.buckets import IslBuckets
from servelens.core.compare import MIXED, BucketComparison, compare_runs
from servelens.core.decompose import DEFAULT_QUANTILES
from servelens.core.windows import SampleWindow
from servelens.report.explain_output import SHORT, WIDTH, Unit, compact_table, jsonable
from servelens.report.explain_windows import from_results

VERDICT = {**SHORT, MIXED: "mixed"}


@dataclass(frozen=True)
class RunComparison:
    """Both runs' per-bucket comparison, per metric (``TTFT``, ``ITL``), numeric bucket order."""

    baseline: str
    candidate: str
    labels: tuple[str, ...]
    metrics: dict[str, tuple[BucketComparison, ...]]
    confidence: float
    resamples: int
    seed: int


def compare_results(
    baseline: str,
    candidate: str,
    buckets: IslBuckets | None = None,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> RunComparison:
    """Compare two bench results files (or folders) bucketed alike (``buckets``, else the runs' own,
    which must agree). Raises ExplainError or ValueError (one line) for bad input."""
    pairs = from_results(baseline, candidate, buckets, values=True)
    metrics = {}
    for m in ("TTFT", "ITL"):
        a, b = pairs.windows[m]
        assert isinstance(a, SampleWindow) and isinstance(b, SampleWindow)  # results files hold samples
        metrics[m] = compare_runs(a, b, DEFAULT_QUANTILES, confidence, resamples, seed)
    return RunComparison(baseline, candidate, pairs.labels, metrics, confidence, resamples, seed)


def quantile_table(metric: str, rows: Sequence[BucketComparison]) -> Table:
    """One metric: per bucket its p50/p95/p99 in both runs, the change and its interval, a verdict."""
    u = Unit([x for b in rows for d in b.quantiles for x in (d.baseline_s, d.candidate_s)])
    t = compact_table(f"{metric} by ISL bucket, candidate against baseline ({u.name})")
    for h, j in (("bucket", "left"), ("", "left"), ("baseline", "right"), ("candidate", "right"),
                 ("change", "right"), ("interval", "right"), ("verdict", "left")):
        t.add_column(h, justify=j, no_wrap=True)  # type: ignore[arg-type]
    for b in rows:
        for k, d in enumerate(b.quantiles):
            t.add_row(b.label if k == 0 else "", f"p{d.q * 100:g}", u.fmt(d.baseline_s), u.fmt(d.candidate_s),
                      u.signed(d.diff_s), u.interval(d.ci_s), VERDICT.get(d.verdict, d.verdict))
        t.add_section()
    return t


def verdict_table(c: RunComparison) -> Table:
    """Per bucket: requests in each run and the bucket's verdict for TTFT and ITL."""
    t = compact_table("verdict per ISL bucket")
    for h, j in (("bucket", "left"), ("requests", "right"), ("TTFT", "left"), ("ITL", "left")):
        t.add_column(h, justify=j, no_wrap=True)  # type: ignore[arg-type]
    for ttft, itl in zip(c.metrics["TTFT"], c.metrics["ITL"], strict=True):
        t.add_row(ttft.label, f"{ttft.requests_baseline:,}→{ttft.requests_candidate:,}",
                  VERDICT.get(ttft.verdict, ttft.verdict), VERDICT.get(itl.verdict, itl.verdict))
    return t


def render_text(c: RunComparison, width: int = WIDTH) -> str:
    """The verdict table, then one quantile table per metric."""
    console = Console(file=io.StringIO(), record=True, width=width, force_terminal=False, color_system=None)
    console.print(f"baseline: {c.baseline}\ncandidate: {c.candidate}", soft_wrap=True, highlight=False)
    console.print()
    for table in (verdict_table(c), *(quantile_table(m, rows) for m, rows in c.metrics.items())):
        console.print(table)
        console.print()
    for line in (f"change: candidate minus baseline; interval: normal bootstrap over requests ({c.resamples} "
                 f"resamples, seed {c.seed}), {c.confidence:.0%} for all quantiles judged together (Bonferroni)",
                 "no change: no significant change; too few: under 5 requests, or under 5 distinct requests "
                 "above the quantile, in a run; no data: no request in either run"):
        console.print(line, soft_wrap=True, highlight=False)
    return console.export_text()


def to_json(c: RunComparison) -> str:
    """Every figure as a field (inf and NaN as null)."""
    doc: dict[str, Any] = {
        "format": "servelens-compare/1", "baseline": c.baseline, "candidate": c.candidate,
        "labels": list(c.labels), "confidence": c.confidence, "resamples": c.resamples, "seed": c.seed,
        "metrics": {m: jsonable(rows) for m, rows in c.metrics.items()},
    }
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"
