"""The self-contained HTML report: one file, plotly's JS inlined (``include_plotlyjs=True``), so it
opens without network access.

Content: the per-bucket tables, each with the footnotes its rows call for (``*`` only when a row is
starred, ``~`` only when a row's TTFTs all fell in one ``le`` bucket); TTFT p50/p95/p99 per bucket;
ITL p50/p95 per bucket; requests per bucket; mean cached tokens per bucket (a line instead when
nothing was cached); and p95 TTFT per bucket over time when given. With an all-requests series
(:mod:`servelens.report.over_time`) the time charts come as the "without and with" pair: first the
single TTFT p95 of every request beside the same at a reference mix, then the per-bucket lines;
``marks`` draw labelled vertical lines (the demo's phases). Each chart has a note under it saying
whose data it is and how a point is made.

Colours have one meaning in every chart (:mod:`servelens.report.palette`): a percentile's hue is the
same for every source of a comparison (the second lighter and hatched, a third cross-hatched), buckets
have their own cool hues (and marker shapes), all requests are black, counts grey. Buckets are in numeric order
everywhere (categorical axes with an explicit category array, legends in bucket order).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import plotly.graph_objects as go

from servelens.core.buckets import label_sort_key
from servelens.core.summary import ALL_LABEL, LOW_COUNT, BucketRow
from servelens.formats.table import (
    HEADERS,
    ONE_LE_BUCKET_MARK,
    interpolated_note,
    low_count_note,
    one_bucket_note,
    row_cells,
    unbucketed_note,
)
from servelens.report import palette
from servelens.report.over_time import AllRequestsSeries
from servelens.report.sources import TimeSeries

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:12px 0;font-size:14px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}td{white-space:nowrap}
th:first-child,td:first-child{text-align:left}tr.all td{font-weight:bold;border-top:2px solid #888}
.note{color:#555;font-size:90%;max-width:1100px}h2{margin-top:28px}.chart{margin-top:24px}
.chart .note{margin:2px 0 0 0}.table{overflow-x:auto}
"""

_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "triangle-down", "pentagon", "hexagon", "star")
"""Marker shapes of the bucket lines, in bucket order: neighbouring buckets, close in colour, differ in shape."""

_LEGEND_TOP = {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0,
               "traceorder": "normal"}


def bucket_order(rows: Sequence[BucketRow]) -> list[str]:
    """The bucket labels of ``rows`` (without "all") in numeric order."""
    return sorted({r.bucket for r in rows if r.bucket != ALL_LABEL}, key=label_sort_key)


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0


@dataclass(frozen=True)
class _BarSet:
    """One bar trace: its legend name and group, values, colour, which source it is (0: the first, solid;
    1, 2, ...: :data:`~servelens.report.palette.SOURCE_STYLES`), and per-bar marks (text over the bar)
    with their hover lines."""

    name: str
    group: str
    ys: list[float | None]
    colour: str
    source: int = 0
    marks: list[str] | None = None
    hover: list[str] | None = None


def _bars(title: str, y_title: str, labels: list[str], sets: list[_BarSet]) -> go.Figure:
    fig = go.Figure()
    for b in sets:
        marker: dict[str, object] = {"color": b.colour, "line": {"color": b.colour, "width": 1}}
        if b.source:
            amount, shape = palette.SOURCE_STYLES[b.source % len(palette.SOURCE_STYLES)]
            marker = {"color": palette.lighter(b.colour, amount), "line": {"color": b.colour, "width": 1},
                      "pattern": {"shape": shape, "fgcolor": b.colour, "solidity": 0.25}}
        fig.add_trace(go.Bar(
            name=b.name, legendgroup=b.group, x=labels, y=b.ys, marker=marker,
            text=b.marks, textposition="outside", cliponaxis=False,
            customdata=b.hover or [""] * len(labels),
            hovertemplate="%{x}: %{y:.4~g}<br>%{customdata}<extra>" + html.escape(b.name) + "</extra>",
        ))
    fig.update_layout(title={"text": title, "y": 0.98, "yanchor": "top"}, barmode="group", height=440,
                      legend=_LEGEND_TOP, margin={"t": 100, "b": 60, "l": 70, "r": 20}, bargroupgap=0.08)
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=labels,
                     title="input length bucket (tokens)")
    fig.update_yaxes(title=y_title, rangemode="tozero")
    return fig


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _mark(fig: go.Figure, marks: Sequence[tuple[float, str]]) -> None:
    for t, text in marks:
        fig.add_vline(x=_utc(t), line_dash="dot", line_color="#888")
        fig.add_annotation(x=_utc(t), y=1, yref="paper", text=text, showarrow=False, xanchor="left",
                           yanchor="top", font={"size": 11}, bgcolor="rgba(255,255,255,0.7)")


def _time_layout(fig: go.Figure, title: str, y_title: str, legend_title: str = "") -> None:
    legend = dict(_LEGEND_TOP)
    if legend_title:
        legend["title"] = {"text": legend_title}
    fig.update_layout(title={"text": title, "y": 0.98, "yanchor": "top"}, height=460, legend=legend,
                      margin={"t": 110, "b": 60, "l": 70, "r": 20})
    fig.update_xaxes(title="time (UTC)")
    fig.update_yaxes(title=y_title, rangemode="tozero")


def overall_figure(series: AllRequestsSeries, marks: Sequence[tuple[float, str]] = ()) -> go.Figure:
    """The "without per-bucket metrics" chart: one TTFT line for every prompt (all requests'
    colour, solid), and the same at the reference mix (dashed; the line a traffic shift cannot
    move). A None point (between segments) breaks both lines."""
    fig = go.Figure()
    x = [_utc(t) for t in series.times_s]
    tag = f"p{series.q * 100:g}"
    fig.add_trace(go.Scatter(name=f"all requests, TTFT {tag}", mode="lines+markers", x=x,
                             y=[_ms(v) for v in series.raw_s], connectgaps=False,
                             line={"width": 3, "color": palette.ALL_REQUESTS}))
    fig.add_trace(go.Scatter(name=f"at {series.reference}", mode="lines+markers", x=x,
                             y=[_ms(v) for v in series.adjusted_s], connectgaps=False,
                             line={"dash": "dash", "color": palette.ALL_REQUESTS},
                             marker={"symbol": ["circle-open" if b else "circle" for b in series.borrowed]},
                             hovertext=["a bucket borrowed from its phase" if b else "" for b in series.borrowed]))
    _time_layout(fig, f"Without per-bucket metrics: TTFT {tag} of all requests over time, and at the reference mix",
                 f"TTFT {tag} (ms)")
    _mark(fig, marks)
    return fig


def _over_time_figure(timeseries: Sequence[TimeSeries], labels: Sequence[str], with_overall: bool,
                      marks: Sequence[tuple[float, str]]) -> tuple[go.Figure, str]:
    """p95 TTFT per bucket over time, one colour per bucket, and its note. Several series of one
    bucket (segments, e.g. the demo's phases) share its colour and legend entry; a line breaks
    between them. Inside a series, points without data are skipped and the line joins the points
    either side; a point of fewer than LOW_COUNT requests is hollow."""
    ordered = sorted(timeseries, key=lambda s: label_sort_key(s.bucket))
    colours = palette.bucket_colours(sorted({*labels, *(s.bucket for s in ordered)}, key=label_sort_key))
    symbols = {label: _SYMBOLS[i % len(_SYMBOLS)] for i, label in enumerate(colours)}
    fig = go.Figure()
    shown: set[str] = set()
    hollow = False
    for ts in ordered:
        pts = [(t, v, ts.counts[i] if ts.counts else None)
               for i, (t, v) in enumerate(zip(ts.times_s, ts.ttft_p95_s, strict=True)) if v is not None]
        if not pts:
            continue
        few = [n is not None and n < LOW_COUNT for _, _, n in pts]
        hollow = hollow or any(few)
        fig.add_trace(go.Scatter(
            name=ts.bucket, legendgroup=ts.bucket, showlegend=ts.bucket not in shown, mode="lines+markers",
            x=[_utc(t) for t, _, _ in pts], y=[_ms(v) for _, v, _ in pts],
            line={"color": colours[ts.bucket], "width": 2},
            marker={"color": colours[ts.bucket], "size": 7,
                    "symbol": [symbols[ts.bucket] + ("-open" if f else "") for f in few], "line": {"width": 2}},
            customdata=["" if n is None else f"{n} request{'s' if n != 1 else ''}" for _, _, n in pts],
            hovertemplate="%{x}<br>p95 %{y:.4~g} ms<br>%{customdata}<extra>" + ts.bucket + "</extra>",
        ))
        shown.add(ts.bucket)
    origins = sorted({s.origin for s in ordered if s.origin})
    methods = sorted({s.method for s in ordered if s.method})
    widths = sorted({s.window_s for s in ordered if s.window_s is not None})
    title = "p95 TTFT by input length over time" + (f" ({', '.join(origins)} data)" if origins else "")
    _time_layout(fig, f"With per-bucket metrics: {title}" if with_overall else title, "TTFT p95 (ms)",
                 "bucket (tokens)")
    _mark(fig, marks)
    note = ("Each point: " + "; ".join(methods)) if methods else ""
    if widths:
        close = widths[-1] - widths[0] < 0.05 * widths[0]
        span = f"{sum(widths) / len(widths):.2g} s" if close else f"{widths[0]:.2g}-{widths[-1]:.2g} s"
        note += f" (windows of {span})"
    note += (". Windows without a request of a bucket have no point: the line joins the windows either side; "
             "no smoothing." if widths else ". Where there is no data the line joins the points either side.")
    note = note.removeprefix(". ")
    if hollow:
        note += (f" Hollow points rest on fewer than {LOW_COUNT} requests: a p95 of so few is close to their "
                 "largest value.")
    return fig, note.strip()


def _figures(
    rows: Sequence[BucketRow],
    timeseries: Sequence[TimeSeries] | None,
    compare_rows: Sequence[BucketRow] | None,
    names: tuple[str, str],
    overall: AllRequestsSeries | None = None,
    marks: Sequence[tuple[float, str]] = (),
    extra: Sequence[tuple[str, Sequence[BucketRow]]] = (),
) -> list[tuple[go.Figure | None, str]]:
    """The charts in page order, each with its note (plain text, may be empty; a chart of None: only
    the note, saying why there is no chart). The bar charts draw every set of rows given: ``rows``,
    ``compare_rows`` and each of ``extra`` (the extra tables: the demo's third phase), in that order."""
    sets: list[tuple[str, dict[str, BucketRow]]] = [(names[0], {r.bucket: r for r in rows})]
    if compare_rows is not None:
        sets.append((names[1], {r.bucket: r for r in compare_rows}))
    sets += [(caption, {r.bucket: r for r in more}) for caption, more in extra]
    labels = bucket_order([r for _, by in sets for r in by.values()])
    two = len(sets) > 1
    words = palette.SOURCE_WORDS
    pair_note = ("; ".join(f"{words[i % len(words)].capitalize() if i == 0 else words[i % len(words)]}: {src}"
                           for i, (src, _) in enumerate(sets)) + ".") if two else ""

    def pct(attr: str) -> list[_BarSet]:
        tag = attr.split("_")[1]  # ttft_p95_s -> p95
        out = []
        for i, (src, by) in enumerate(sets):
            ys = [_ms(getattr(by[label], attr)) if label in by else None for label in labels]
            ttft = attr.startswith("ttft")
            ranges = [by[label].ttft_le_range_s if (ttft and label in by) else None for label in labels]
            marks_ = [ONE_LE_BUCKET_MARK if r is not None and y is not None else "" for r, y in zip(ranges, ys,
                                                                                                    strict=True)]
            hover = [f"interpolated inside the le bucket {r[0] * 1000:.4g}-{r[1] * 1000:.4g} ms that holds every "
                     "TTFT of this bucket" if r is not None else "" for r in ranges]
            out.append(_BarSet(f"{tag} ({src})" if two else tag, tag, ys, palette.PERCENTILE[tag], source=i,
                               marks=marks_ if any(marks_) else None, hover=hover))
        return out

    def count_sets(attr: str, name: str) -> list[_BarSet]:
        out = []
        for i, (src, by) in enumerate(sets):
            ys: list[float | None] = []
            for label in labels:
                v = getattr(by[label], attr) if label in by else None
                ys.append(None if v is None else float(v))
            out.append(_BarSet(src if two else name, src, ys, palette.COUNT, source=i))
        return out

    ttft_sets = [b for attr in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s") for b in pct(attr)]
    one_bucket = any(b.marks for b in ttft_sets)
    ttft_note = pair_note + (f" {ONE_LE_BUCKET_MARK} over a bar: every TTFT of that bucket fell in one le bucket of "
                             "the histogram, so its p50/p95/p99 are interpolations inside it (hover for the range), "
                             "not measurements." if one_bucket else "")
    figs: list[tuple[go.Figure | None, str]] = [
        (_bars("TTFT by input length: p50, p95, p99", "TTFT (ms)", labels, ttft_sets), ttft_note.strip()),
        (_bars("ITL by input length: p50, p95", "ITL (ms)", labels,
               [b for attr in ("itl_p50_s", "itl_p95_s") for b in pct(attr)]), pair_note),
        (_bars("Requests by input length", "requests", labels, count_sets("requests", "requests")), pair_note),
    ]
    cached = count_sets("mean_cached_tokens", "mean cached tokens")
    if any(y for b in cached for y in b.ys):
        figs.append((_bars("Mean cached prompt tokens by input length", "tokens", labels, cached), pair_note))
    else:
        none = all(y is None for b in cached for y in b.ys)
        figs.append((None, "Mean cached prompt tokens by input length: no chart, "
                     + ("no request reported cached tokens (usage.prompt_tokens_details absent)." if none else
                        "every request reported 0 cached tokens (no prefix-cache hits).")))
    if overall is not None:
        figs.append((overall_figure(overall, marks),
                     "Solid: the single TTFT p95 of every request per time window, as a dashboard without buckets "
                     "shows it; dashed: the same at the reference bucket mix, which a traffic shift cannot move "
                     "(hollow: a bucket borrowed from its phase)."))
    if timeseries:
        figs.append(_over_time_figure(timeseries, labels, overall is not None, marks))
    return figs


def table_notes(rows: Sequence[BucketRow]) -> list[str]:
    """The footnotes a table of ``rows`` needs, only those its rows call for: ``*`` (a starred row),
    ``~`` (a row whose TTFTs fell in one le bucket), requests in no bucket, interpolated percentiles."""
    notes = [low_count_note(rows), one_bucket_note(rows), unbucketed_note(rows), interpolated_note(rows)]
    return [n for n in notes if n]


def _sorted(rows: Sequence[BucketRow]) -> list[BucketRow]:
    return sorted(rows, key=lambda r: (r.bucket == ALL_LABEL, label_sort_key(r.bucket)))


def _table_html(rows: Sequence[BucketRow], caption: str, label_header: str = HEADERS[0]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in (label_header, *HEADERS[1:]))
    body = []
    for r in rows:
        tip = ""
        if r.ttft_le_range_s is not None:
            lo, hi = r.ttft_le_range_s
            tip = f" title='every TTFT of this row is in the le bucket {lo * 1000:.4g}-{hi * 1000:.4g} ms'"
        cells = "".join(f"<td{tip if c.startswith(ONE_LE_BUCKET_MARK) else ''}>{html.escape(c)}</td>"
                        for c in row_cells(r))
        body.append(f'<tr class="all">{cells}</tr>' if r.bucket == ALL_LABEL else f"<tr>{cells}</tr>")
    notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in table_notes(rows))
    return (f"<div class='table'><h2>{html.escape(caption)}</h2><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>{notes}</div>")


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
        extra_tables: more ``(caption, rows)`` tables after the first ones; their rows are drawn in the bar
            charts too, after ``rows`` and ``compare_rows`` (the demo's three phases: every phase given).
        label_header: the bucket column's header of the first table (``Uncached prompt (tokens)`` for rows
            by uncached prompt tokens).
    """
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if source:
        parts.append(f"<p class='note'>{html.escape(source)}</p>")
    if notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    first = "Per input-length bucket" if label_header == HEADERS[0] else f"Per bucket of {label_header}"
    parts.append(_table_html(_sorted(rows), names[0] if compare_rows is not None else first, label_header))
    if compare_rows is not None:
        parts.append(_table_html(_sorted(compare_rows), names[1]))
    for caption, extra in extra_tables:
        parts.append(_table_html(_sorted(extra), caption))
    parts.append(f"<p class='note'>Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%S')} UTC. "
                 f"Colours: percentiles warm (p50, p95, p99 darker as they rise), input-length buckets cool "
                 f"(violet for the shortest to green for the longest), all requests black, counts grey.</p>")
    plotlyjs = True
    for fig, note in _figures(rows, timeseries, compare_rows, names, overall, marks, extra_tables):
        parts.append("<div class='chart'>")
        if fig is not None:
            parts.append(fig.to_html(full_html=False, include_plotlyjs=plotlyjs,
                                     config={"responsive": True, "displaylogo": False}))
            plotlyjs = False
        if note:
            parts.append(f"<p class='note'>{html.escape(note)}</p>")
        parts.append("</div>")
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
