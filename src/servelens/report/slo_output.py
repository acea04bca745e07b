"""Printing a :class:`~servelens.report.slo_report.SloReport` after the report's table: a rich
table (text), a Markdown table, or JSON beside the rows."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from servelens.core.summary import BucketRow
from servelens.formats.slo_table import (
    attainment_caption,
    attainment_dicts,
    attainment_table,
    bounds_caption,
    bounds_table,
    slo_dict,
)
from servelens.formats.table import WIDE_WIDTH
from servelens.report.explain_output import jsonable
from servelens.report.slo_report import SloReport


def _table(slo: SloReport) -> Table:
    title = "SLO attainment per ISL bucket" + ("" if slo.exact is not None else " (from histograms)")
    if slo.exact is not None:
        return attainment_table(slo.exact, slo.slo, title, caption=False)
    return bounds_table(slo.bounds or (), slo.slo, title, caption=False)


def _lines(slo: SloReport) -> list[str]:
    return [attainment_caption(slo.slo) if slo.exact is not None else bounds_caption(slo.slo), *slo.notes]


def slo_text(slo: SloReport, width: int | None = None) -> str:
    """The attainment table and its notes, as plain text."""
    console = Console(file=io.StringIO(), record=True, width=width or WIDE_WIDTH, force_terminal=False)
    console.print(_table(slo))
    for line in _lines(slo):
        console.print(line, soft_wrap=True, highlight=False)
    return console.export_text()


def _markdown(table: Table) -> list[str]:
    headers = [str(c.header).replace("\n", " ") for c in table.columns]
    rows = zip(*(list(c.cells) for c in table.columns), strict=True)
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(str(x) for x in row) + " |" for row in rows)]


def slo_markdown(slo: SloReport) -> str:
    """The attainment as a Markdown table and its notes."""
    t = _table(slo)
    return "\n" + "\n".join([f"## {t.title}", "", *_markdown(t), "", *(f"{line}  " for line in _lines(slo))]) + "\n"


def slo_json(rows: Sequence[BucketRow], slo: SloReport | None, capacity: dict[str, Any] | None = None) -> str:
    """The report's rows, the attainment (when ``slo``) and the capacity analysis (when given, as
    :func:`servelens.report.capacity_output.capacity_dict` made it) in one JSON document (inf and
    NaN as null)."""
    doc: dict[str, Any] = {"rows": [asdict(r) | {"low_count": r.low_count} for r in rows]}
    if slo is not None:
        doc["slo"] = {"slo": slo_dict(slo.slo), "exact": slo.exact is not None, "notes": list(slo.notes),
                      "rows": attainment_dicts(slo.exact if slo.exact is not None else (slo.bounds or ()))}
    if capacity is not None:
        doc["capacity"] = capacity
    return json.dumps(jsonable(doc), indent=2, allow_nan=False) + "\n"
