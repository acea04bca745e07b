"""Printing a :class:`~servelens.core.capacity.CapacityReport` after the report's table: the
verdict line, a table per bucket (TTFT mean, queue, prefill, uncached tokens, prefill rate, what
the bucket is short of), the fit, and ``note:`` lines; as text, Markdown, or JSON fields."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.table import Table

from servelens.core.capacity import BucketCapacity, CapacityReport, PrefillFit, verdict_line
from servelens.formats.table import WIDE_WIDTH
from servelens.report.explain_output import jsonable

TITLE = "Where the capacity is short (TTFT split per ISL bucket)"
SPLIT_TEXT = {"engine": "engine, per request", "engine-wide": "engine, all requests", "fit": "TTFT - fitted prefill"}


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def _n(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _cells(b: BucketCapacity) -> list[str]:
    share = b.queue_share
    return [b.label, f"{b.requests:,}", _s(b.ttft_mean_s), _s(b.queue_mean_s), _s(b.prefill_mean_s),
            "-" if share is None else f"{share * 100:.0f}%", _n(b.uncached_mean_tokens), _n(b.prefill_rate_tps),
            b.limited_by or "-", SPLIT_TEXT.get(b.split or "", "-")]


HEADERS = ("Input length\n(tokens)", "Requests", "TTFT\nmean", "Queue\nmean", "Prefill\nmean", "Queue\nshare",
           "Uncached\ntokens", "Prefill\ntokens/s", "Short of", "Split from")


def fit_line(fit: PrefillFit | None) -> str | None:
    """The fit in one line, or None without one."""
    if fit is None:
        return None
    interval = ("" if fit.throughput_low_tps is None or fit.throughput_high_tps is None
                else f" (95% interval {fit.throughput_low_tps:,.0f}-{fit.throughput_high_tps:,.0f})")
    how = "Theil-Sen over requests" if fit.method == "theil-sen" else "least squares over bucket means"
    what = "fixed overhead + queue floor" if fit.intercept_s >= 0 else "below 0: no overhead or wait, see the note"
    return (f"prefill throughput {fit.throughput_tps:,.0f} tokens/s{interval}, intercept "
            f"{fit.intercept_s * 1000:.1f} ms ({what}): TTFT against {fit.x} prompt tokens, "
            f"{how}, {fit.requests} points")


def _lines(rep: CapacityReport) -> list[str]:
    out = [line for line in (fit_line(rep.fit),) if line]
    if rep.engine_queue_mean_s is not None and rep.engine_prefill_mean_s is not None:
        out.append(f"engine, all requests: mean queue {_s(rep.engine_queue_mean_s)}, mean prefill "
                   f"{_s(rep.engine_prefill_mean_s)}")
    out.extend(f"note: {n}" for n in rep.notes)
    return out


def capacity_text(rep: CapacityReport, width: int | None = None) -> str:
    """The verdict, the table and its lines, as plain text."""
    table = Table(title=TITLE)
    for i, h in enumerate(HEADERS):
        table.add_column(h, justify="left" if i in (0, 8, 9) else "right", no_wrap=i == 0)
    for b in rep.buckets:
        table.add_row(*_cells(b))
    console = Console(file=io.StringIO(), record=True, width=width or WIDE_WIDTH, force_terminal=False)
    console.print(verdict_line(rep), soft_wrap=True, highlight=False)
    console.print(table)
    for line in _lines(rep):
        console.print(line, soft_wrap=True, highlight=False)
    return console.export_text()


def capacity_markdown(rep: CapacityReport) -> str:
    """The same as Markdown."""
    heads = [h.replace("\n", " ") for h in HEADERS]
    rows = ["| " + " | ".join(_cells(b)) + " |" for b in rep.buckets]
    return "\n".join(["", f"## {TITLE}", "", verdict_line(rep), "", "| " + " | ".join(heads) + " |",
                      "|" + "---|" * len(heads), *rows, "", *(f"{line}  " for line in _lines(rep))]) + "\n"


def capacity_dict(rep: CapacityReport) -> dict[str, Any]:
    """Every figure as a JSON field (NaN and infinities as null): ``verdict``, ``waiting`` and
    ``prefilling`` (bucket labels), ``fit``, ``buckets`` (with ``queue_share``), the engine-wide
    means, ``notes``."""
    buckets = [jsonable(b) | {"queue_share": jsonable(b.queue_share)} for b in rep.buckets]
    return {"verdict": verdict_line(rep), "waiting": list(rep.waiting()), "prefilling": list(rep.prefilling()),
            "fit": jsonable(rep.fit), "buckets": buckets, "engine_queue_mean_s": jsonable(rep.engine_queue_mean_s),
            "engine_prefill_mean_s": jsonable(rep.engine_prefill_mean_s), "notes": list(rep.notes)}
