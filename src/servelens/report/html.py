"""The self-contained HTML report: one file, plotly's JS inlined (``include_plotlyjs=True``), so it
opens without network access.

Content: the per-bucket table; TTFT p50/p95/p99 per bucket; ITL p50/p95 per bucket; requests per
bucket; mean cached tokens per bucket; and p95 TTFT per bucket over time when given. With an
all-requests series (:mod:`servelens.report.over_time`) the time charts come as the "without and
with" pair: first the single TTFT p95 of every request beside the same at a reference mix, then the
per-bucket lines; ``marks`` draw labelled vertical lines (the demo's phases). Buckets are in
numeric order everywhere (categorical axes with an explicit category array, legends in bucket order).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import plotly.graph_objects as go

from servelens.core.buckets import label_sort_key
from servelens.core.summary import ALL_LABEL, LOW_COUNT, BucketRow
from servelens.formats.table import HEADERS, row_cells
from servelens.report.over_time import AllRequestsSeries
from servelens.report.sources import TimeSeries

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:12px 0}th,td{border:1px solid #ccc;padding:4px 10px;text-align:right}
th:first-child,td:first-child{text-align:left}tr.all td{font-weight:bold;border-top:2px solid #888}
.note{color:#666;font-size:90%}h2{margin-top:28px}
"""


def bucket_order(rows: Sequence[BucketRow]) -> list[str]:
    """The bucket labels of ``rows`` (without "all") in numeric order."""
    return sorted({r.bucket for r in rows if r.bucket != ALL_LABEL}, key=label_sort_key)


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0


def _bars(
    title: str, y_title: str, labels: list[str], series: list[tuple[str, list[float | None]]]
) -> go.Figure:
    fig = go.Figure()
    for name, ys in series:
        fig.add_trace(go.Bar(name=name, x=labels, y=ys))
    fig.update_layout(title=title, barmode="group", height=420, legend={"traceorder": "normal"},
                      margin={"t": 60, "b": 60})
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=labels,
                     title="input length bucket (tokens)")
    fig.update_yaxes(title=y_title)
    return fig


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _mark(fig: go.Figure, marks: Sequence[tuple[float, str]]) -> None:
    for t, text in marks:
        fig.add_vline(x=_utc(t), line_dash="dot", line_color="#888")
        fig.add_annotation(x=_utc(t), y=1, yref="paper", text=text, showarrow=False, xanchor="left",
                           yanchor="bottom", font={"size": 11})


def overall_figure(series: AllRequestsSeries, marks: Sequence[tuple[float, str]] = ()) -> go.Figure:
    """The "without per-bucket metrics" chart: one TTFT line for every prompt, and the same at the
    reference mix (the line a traffic shift cannot move)."""
    fig = go.Figure()
    x = [_utc(t) for t in series.times_s]
    tag = f"p{series.q * 100:g}"
    fig.add_trace(go.Scatter(name=f"all requests, TTFT {tag}", mode="lines+markers", x=x,
                             y=[_ms(v) for v in series.raw_s], connectgaps=False, line={"width": 3}))
    fig.add_trace(go.Scatter(name=f"at {series.reference}", mode="lines+markers", x=x,
                             y=[_ms(v) for v in series.adjusted_s], connectgaps=False, line={"dash": "dash"},
                             marker={"symbol": ["circle-open" if b else "circle" for b in series.borrowed]},
                             hovertext=["a bucket borrowed from its phase" if b else "" for b in series.borrowed]))
    fig.update_layout(title=f"Without per-bucket metrics: TTFT {tag} of all requests over time, and at the "
                      "reference mix", height=420, legend={"traceorder": "normal"})
    fig.update_xaxes(title="time (UTC)")
    fig.update_yaxes(title=f"TTFT {tag} (ms)")
    _mark(fig, marks)
    return fig


def _figures(
    rows: Sequence[BucketRow],
    timeseries: Sequence[TimeSeries] | None,
    compare_rows: Sequence[BucketRow] | None,
    names: tuple[str, str],
    overall: AllRequestsSeries | None = None,
    marks: Sequence[tuple[float, str]] = (),
) -> list[go.Figure]:
    labels = bucket_order(list(rows) + list(compare_rows or []))
    sets: list[tuple[str, dict[str, BucketRow]]] = [(names[0], {r.bucket: r for r in rows})]
    if compare_rows is not None:
        sets.append((names[1], {r.bucket: r for r in compare_rows}))

    def col(attr: str, scale_ms: bool) -> list[tuple[str, list[float | None]]]:
        out: list[tuple[str, list[float | None]]] = []
        for src, by in sets:
            ys: list[float | None] = []
            for label in labels:
                r = by.get(label)
                v = getattr(r, attr) if r is not None else None
                ys.append(_ms(v) if scale_ms else (None if v is None else float(v)))
            tag = attr.replace("_s", "").replace("ttft_", "").replace("itl_", "")
            name = f"{tag} ({src})" if compare_rows is not None else tag
            out.append((name, ys))
        return out

    def requests(by: dict[str, BucketRow]) -> list[float | None]:
        return [float(by[label].requests) if label in by else None for label in labels]

    figs = [
        _bars("TTFT by input length: p50, p95, p99", "TTFT (ms)", labels,
              col("ttft_p50_s", True) + col("ttft_p95_s", True) + col("ttft_p99_s", True)),
        _bars("ITL by input length: p50, p95", "ITL (ms)", labels,
              col("itl_p50_s", True) + col("itl_p95_s", True)),
        _bars("Requests by input length", "requests", labels,
              [(src if compare_rows is not None else "requests", requests(by)) for src, by in sets]),
        _bars("Mean cached prompt tokens by input length", "tokens", labels,
              [(src if compare_rows is not None else "mean cached tokens",
                [(by[label].mean_cached_tokens if label in by else None) for label in labels])
               for src, by in sets]),
    ]
    if overall is not None:
        figs.append(overall_figure(overall, marks))
    if timeseries:
        fig = go.Figure()
        for ts in sorted(timeseries, key=lambda s: label_sort_key(s.bucket)):
            fig.add_trace(go.Scatter(
                name=ts.bucket, mode="lines+markers", connectgaps=False,
                x=[_utc(t) for t in ts.times_s],
                y=[_ms(v) for v in ts.ttft_p95_s],
            ))
        title = "p95 TTFT by input length over time"
        fig.update_layout(title=f"With per-bucket metrics: {title}" if overall is not None else title, height=420,
                          legend={"traceorder": "normal", "title": {"text": "bucket (tokens)"}})
        fig.update_xaxes(title="time (UTC)")
        fig.update_yaxes(title="TTFT p95 (ms)")
        _mark(fig, marks)
        figs.append(fig)
    return figs


def _table_html(rows: Sequence[BucketRow], caption: str, label_header: str = HEADERS[0]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in (label_header, *HEADERS[1:]))
    body = []
    for r in rows:
        cells = "".join(f"<td>{html.escape(c)}</td>" for c in row_cells(r))
        body.append(f'<tr class="all">{cells}</tr>' if r.bucket == ALL_LABEL else f"<tr>{cells}</tr>")
    return (f"<h2>{html.escape(caption)}</h2><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def render_html(
    rows: Sequence[BucketRow],
    timeseries: Sequence[TimeSeries] | None = None,
    title: str = "servelens report",
    source: str = "",
    compare_rows: Sequence[BucketRow] | None = None,
    names: tuple[str, str] = ("client", "server"),
    overall: AllRequestsSeries | None = None,
    marks: Sequence[tuple[float, str]] = (),
    notes: Sequence[str] = (),
    extra_tables: Sequence[tuple[str, Sequence[BucketRow]]] = (),
    label_header: str = HEADERS[0],
) -> str:
    """The report as one HTML document (string), plotly JS inlined once.

    Args:
        rows: per-bucket rows (any order; shown in numeric bucket order) plus optionally "all".
        timeseries: p95 TTFT per bucket over time (omitted when None or empty).
        title: page title.
        source: a line saying where the figures come from.
        compare_rows: a second set of rows (e.g. the gateway's view) drawn beside ``rows``.
        names: legend names of ``rows`` and ``compare_rows``.
        overall: the all-requests TTFT over time, raw and at a reference mix (first time chart).
        marks: ``(unix time, label)`` vertical lines on the time charts.
        notes: lines shown under the title (e.g. ``servelens explain``'s verdicts).
        extra_tables: more ``(caption, rows)`` tables after the first ones.
        label_header: the bucket column's header of the first table (``Uncached prompt (tokens)`` for rows
            by uncached prompt tokens).
    """
    ordered = sorted(rows, key=lambda r: (r.bucket == ALL_LABEL, label_sort_key(r.bucket)))
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if source:
        parts.append(f"<p class='note'>{html.escape(source)}</p>")
    if notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    exact = all(r.exact for r in rows)
    note = f"* fewer than {LOW_COUNT} requests" + ("" if exact else "; percentiles interpolated from le buckets")
    first = "Per input-length bucket" if label_header == HEADERS[0] else f"Per bucket of {label_header}"
    parts.append(_table_html(ordered, names[0] if compare_rows is not None else first, label_header))
    if compare_rows is not None:
        parts.append(_table_html(
            sorted(compare_rows, key=lambda r: (r.bucket == ALL_LABEL, label_sort_key(r.bucket))), names[1]))
    for caption, extra in extra_tables:
        parts.append(_table_html(sorted(extra, key=lambda r: (r.bucket == ALL_LABEL, label_sort_key(r.bucket))),
                                 caption))
    parts.append(f"<p class='note'>{html.escape(note)}. Generated "
                 f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%S')} UTC.</p>")
    for i, fig in enumerate(_figures(rows, timeseries, compare_rows, names, overall, marks)):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(
    path: str | Path,
    rows: Sequence[BucketRow],
    timeseries: Sequence[TimeSeries] | None = None,
    title: str = "servelens report",
    source: str = "",
    compare_rows: Sequence[BucketRow] | None = None,
    names: tuple[str, str] = ("client", "server"),
    overall: AllRequestsSeries | None = None,
    marks: Sequence[tuple[float, str]] = (),
    notes: Sequence[str] = (),
    extra_tables: Sequence[tuple[str, Sequence[BucketRow]]] = (),
    label_header: str = HEADERS[0],
) -> Path:
    """Write :func:`render_html` to ``path`` (parent folders created). Returns the path.

    Raises OSError when the file cannot be written.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_html(rows, timeseries, title, source, compare_rows, names, overall, marks, notes,
                             extra_tables, label_header), encoding="utf-8")
    return p
