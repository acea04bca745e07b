"""What ``servelens explain`` prints: the one-line verdicts first, then per metric the all-requests
figures (with the counterfactual at the earlier mix), the split of the mean's change, the per-bucket
table in numeric order and the buckets whose latency changed, ranked by contribution; then the SLO
attainment when asked. Every table fits 80 columns with no cell wrapped (a unit per table, in its
headers). ``--format json`` gives every figure as a field (:func:`to_json`).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from servelens.core.compare import NO_DATA_RUNS, ONLY_BASELINE, ONLY_CANDIDATE
from servelens.core.decompose import (
    FASTER,
    NO_DATA,
    ONLY_AFTER,
    ONLY_BEFORE,
    SLOWER,
    TOO_FEW,
    UNCHANGED,
    BucketChange,
    Counterfactual,
    Explanation,
)
from servelens.core.slo import Attainment, AttainmentBounds
from servelens.core.verdict import le_span
from servelens.formats.slo_table import (
    attainment_caption,
    attainment_dicts,
    attainment_table,
    bounds_caption,
    bounds_table,
    slo_dict,
)
from servelens.formats.table import ONE_LE_BUCKET_MARK
from servelens.report.explain import ExplainReport, MetricResult

WIDTH = 80
"""Columns the text output is laid out for."""

SHORT = {SLOWER: "slower", FASTER: "faster", UNCHANGED: "no change", TOO_FEW: "too few",
         ONLY_BEFORE: "earlier only", ONLY_AFTER: "later only", NO_DATA: "no data",
         ONLY_BASELINE: "baseline only", ONLY_CANDIDATE: "candidate only", NO_DATA_RUNS: "no data"}
"""The per-bucket change as the table shows it (``no change``: no significant change)."""


def _num(x: float) -> str:
    """Three significant digits (at least), at most three decimals, never in exponent form:
    ``1390``, ``41.2``, ``6.55``, ``0.011``."""
    a = abs(x)
    decimals = 0 if a >= 100 else 1 if a >= 10 else 2 if a >= 1 else 3
    return f"{x:.{decimals}f}"


class Unit:
    """One time unit for a table: ms while every figure is under 10 s (at most five digits, and
    short figures keep theirs), else seconds."""

    def __init__(self, values: Iterable[float | None]) -> None:
        top = max((abs(v) for v in values if v is not None and math.isfinite(v)), default=0.0)
        self.name, self.scale = ("s", 1.0) if top >= 10 else ("ms", 1000.0)

    def fmt(self, x: float | None) -> str:
        """``x`` in this unit; ``-`` for None, ``inf`` for an unbounded value."""
        if x is None or math.isnan(x):
            return "-"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return _num(x * self.scale)

    def signed(self, x: float | None) -> str:
        """With a sign (``+0.52``)."""
        text = self.fmt(x)
        return text if text in ("-", "inf", "-inf") or text.startswith("-") else "+" + text

    def pair(self, a: float | None, b: float | None) -> str:
        """``earlier→later``."""
        return f"{self.fmt(a)}→{self.fmt(b)}"

    def interval(self, ci: tuple[float, float] | None) -> str:
        """``low…high`` (``-`` when undefined)."""
        if ci is None or any(math.isnan(c) for c in ci):
            return "-"
        return f"{self.signed(ci[0])}…{self.signed(ci[1])}"


def compact_table(title: str, caption: str | None = None) -> Table:
    """A table in this output's compact style: no outer border, one rule under the header."""
    t = Table(title=title, caption=caption, caption_justify="left")
    _restyle(t)
    return t


def _restyle(t: Table) -> None:
    """A table built elsewhere in this module's compact style."""
    t.box, t.show_edge, t.pad_edge, t.collapse_padding = box.SIMPLE_HEAD, False, False, True
    t.title_justify = "left"


def _unit(e: Explanation) -> Unit:
    vals: list[float | None] = [e.mean_before_s, e.mean_after_s]
    for s in e.quantiles:
        vals += [s.before_s, s.after_s]
    return Unit(vals)


def _mark(text: str, one_bucket: bool) -> str:
    """A quantile cell, prefixed :data:`~servelens.formats.table.ONE_LE_BUCKET_MARK` when it is an
    interpolation inside the one ``le`` bucket that holds every observation (not a measurement)."""
    return ONE_LE_BUCKET_MARK + text if one_bucket and text != "-" else text


def overview_table(r: MetricResult) -> Table:
    """All requests: mean and quantiles in both windows, and the later window at the earlier mix; a
    quantile interpolated inside the one ``le`` bucket holding every observation is marked ``~``."""
    e = r.explanation
    assert e is not None
    u = _unit(e)
    t = compact_table(f"{e.metric}, all requests ({u.name})")
    for h in ("", "earlier", "later", "at earlier mix", "change"):
        t.add_column(h, justify="left" if not h else "right", no_wrap=True)
    t.add_row("mean", u.fmt(e.mean_before_s), u.fmt(e.mean_after_s), u.fmt(e.counterfactual_mean_s),
              u.signed(e.mean_after_s - e.mean_before_s))
    a, b, c = (x is not None for x in (e.le_range_before_s, e.le_range_after_s, e.le_range_counterfactual_s))
    for s in e.quantiles:
        change = None if s.before_s is None or s.after_s is None else s.after_s - s.before_s
        t.add_row(f"p{s.q * 100:g}", _mark(u.fmt(s.before_s), a), _mark(u.fmt(s.after_s), b),
                  _mark(u.fmt(s.counterfactual_s), c), _mark(u.signed(change), a or b))
    return t


def one_bucket_lines(e: Explanation) -> list[str]:
    """The footnote for ``~`` cells, one line per metric (none when nothing is marked): which windows
    and buckets held every observation in one ``le`` bucket, and that their quantiles are not measured."""
    held: dict[tuple[float, float], dict[str, list[str]]] = {}  # le bucket -> row -> windows
    rows: list[tuple[str, tuple[tuple[str, tuple[float, float] | None], ...]]] = [
        ("all requests", (("earlier", e.le_range_before_s), ("later", e.le_range_after_s),
                          ("at the earlier mix", e.le_range_counterfactual_s)))]
    rows += [(b.label, (("earlier", b.le_range_before_s), ("later", b.le_range_after_s))) for b in e.buckets]
    for label, windows in rows:
        for window, r in windows:
            if r is not None:
                held.setdefault(r, {}).setdefault(label, []).append(window)
    if not held:
        return []
    groups = []
    for r, by_row in held.items():
        named = [label if {"earlier", "later"} <= set(windows) else f"{label} ({', '.join(windows)})"
                 for label, windows in by_row.items()]
        groups.append(f"{le_span(r)}: {', '.join(named)}")
    return [f"{ONE_LE_BUCKET_MARK} every {e.metric} of a row in one le bucket ({'; '.join(groups)}): its "
            "percentiles are interpolated inside it, not measured; only the range is known (means are exact)"]


def split_table(e: Explanation) -> Table:
    """The mean's change split into the mix and the latency effect, with intervals and the verdict."""
    u = Unit([e.mix_effect_s, e.latency_effect_s, e.mean_after_s - e.mean_before_s])
    t = compact_table(f"{e.metric} mean change, split ({u.name})",
               caption=f"verdict: {e.verdict}; {e.confidence:.0%} intervals")
    for h, j in (("", "left"), ("effect", "right"), ("interval", "right")):
        t.add_column(h, justify=j, no_wrap=True)  # type: ignore[arg-type]
    t.add_row("mix (bucket shares)", u.signed(e.mix_effect_s), u.interval(e.mix_effect_ci_s))
    t.add_row("latency (within buckets)", u.signed(e.latency_effect_s), u.interval(e.latency_effect_ci_s))
    t.add_row("total", u.signed(e.mean_after_s - e.mean_before_s), "")
    return t


def _count(x: float) -> str:
    """A count in at most five characters: ``9,999``, ``12.3k``, ``1.23M``."""
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if x >= 10 * div or (suffix == "M" and x >= div):
            return _num(x / div) + suffix
    return f"{x:,.0f}"


def bucket_table(e: Explanation, q: float) -> Table:
    """Per bucket in numeric order: observations, share, mean and the ``q`` quantile in both
    windows, and whether its own latency changed."""
    qi = next(i for i, s in enumerate(e.quantiles) if math.isclose(s.q, q))
    vals: list[float | None] = []
    for b in e.buckets:
        vals += [b.mean_before_s, b.mean_after_s, b.quantiles_before_s[qi], b.quantiles_after_s[qi]]
    u = Unit(vals)
    what = "tokens" if e.metric == "ITL" else "requests"
    t = compact_table(f"{e.metric} by ISL bucket, earlier→later ({u.name})")
    for h, j in (("bucket", "left"), (what, "right"), ("share", "right"), ("mean", "right"),
                 (f"p{q * 100:g}", "right"), ("latency", "left")):
        t.add_column(h, justify=j, no_wrap=True)  # type: ignore[arg-type]
    for b in e.buckets:
        quantile = (f"{_mark(u.fmt(b.quantiles_before_s[qi]), b.le_range_before_s is not None)}→"
                    f"{_mark(u.fmt(b.quantiles_after_s[qi]), b.le_range_after_s is not None)}")
        t.add_row(b.label, f"{_count(b.count_before)}→{_count(b.count_after)}",
                  f"{b.share_before * 100:.0f}→{b.share_after * 100:.0f}%",
                  u.pair(b.mean_before_s, b.mean_after_s), quantile, SHORT.get(b.change, b.change))
    return t


def ranked_table(e: Explanation) -> Table | None:
    """The buckets whose own latency changed significantly, largest contribution first (None if none)."""
    ranked = e.ranked()
    if not ranked:
        return None
    u = Unit([x for b in ranked for x in (b.latency_effect_s, *(b.mean_change_ci_s or ()))])
    t = compact_table(f"{e.metric}: buckets whose latency changed, largest contribution first ({u.name})",
               caption="latency effect: the later share x the bucket's mean change")
    for h, j in (("#", "right"), ("bucket", "left"), ("latency effect", "right"), ("interval", "right"),
                 ("mean change", "right"), ("interval", "right")):
        t.add_column(h, justify=j, no_wrap=True)  # type: ignore[arg-type]
    for i, b in enumerate(ranked, 1):
        change = _change(b)
        t.add_row(str(i), b.label, u.signed(b.latency_effect_s), u.interval(b.latency_effect_ci_s),
                  u.signed(change), u.interval(b.mean_change_ci_s))
    return t


def _change(b: BucketChange) -> float | None:
    if b.mean_before_s is None or b.mean_after_s is None:
        return None
    return b.mean_after_s - b.mean_before_s


def reference_table(r: MetricResult) -> Table | None:
    """Both windows at the reference mix (the mix-adjusted figures), when one was given."""
    ref, e = r.reference, r.explanation
    if ref is None or e is None:
        return None
    u = _unit(e)
    t = compact_table(f"{e.metric} at the reference mix ({u.name})")
    for h in ("", "earlier", "later", "change"):
        t.add_column(h, justify="left" if not h else "right", no_wrap=True)
    t.add_row("mean", u.fmt(ref.before.mean_s), u.fmt(ref.after.mean_s), u.signed(ref.after.mean_s - ref.before.mean_s))
    for q, a, b in zip(ref.before.quantiles, ref.before.quantiles_s, ref.after.quantiles_s, strict=True):
        t.add_row(f"p{q * 100:g}", u.fmt(a), u.fmt(b), u.signed(None if a is None or b is None else b - a))
    return t


def _print(console: Console, *items: Table | str | None) -> None:
    for item in items:
        if item is not None:
            console.print(item)
            console.print()


def _window_line(name: str, desc: str, length: float | None, e: Explanation | None) -> str:
    n = f", {e.count_before if name == 'earlier' else e.count_after:,.0f} requests with a TTFT" if e else ""
    return f"{name}: {desc}{n}" + (f", {length:.1f} s" if length else "")


def render_text(report: ExplainReport, headline: float = 0.95, width: int = WIDTH) -> str:
    """The text output (module docstring)."""
    console = Console(file=io.StringIO(), record=True, width=width, force_terminal=False, color_system=None)
    for r in report.metrics:
        console.print(r.verdict_line, soft_wrap=True, highlight=False)
    ttft = next((r.explanation for r in report.metrics if r.metric == "TTFT"), None)
    console.print()
    for name, desc, length in (("earlier", report.before_desc, report.before_s),
                               ("later", report.after_desc, report.after_s)):
        console.print(_window_line(name, desc, length, ttft), soft_wrap=True, highlight=False)
    for r in report.metrics:
        e = r.explanation
        if e is None:
            continue
        console.print()
        console.rule(e.metric, align="left")
        _print(console, overview_table(r), split_table(e), reference_table(r), bucket_table(e, headline),
               ranked_table(e) or f"{e.metric}: no bucket's latency changed significantly")
        for note in (*one_bucket_lines(e), *(f"note: {n}" for n in e.limitations)):
            console.print(note, soft_wrap=True, highlight=False)
        console.print(f"uncertainty: {e.uncertainty}", soft_wrap=True, highlight=False)
    if report.slo is not None:
        console.print()
        console.rule("SLO attainment", align="left")
        s = report.slo
        for name, rows in (("earlier", s.before), ("later", s.after)):
            if s.exact:
                table = attainment_table([r for r in rows if isinstance(r, Attainment)], s.slo, f"{name} window",
                                         caption=False)
            else:
                table = bounds_table([r for r in rows if isinstance(r, AttainmentBounds)], s.slo,
                                     f"{name} window", caption=False)
            _restyle(table)
            _print(console, table)
        for line in (attainment_caption(s.slo) if s.exact else bounds_caption(s.slo), *s.notes):
            console.print(line, soft_wrap=True, highlight=False)
    return console.export_text()


# ---------------------------------------------------------------- JSON


def jsonable(x: Any) -> Any:
    """Dataclasses as dicts, tuples as lists, NaN and infinities as None (JSON has neither)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (np.floating, np.integer)):
        return jsonable(x.item())
    if is_dataclass(x) and not isinstance(x, type):
        return {f.name: jsonable(getattr(x, f.name)) for f in fields(x) if f.name != "histogram"}
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def _counterfactual(cf: Counterfactual) -> dict[str, Any]:
    return {"mix": dict(zip(cf.mix.labels, cf.mix.shares, strict=True)), "mean_s": jsonable(cf.mean_s),
            "quantiles": [{"q": q, "value_s": jsonable(v)} for q, v in zip(cf.quantiles, cf.quantiles_s, strict=True)]}


def metric_dict(r: MetricResult) -> dict[str, Any]:
    """One metric as JSON data: every field of its explanation, plus ``verdict_line``,
    ``counterfactual`` (the later window at the earlier mix), ``ranked`` (labels of the changed
    buckets, largest contribution first) and ``at_reference`` when a reference mix was given."""
    e = r.explanation
    if e is None:
        return {"metric": r.metric, "skipped": r.skipped, "verdict_line": r.verdict_line}
    out: dict[str, Any] = jsonable(e)
    out["verdict_line"] = r.verdict_line
    out["counterfactual"] = {
        "description": "the later window's per-bucket latency at the earlier window's bucket mix",
        "mean_s": jsonable(e.counterfactual_mean_s),
        "quantiles": [{"q": s.q, "value_s": jsonable(s.counterfactual_s)} for s in e.quantiles],
    }
    out["ranked"] = [b.label for b in e.ranked()]
    if r.reference is not None:
        out["at_reference"] = {"before": _counterfactual(r.reference.before),
                               "after": _counterfactual(r.reference.after)}
    return out


def to_json(report: ExplainReport) -> str:
    """The whole report as one JSON document (``allow_nan=False``: no NaN or Infinity tokens)."""
    doc: dict[str, Any] = {
        "format": "servelens-explain/1",
        "labels": list(report.labels),
        "exact": report.exact,
        "before": {"source": report.before_desc, "duration_s": jsonable(report.before_s)},
        "after": {"source": report.after_desc, "duration_s": jsonable(report.after_s)},
        "metrics": {r.metric: metric_dict(r) for r in report.metrics},
    }
    if report.slo is not None:
        s = report.slo
        doc["slo"] = {"slo": slo_dict(s.slo), "exact": s.exact, "notes": list(s.notes),
                      "before": jsonable(attainment_dicts(s.before)), "after": jsonable(attainment_dicts(s.after))}
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def table_widths(tables: Sequence[Table]) -> list[int]:
    """The rendered width of each table (for checks that the output fits)."""
    out = []
    for t in tables:
        buf = io.StringIO()
        Console(file=buf, width=1000, force_terminal=False, color_system=None).print(t)
        out.append(max(len(line) for line in buf.getvalue().splitlines()))
    return out
