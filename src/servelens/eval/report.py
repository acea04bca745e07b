"""Rendering a :class:`~servelens.eval.compare.Comparison`: a rich table in the shape of the write-up
("Eval | A | B | only A | only B | p | Real difference?", group rows under their eval), JSON, and a
self-contained HTML page (plotly's JS inlined, as :mod:`servelens.report.html`): per eval, one dot per
run (set apart when equal) with a line at the mean, and per-group arrows from A to B (red when real);
A and B keep one colour each; axes zoomed to the data and labelled ZOOMED. Screenshots at desktop and
laptop widths: ``scripts/eval_compare_screenshots.py``.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from rich.table import Table

from servelens.eval.compare import CompareRow, Comparison, group_rows
from servelens.eval.stats import SPREAD_FACTOR
from servelens.formats.table import whole_words

JSON_FIELDS = ("accuracy_a", "accuracy_b", "only_a", "only_b", "p_value", "real_difference")


def _value(acc: float, sd: float | None) -> str:
    return f"{acc:.3f}" + (f" ± {sd:.3f}" if sd is not None else "")


def _p(p: float) -> str:
    return f"{p:.3g}" if p >= 0.001 else f"{p:.1e}"


def _verdict(r: CompareRow) -> str:
    word = "yes" if r.real_difference else "no"
    if r.p_holm is not None:
        return f"{word} (Holm p {_p(r.p_holm)})"
    return word


def cells(r: CompareRow) -> list[str]:
    """The table cells of one row."""
    p = r.paired
    name = f"  {r.group}" if r.group is not None else f"{r.suite} ({r.headline}, n={p.n})"
    return [name, _value(r.accuracy_a, r.sd_a), _value(r.accuracy_b, r.sd_b), str(p.only_a), str(p.only_b),
            _p(p.p_value), _verdict(r)]


HEADERS = ("Eval", "A", "B", "only A", "only B", "p", "Real difference?")


def rich_table(c: Comparison) -> Table:
    """The comparison as a rich table (:func:`notes` go under it)."""
    t = Table(title=whole_words(f"servelens eval compare: A = {c.dir_a}, B = {c.dir_b} (alpha {c.alpha:g})"))
    for h in HEADERS:
        t.add_column(h, justify="left" if h in ("Eval", "Real difference?") else "right")
    for r in c.rows:
        t.add_row(*cells(r), style="bold" if r.group is None else None)
    return t


def notes(c: Comparison) -> list[str]:
    """The lines printed under the table: the deployments, the tests, intervals and exclusions."""
    lines = list(c.notes)
    lines.append("p: McNemar exact (one run per side) or paired permutation test on per-item means (repeated runs); "
                 f"with runs, 'yes' also needs the gap > {SPREAD_FACTOR:g} x the larger run-to-run SD")
    for r in c.rows:
        if r.group is None:
            p = r.paired
            lines.append(f"{r.suite}: B - A {p.difference:+.3f}, 95 % CI [{p.ci_low:+.3f}, {p.ci_high:+.3f}] "
                         f"({p.test}); {r.excluded} item(s) without a score on a side left out")
    if any(r.p_holm is not None for r in c.rows):
        lines.append("group rows: Holm-adjusted over the groups of their eval (many groups tested at once)")
    return lines


def _json_row(r: CompareRow) -> dict[str, Any]:
    d = asdict(r)
    d |= d.pop("paired")  # one flat object per row: accuracy_a, ..., only_a, only_b, p_value, real_difference
    d["runs_a_values"], d["runs_b_values"] = list(r.runs_a_values), list(r.runs_b_values)
    return d


def to_json(c: Comparison) -> str:
    """The comparison as JSON: per eval its figures (:data:`JSON_FIELDS` and the rest of
    :class:`~servelens.eval.compare.CompareRow`) and its ``groups``."""
    evals = []
    for r in c.rows:
        if r.group is None:
            evals.append(_json_row(r) | {"groups": [_json_row(g) for g in group_rows(c.rows, r.suite)]})
    return json.dumps({"a": c.dir_a, "b": c.dir_b, "alpha": c.alpha, "evals": evals, "notes": list(c.notes)},
                      indent=2)


SIDE_COLORS = {"A": "#1f77b4", "B": "#e07b00"}
"""One colour per side in every plot (A blue, B orange)."""
REAL_COLOR, NOT_REAL_COLOR = "#c62828", "#9e9e9e"
RUNS_WIDTH, GROUPS_WIDTH = 540, 720
"""Plot widths (px): the page sets an eval's two plots side by side, wrapping on a laptop screen."""


def _zoom(values: list[float]) -> list[float]:
    """An axis range around ``values`` (within [0, 1]): padded by a quarter of their span, at least 0.01."""
    lo, hi = min(values), max(values)
    pad = max(0.01, (hi - lo) * 0.25)
    return [max(0.0, lo - pad), min(1.0, hi + pad)]


def _offsets(n: int) -> list[float]:
    """Horizontal offsets of ``n`` run dots around their side's position, so equal values stay apart."""
    return [0.0] if n == 1 else [-0.12 + 0.24 * k / (n - 1) for k in range(n)]


def _runs_figure(r: CompareRow) -> go.Figure:
    fig = go.Figure()
    for x, side, values, mean in ((0, "A", r.runs_a_values, r.accuracy_a), (1, "B", r.runs_b_values, r.accuracy_b)):
        color = SIDE_COLORS[side]
        fig.add_trace(go.Scatter(x=[x + o for o in _offsets(len(values))], y=list(values), mode="markers",
                                 name=f"{side}: {len(values)} run(s)", marker={"size": 11, "color": color},
                                 hovertemplate=[f"{side} run {k}: %{{y:.3f}}<extra></extra>"
                                                for k in range(len(values))]))
        fig.add_trace(go.Scatter(x=[x - 0.25, x + 0.25], y=[mean, mean], mode="lines",
                                 name=f"{side}: mean {mean:.3f}", line={"color": color, "width": 3},
                                 hovertemplate=f"{side} mean: {mean:.3f}<extra></extra>"))
    verdict = "real difference" if r.real_difference else "no real difference"
    fig.update_layout(title=f"{r.suite}: {r.headline}, one dot per run, line = mean ({verdict})",
                      height=420, width=RUNS_WIDTH, margin={"l": 70, "r": 20})
    fig.update_xaxes(tickvals=[0, 1], ticktext=["A", "B"], range=[-0.5, 1.5], showgrid=False)
    fig.update_yaxes(title=f"{r.headline}: ZOOMED axis, not from 0",
                     range=_zoom([*r.runs_a_values, *r.runs_b_values]))
    return fig


def _groups_figure(suite: str, rows: list[CompareRow]) -> go.Figure:
    fig = go.Figure()
    ys = list(range(len(rows)))[::-1]  # the first group on top
    for y, r in zip(ys, rows, strict=True):
        if r.accuracy_a != r.accuracy_b:
            fig.add_annotation(x=r.accuracy_b, y=y, ax=r.accuracy_a, ay=y, xref="x", yref="y", axref="x", ayref="y",
                               showarrow=True, arrowhead=2, arrowsize=1.2, arrowwidth=2, text="",
                               arrowcolor=REAL_COLOR if r.real_difference else NOT_REAL_COLOR)
    for side, values, symbol in (("A", [r.accuracy_a for r in rows], "circle"),
                                 ("B", [r.accuracy_b for r in rows], "diamond")):
        fig.add_trace(go.Scatter(x=values, y=ys, mode="markers", name=side, text=[r.group for r in rows],
                                 marker={"size": 11, "symbol": symbol, "color": SIDE_COLORS[side]},
                                 hovertemplate=f"%{{text}} {side}: %{{x:.3f}}<extra></extra>"))
    fig.update_layout(title=f"{suite}: per group, arrow from A to B (red: real difference after Holm)",
                      height=max(320, 40 * len(rows) + 140), width=GROUPS_WIDTH, margin={"l": 170, "r": 20})
    fig.update_xaxes(title=f"{rows[0].headline}: ZOOMED axis, not from 0",
                     range=_zoom([v for r in rows for v in (r.accuracy_a, r.accuracy_b)]))
    fig.update_yaxes(tickvals=ys, ticktext=[r.group or "" for r in rows], range=[-0.6, len(rows) - 0.4],
                     showgrid=False)
    return fig


def render_html(c: Comparison) -> str:
    """The page: the table, then per eval its run dots and its group pairs."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
    body = "".join(
        ("<tr class='eval'>" if r.group is None else "<tr>") + "".join(f"<td>{html.escape(x)}</td>" for x in cells(r))
        + "</tr>" for r in c.rows)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>servelens eval compare</title><style>"
        "body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse}"
        "th,td{border:1px solid #ccc;padding:4px 10px;text-align:right}td:first-child{text-align:left}"
        "tr.eval td{font-weight:bold;border-top:2px solid #888}.note{color:#666;font-size:90%}"
        ".plots{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}</style></head><body>",
        f"<h1>servelens eval compare</h1><p class='note'>A = {html.escape(c.dir_a)}, B = {html.escape(c.dir_b)}, "
        f"alpha {c.alpha:g}</p><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>",
        "".join(f"<p class='note'>{html.escape(n)}</p>" for n in c.notes),
    ]
    first = True
    for r in c.rows:
        if r.group is None:
            figs = [_runs_figure(r)]
            groups = group_rows(c.rows, r.suite)
            if groups:
                figs.append(_groups_figure(r.suite, groups))
            parts.append(f"<h2>{html.escape(r.suite)}</h2><div class='plots'>")
            for fig in figs:
                parts.append(fig.to_html(full_html=False, include_plotlyjs=first))
                first = False
            parts.append("</div>")
    parts.append("<p class='note'>Accuracy axes are zoomed to the data (not from 0), so small gaps look large: "
                 "read the numbers and the verdicts in the table.</p></body></html>")
    return "\n".join(parts)


def write_html(path: str | Path, c: Comparison) -> Path:
    """Write :func:`render_html` to ``path`` (parent folders created). Raises OSError."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_html(c), encoding="utf-8")
    return p
