"""Rendering the per-bucket table: the low-count footnote and the widths."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from servelens.core.summary import BucketRow
from servelens.report.table import format_rows, side_by_side

NOTE = "fewer than 20 requests"


def _row(bucket: str, n: int, ttft_s: float = 0.0204) -> BucketRow:
    return BucketRow(bucket, n, None, ttft_s, ttft_s * 1.5, ttft_s * 2, 0.021, 0.0251, 12345.0, ttft_s,
                     exact=False)


FEW = [_row("0-512", 120), _row("513-1024", 15, 1.2), _row("1025-2048", 0), _row("16385+", 3, 0.95),
       _row("all", 138)]
MANY = [_row("0-512", 120), _row("513-1024", 0), _row("all", 120)]  # empty and "all" rows are not starred


def _render(table: object, width: int) -> str:
    console = Console(file=io.StringIO(), record=True, width=width, force_terminal=False)
    console.print(table)
    return console.export_text()


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_footnote_only_when_a_row_is_starred(fmt: str) -> None:
    few = format_rows(FEW, fmt)
    assert "3 *" in few and NOTE in few
    many = format_rows(MANY, fmt)
    assert "*" not in many.replace("**", "") and NOTE not in many


def test_markdown_footnote_is_not_a_list_item() -> None:
    assert format_rows(FEW, "markdown").endswith("\n\n\\* fewer than 20 requests\n")


def test_side_by_side_footnote_only_when_a_client_row_is_starred() -> None:
    assert NOTE in _render(side_by_side(FEW, FEW), 200)
    assert NOTE not in _render(side_by_side(MANY, MANY), 200)
