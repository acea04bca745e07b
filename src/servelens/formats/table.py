"""Rendering the per-bucket table: rich console table, CSV, JSON, Markdown, and side by side."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict

from rich.console import Console
from rich.table import Table
from rich.text import Text

from servelens.core.edges import FINE_ITL_EDGES_S, FINE_TTFT_EDGES_S, ITL_EDGES_S
from servelens.core.summary import LOW_COUNT, BucketRow

FORMATS = ("table", "csv", "json", "markdown")
HEADERS = (
    "Input length (tokens)",
    "Requests",
    "TTFT p50",
    "TTFT p95",
    "TTFT p99",
    "ITL p50",
    "ITL p95",
    "Avg cached tokens",
    "Cache hit",
)


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    ms = x * 1000
    return f"{ms:.1f} ms" if ms < 1000 else f"{x:.2f} s"


def _ms_number(x: float | None) -> str:
    """Milliseconds without the unit (the column header carries it): ``1.6``, ``116.8``, ``12,345``."""
    if x is None:
        return "-"
    ms = x * 1000
    return f"{ms:.1f}" if ms < 1000 else f"{ms:,.0f}"


COMPACT_HEADERS = (
    "Input length (tokens)",
    "Reqs",
    "TTFT p50 (ms)",
    "TTFT p95 (ms)",
    "TTFT p99 (ms)",
    "ITL p50 (ms)",
    "ITL p95 (ms)",
    "Avg cached tokens",
    "Hit (%)",
)
"""The headers of a narrow terminal's table: the unit in the header, so that no cell wraps (``1.6 ms``
wrapped to ``1.6`` over ``ms`` at 80 columns), and short enough for the nine columns to fit 80."""


def _cached(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _ratio(x: float | None, compact: bool = False) -> str:
    """A hit ratio as a percentage (``87.5%``; ``compact``: ``87.5``, the header says %), ``-`` when unknown."""
    return "-" if x is None else f"{100 * x:.1f}" + ("" if compact else "%")


WIDE_WIDTH = 160
"""Width (columns) of the ``table`` format when the output is not a terminal (a file, a pipe)."""


def starred(row: BucketRow) -> bool:
    """True when the row is marked ``*``: a bucket (not "all") with some, but fewer than
    :data:`~servelens.core.summary.LOW_COUNT`, requests."""
    return bool(row.requests) and row.low_count and row.bucket != "all"


def low_count_note(rows: Sequence[BucketRow]) -> str | None:
    """The footnote for ``*``, or None when no row is starred."""
    return f"* fewer than {LOW_COUNT} requests" if any(starred(r) for r in rows) else None


INTERPOLATED_NOTE = "percentiles interpolated inside the histograms' le buckets: off by up to a bucket's width"
"""The interpolation note's start; :func:`interpolated_note` adds what the edges read are."""


def _edge_text(metric: str, kind: str) -> str:
    if metric == "ttft":
        if kind == "fine":
            return ("TTFT edges 2^(1/8) apart (servelens' fine edges, "
                    f"{FINE_TTFT_EDGES_S[1] * 1000:.3g} ms to {2 ** 7:g} s): within 9.8 % of the value")
        if kind == "dynamo":
            return "with Dynamo's edges TTFT jumps 0.47 s, 1 s, 2.2 s"
        return "TTFT edges as the server was given them"
    first = FINE_ITL_EDGES_S[1] if kind == "fine" else ITL_EDGES_S[1] if kind == "dynamo" else None
    where = {"fine": "fine", "dynamo": "Dynamo's"}.get(kind)
    if first is None:
        return "ITL edges as the server was given them"
    return (f"ITL gaps of 0, chunks read together, share the first of {where} ITL edges with gaps up to "
            f"{first * 1000:.2g} ms")


def interpolated_note(rows: Sequence[BucketRow]) -> str | None:
    """The note for interpolated rows, describing the ``le`` edges they were read from (the rows'
    ``ttft_le_edges``/``itl_le_edges``: servelens' fine edges, Dynamo's, or the server's own), or None
    when every row is exact."""
    approx = [r for r in rows if not r.exact]
    if not approx:
        return None
    parts = []
    for metric in ("ttft", "itl"):
        kinds = {getattr(r, f"{metric}_le_edges") for r in approx} - {None}
        parts += [_edge_text(metric, kind) for kind in sorted(kinds)]
    return INTERPOLATED_NOTE + (f" ({'; '.join(parts)})" if parts else "")


ONE_LE_BUCKET_MARK = "~"
"""Prefix of a TTFT percentile interpolated inside the one ``le`` bucket that holds all of its row's
observations (:attr:`~servelens.core.summary.BucketRow.ttft_le_range_s`)."""


def _span(lo: float, hi: float) -> str:
    if math.isinf(hi):
        return f"over {_ms(lo)}"
    return f"{_ms(lo).removesuffix(' ms')}-{_ms(hi)}" if hi < 1 else f"{_ms(lo)}-{_ms(hi)}"


def one_bucket_note(rows: Sequence[BucketRow]) -> str | None:
    """The footnote for ``~`` (rows whose TTFTs all fell in one ``le`` bucket), or None when no row has it."""
    marked = [r for r in rows if r.ttft_le_range_s is not None]
    if not marked:
        return None
    where = ", ".join(f"{display_label(r.bucket)}: {_span(*r.ttft_le_range_s)}"  # type: ignore[misc]
                      for r in marked)
    return (f"{ONE_LE_BUCKET_MARK} every TTFT of the row fell in one le bucket ({where}): its p50/p95/p99 are "
            "interpolated inside that bucket, not measured; only the range is known")


def _ttft(row: BucketRow, x: float | None, ms: Callable[[float | None], str] = _ms) -> str:
    text = ms(x)
    return ONE_LE_BUCKET_MARK + text if row.ttft_le_range_s is not None and x is not None else text


def unbucketed_note(rows: Sequence[BucketRow]) -> str | None:
    """A note when the "all" row counts requests that no bucket does (they failed before their
    prompt length was known), else None."""
    total = next((r.requests for r in rows if r.bucket == "all"), None)
    if total is None:
        return None
    missing = total - sum(r.requests for r in rows if r.bucket != "all")
    if missing <= 0:
        return None
    return (f"{missing:,} request{'s' if missing != 1 else ''} in no bucket (failed before the prompt length "
            "was known): counted in 'all requests' only")


def _requests(row: BucketRow) -> str:
    text = f"{row.requests:,}"
    if row.errors:
        text += f" ({row.errors} err)"
    if starred(row):
        text += " *"
    return text


ALL_ROW_LABEL = "all requests"
"""How the "all" row is labelled on screen (its key in CSV/JSON stays ``all``)."""


def display_label(bucket: str) -> str:
    """The label shown for a row: the bucket (``513-1024``), or "all requests" for the "all" row."""
    return ALL_ROW_LABEL if bucket == "all" else bucket


ISL_HEADER = HEADERS[0]
UNCACHED_HEADER = "Uncached prompt (tokens)"
"""The label column's header of a table by uncached prompt tokens (ISL minus cached tokens)."""


def _label_column(table: Table, rows: Sequence[BucketRow], header: str = ISL_HEADER) -> None:
    """The bucket label column: never truncated or wrapped (its header on two lines)."""
    longest = max((len(display_label(r.bucket)) for r in rows), default=0)
    head, _, unit = header.rpartition(" ")
    table.add_column(f"{head}\n{unit}", justify="left", no_wrap=True, min_width=max(longest, 12))


def _value_columns(table: Table, headers: Sequence[str], cells: Sequence[Sequence[str]]) -> None:
    """Right-aligned columns that may wrap between words but are never narrower than their
    longest word (rich would otherwise cut ``1,234`` to ``1,2…`` on a narrow terminal)."""
    for i, h in enumerate(headers):
        words = [w for row in cells for w in row[i].split()] + h.split()
        table.add_column(h, justify="right", min_width=max((len(w) for w in words), default=1))


def row_cells(row: BucketRow, compact: bool = False) -> list[str]:
    """The display cells of a row (times in ms or s; ``compact``: in ms without the unit, as
    :data:`COMPACT_HEADERS` say; ``*`` marks a low-count bucket, ``~`` a TTFT interpolated inside the one
    ``le`` bucket that holds all the row's TTFTs)."""
    ms = _ms_number if compact else _ms
    return [
        display_label(row.bucket),
        _requests(row),
        _ttft(row, row.ttft_p50_s, ms),
        _ttft(row, row.ttft_p95_s, ms),
        _ttft(row, row.ttft_p99_s, ms),
        ms(row.itl_p50_s),
        ms(row.itl_p95_s),
        _cached(row.mean_cached_tokens),
        _ratio(row.cache_hit_ratio, compact),
    ]


def rich_table(rows: Sequence[BucketRow], title: str | None = None, caption: str | None = None,
               label_header: str = ISL_HEADER, compact: bool = False) -> Table:
    """A rich Table of the rows (buckets in the order given; "all" separated by a line); ``label_header``
    names the bucket column (:data:`UNCACHED_HEADER` for buckets by uncached prompt tokens). ``compact``:
    times in ms with the unit in the header (:data:`COMPACT_HEADERS`), for a narrow terminal."""
    exact = all(r.exact for r in rows) if rows else True
    notes = [n for n in (low_count_note(rows), one_bucket_note(rows), unbucketed_note(rows),
                         None if exact else interpolated_note(rows)) if n]
    lines = ([caption] if caption else []) + notes
    # compact: one space between columns, not two (nine columns in 80)
    table = Table(title=title, caption="\n".join(lines) or None, collapse_padding=compact)
    cells = [row_cells(r, compact) for r in rows]
    _label_column(table, rows, label_header)
    _value_columns(table, (COMPACT_HEADERS if compact else HEADERS)[1:], [c[1:] for c in cells])
    for row, c in zip(rows, cells, strict=True):
        if row.bucket == "all":
            table.add_section()
        table.add_row(*c, style="bold" if row.bucket == "all" else None)
    return table


def _pair(a: float | None, b: float | None, mark_b: bool = False) -> str:
    """``client/server`` times with one unit when both share it: ``20.4/20.6 ms``, ``1.20/1.31 s``;
    ``mark_b``: the server's figure carries :data:`ONE_LE_BUCKET_MARK` (``20.4/~20.6 ms``)."""
    if a is None and b is None:
        return "-"
    mark = ONE_LE_BUCKET_MARK if mark_b and b is not None else ""
    vals = [x for x in (a, b) if x is not None]
    if all(x < 1 for x in vals):
        return "/".join("-" if x is None else f"{x * 1000:.1f}" for x in (a, b)).replace("/", "/" + mark) + " ms"
    if all(x >= 1 for x in vals):
        return "/".join("-" if x is None else f"{x:.2f}" for x in (a, b)).replace("/", "/" + mark) + " s"
    return f"{_ms(a)}/{mark}{_ms(b)}"


def side_by_side(
    client: Sequence[BucketRow], server: Sequence[BucketRow], title: str = "Client vs server (gateway /metrics)",
    notes: Sequence[str] = (), label_header: str = ISL_HEADER,
) -> Table:
    """One table with client and server TTFT/ITL columns per bucket, matched by bucket label.

    Cells are ``client/server`` (``20.4/20.6 ms``); the label column never truncates or wraps.
    ``notes``: more caption lines. The cache-hit column appears when a row on either side has a hit ratio.
    """
    srv = {r.bucket: r for r in server}
    lines = ["client: exact percentiles; server: " + (interpolated_note(list(server)) or INTERPOLATED_NOTE)]
    lines += [n for n in (low_count_note(client), one_bucket_note(list(server)), unbucketed_note(client)) if n]
    table = Table(title=title, caption="\n".join([*lines, *notes]))
    # the hit ratio's column only when a side knows it (the table is wide: it must fit 150 columns)
    hit = any(r.cache_hit_ratio is not None for r in (*client, *server))
    headers = ("Requests client/server", "TTFT p50 client/server", "TTFT p95 client/server",
               "TTFT p99 client/server", "ITL p50 client/server", "ITL p95 client/server",
               "Avg cached tokens client/server") + (("Cache hit client/server",) if hit else ())
    cells = []
    for c in client:
        s = srv.get(c.bucket)
        one = s is not None and s.ttft_le_range_s is not None
        req = f"{c.requests:,}/{f'{s.requests:,}' if s else '-'}"
        if c.errors:
            req += f" ({c.errors} err)"
        if starred(c):
            req += " *"
        cells.append([
            req,
            _pair(c.ttft_p50_s, s.ttft_p50_s if s else None, one),
            _pair(c.ttft_p95_s, s.ttft_p95_s if s else None, one),
            _pair(c.ttft_p99_s, s.ttft_p99_s if s else None, one),
            _pair(c.itl_p50_s, s.itl_p50_s if s else None),
            _pair(c.itl_p95_s, s.itl_p95_s if s else None),
            f"{_cached(c.mean_cached_tokens)}/{_cached(s.mean_cached_tokens if s else None)}",
        ] + ([f"{_ratio(c.cache_hit_ratio)}/{_ratio(s.cache_hit_ratio if s else None)}"] if hit else []))
    _label_column(table, client, label_header)
    _value_columns(table, headers, cells)
    for c, row in zip(client, cells, strict=True):
        if c.bucket == "all":
            table.add_section()
        table.add_row(display_label(c.bucket), *row)
    return table


def fits(table: Table, width: int) -> bool:
    """True when rich renders ``table`` within ``width`` columns whole (wrapping cells as needed);
    False when it would have to crop columns off its right edge or cut a header or cell short (``…``)."""
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(table)
    lines = buf.getvalue().splitlines()
    border = next((line for line in lines if line.startswith(("┏", "┌"))), "")
    cut = any("…" in line for line in lines if line.startswith(("┃", "│")))
    return border.endswith(("┓", "┐")) and not cut


def output_width() -> int | None:
    """Columns for tables on stdout: the terminal's width on a terminal; else None (a file or pipe: the
    wide default, :data:`WIDE_WIDTH`). ``$COLUMNS`` is not read for a pipe: Python's ``readline`` puts
    ``COLUMNS=80`` into the C environment of any process that loads it (pytest does), which every child
    inherits, so it does not tell what the reader of a pipe wants."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def fitted_table(rows: Sequence[BucketRow], width: int, title: str | None = None,
                 caption: str | None = None, label_header: str = ISL_HEADER) -> Table:
    """:func:`rich_table` fitted to ``width`` columns with no cell wrapped when it can be: the table with
    a unit in every cell when that fits on one line per row, else the compact one (ms in the headers),
    fitted with :func:`fit_to`."""
    table = rich_table(rows, title, caption, label_header)
    if fits(table, width) and not cells_wrap(table, width):
        return table
    compact = rich_table(rows, title, caption, label_header, compact=True)
    fit_to(compact, width)
    return compact


def cells_wrap(table: Table, width: int) -> bool:
    """True when some body cell of ``table`` takes more than one line at ``width`` columns."""
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(table)
    lines = buf.getvalue().splitlines()
    head_end = next((i for i, line in enumerate(lines) if line.startswith(("┡", "├"))), None)
    if head_end is None:
        return False
    body = [line for line in lines[head_end + 1:] if line.startswith("│")]
    return len(body) > table.row_count


def whole_words(text: str) -> Text:
    """A table title that wraps between words only: a word wider than the table (a URL, a path) stays
    whole on a line of its own, reaching past the table's edge, instead of being cut where the table
    ends ("/v1/chat/completion" over "s")."""
    return Text(text, overflow="ignore")


def fit_to(table: Table, width: int) -> bool:
    """Make ``table`` render within ``width`` columns if it can: when its natural layout does not fit,
    every column is set to its minimum width (its longest word; cells wrap between words), since
    rich's own width plan crops the right-hand columns before it shrinks the others to their
    minimums. Returns True when the table now fits whole."""
    if fits(table, width):
        return True
    for col in table.columns:
        col.width = col.min_width
    if not fits(table, width):
        for col in table.columns:
            col.width = None
        return False
    # the room left unwraps whole columns, those needing the least first (most columns on one line)
    spare = width - Console(width=WIDE_WIDTH * 4).measure(table).maximum  # columns now have fixed widths
    needs = [(max((len(str(c)) for c in col.cells), default=0) - (col.width or 0), i)
             for i, col in enumerate(table.columns)]
    for need, i in sorted(needs):
        if 0 < need <= spare:
            table.columns[i].width = (table.columns[i].width or 0) + need
            spare -= need
    return True


CSV_DECIMALS = 9
"""Decimals of a float in CSV: nanoseconds, the clocks' resolution, for figures in seconds; what is past
them is summation noise (``0.5737770627999998``)."""


def _csv_value(v: object) -> object:
    """A CSV cell: floats rounded to :data:`CSV_DECIMALS` decimals and written shortest (``0.573777063``,
    ``0.5``), the rest as it is."""
    if isinstance(v, float) and math.isfinite(v):
        return repr(round(v, CSV_DECIMALS))
    return v


def format_rows(rows: Sequence[BucketRow], fmt: str, title: str | None = None, width: int | None = None,
                label_header: str = ISL_HEADER) -> str:
    """Render rows as ``table`` (rich, plain text), ``csv``, ``json`` or ``markdown``.

    ``width``: columns available to ``table`` (the terminal's width when printing to one; default
    :data:`WIDE_WIDTH`). ``table`` and ``markdown`` mark low-count buckets ``*`` and then, only then,
    end with the footnote. Raises ValueError for an unknown format. CSV/JSON carry raw seconds and
    tokens (JSON also ``low_count``; CSV to the nanosecond, :data:`CSV_DECIMALS`). ``label_header``: the
    bucket column's header.
    """
    if fmt == "table":
        console = Console(file=io.StringIO(), record=True, width=width or WIDE_WIDTH, force_terminal=False)
        console.print(fitted_table(rows, width or WIDE_WIDTH, title, label_header=label_header))
        return console.export_text()
    if fmt == "json":
        return json.dumps([asdict(r) | {"low_count": r.low_count} for r in rows], indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        fields = list(asdict(rows[0]).keys()) if rows else ["bucket"]
        w = csv.DictWriter(buf, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: _csv_value(v) for k, v in asdict(r).items()})
        return buf.getvalue()
    if fmt == "markdown":
        lines = ["| " + " | ".join((label_header, *HEADERS[1:])) + " |", "|" + "---|" * len(HEADERS)]
        for r in rows:
            cells = row_cells(r)
            if r.bucket == "all":
                cells = [f"**{c}**" for c in cells]
            lines.append("| " + " | ".join(cells) + " |")
        for extra in (one_bucket_note(rows), unbucketed_note(rows), interpolated_note(rows)):
            if extra:
                lines += ["", extra]
        note = low_count_note(rows)
        if note:
            lines += ["", "\\" + note]  # escaped: a line starting "* " is a list item
        return ("# " + title + "\n\n" if title else "") + "\n".join(lines) + "\n"
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
