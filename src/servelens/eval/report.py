"""Rendering a :class:`~servelens.eval.compare.Comparison`: a rich table in the shape of the write-up
("Eval | A | B | only A | only B | p | Real difference?", group rows under their eval), JSON, and a
self-contained HTML page (plotly's JS inlined, as :mod:`servelens.report.html`): one dot per run with
the mean marked, per eval; per-group A -> B pairs; axes zoomed to the data and labelled as zoomed.
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
    t = Table(title=f"servelens eval compare: A = {c.dir_a}, B = {c.dir_b} (alpha {c.alpha:g})")
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


def _zoom(values: list[float]) -> list[float]:
    lo, hi = min(values), max(values)
    pad = max(0.005, (hi - lo) * 0.25)
    return [max(0.0, lo - pad), min(1.0, hi + pad)]


def _runs_figure(r: CompareRow) -> go.Figure:
    fig = go.Figure()
    for side, values, mean in (("A", r.runs_a_values, r.accuracy_a), ("B", r.runs_b_values, r.accuracy_b)):
        fig.add_trace(go.Scatter(x=[side] * len(values), y=list(values), mode="markers", name=f"{side}: runs",
                                 marker={"size": 10, "opacity": 0.7}))
        fig.add_trace(go.Scatter(x=[side], y=[mean], mode="markers", name=f"{side}: mean",
                                 marker={"symbol": "line-ew-open", "size": 40, "line": {"width": 3}}))
    fig.update_layout(title=f"{r.suite}: {r.headline}, one dot per run, mean marked "
                            f"({'real difference' if r.real_difference else 'no real difference'})",
                      height=420, width=560)
    fig.update_yaxes(title=f"{r.headline} (zoomed axis, not from 0)",
                     range=_zoom([*r.runs_a_values, *r.runs_b_values]))
    return fig


def _groups_figure(suite: str, rows: list[CompareRow]) -> go.Figure:
    fig = go.Figure()
    names = [r.group or "" for r in rows]
    for r in rows:
        fig.add_trace(go.Scatter(x=[r.accuracy_a, r.accuracy_b], y=[r.group, r.group], mode="lines",
                                 line={"color": "#b33" if r.real_difference else "#999"}, showlegend=False))
    fig.add_trace(go.Scatter(x=[r.accuracy_a for r in rows], y=names, mode="markers", name="A",
                             marker={"size": 10}))
    fig.add_trace(go.Scatter(x=[r.accuracy_b for r in rows], y=names, mode="markers", name="B",
                             marker={"size": 10, "symbol": "diamond"}))
    fig.update_layout(title=f"{suite}: per group, A -> B (red: real difference after Holm)",
                      height=max(320, 40 * len(rows) + 140))
    fig.update_xaxes(title=f"{rows[0].headline} (zoomed axis, not from 0)",
                     range=_zoom([v for r in rows for v in (r.accuracy_a, r.accuracy_b)]))
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=names[::-1])
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
        "tr.eval td{font-weight:bold;border-top:2px solid #888}.note{color:#666;font-size:90%}</style></head><body>",
        f"<h1>servelens eval compare</h1><p class='note'>A = {html.escape(c.dir_a)}, B = {html.escape(c.dir_b)}, "
        f"alpha {c.alpha:g}</p><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>",
        "".join(f"<p class='note'>{html.escape(n)}</p>" for n in c.notes),
    ]
    figs = []
    for r in c.rows:
        if r.group is None:
            figs.append(_runs_figure(r))
            groups = group_rows(c.rows, r.suite)
            if groups:
                figs.append(_groups_figure(r.suite, groups))
    for i, fig in enumerate(figs):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(path: str | Path, c: Comparison) -> Path:
    """Write :func:`render_html` to ``path`` (parent folders created). Raises OSError."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_html(c), encoding="utf-8")
    return p
