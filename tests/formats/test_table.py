"""Rendering the per-bucket table: the low-count footnote and the widths."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from rich.console import Console

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.core.summary import BucketRow
from servelens.formats import table
from servelens.formats.table import format_rows, side_by_side
from servelens.prometheus.frontend import FrontendMetrics
from servelens.testing.exporter import feed, synthetic_samples

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
    # the client's rows decide (the ``*`` is on the client's count): starred server rows alone add no note
    assert NOTE in _render(side_by_side(FEW, MANY), 200)
    assert NOTE not in _render(side_by_side(MANY, FEW), 200)


def _lines_of(text: str, label: str) -> list[str]:
    return [line for line in text.splitlines() if label in line]


@pytest.mark.parametrize("width", [80, 100])
def test_narrow_terminal_keeps_bucket_labels_and_numbers_whole(width: int) -> None:
    rows = [_row("0-512", 120), _row("513-1024", 15), _row("1025-2048", 0), _row("16385+", 3),
            _row("all", 138)]
    out = format_rows(rows, "table", width=width)
    assert max(len(line) for line in out.splitlines()) <= width
    assert "…" not in out  # no cell and no header cut ("Requests" was "Reque…" at 80 columns)
    assert ("Requests" in out or "Reqs" in out) and "TTFT" in out and "cached" in out and "hit" in out.lower()
    top = next(line for line in out.splitlines() if line.startswith("┏"))
    assert top.endswith("┓")  # no column cropped off the right edge
    for label in ("0-512", "513-1024", "1025-2048", "16385+"):
        assert len(_lines_of(out, f"│ {label} ")) == 1, (label, out)
    assert "12,345" in out


def _wrapped_cells(text: str) -> list[str]:
    """Body lines that continue a row (a wrapped cell): the label column blank."""
    return [line for line in text.splitlines() if re.match(r"│\s+│", line)]


@pytest.mark.parametrize("width", [80, 100])  # 100: room for the unit in every cell (with the cache-hit column)
def test_80_columns_wrap_no_cell_the_unit_goes_to_the_header(width: int) -> None:
    """At 80 columns every ITL cell wrapped onto two lines (``1.6`` over ``ms``): the unit moves to the
    header and every row is one line."""
    rows = [_row("0-512", 1200), _row("513-1024", 15, 1.2), _row("8193-16384", 3, 12.3456), _row("all", 1218)]
    # with the cache-hit column filled: all nine columns must fit (its header was cut off at 80 once)
    rows = [dataclasses.replace(r, cache_hit_ratio=0.875) for r in rows]
    out = format_rows(rows, "table", width=width)
    assert max(len(line) for line in out.splitlines()) <= width
    assert not _wrapped_cells(out), out
    if width > 80:  # room for a unit in every cell: kept there
        assert "20.4 ms" in out
        return
    body = [line for line in out.splitlines() if line.startswith("│")]
    assert "TTFT" in out and "(ms)" in out and not [line for line in body if " ms " in line or " s " in line]
    assert "12,346" in out and "1,200" in out and "20.4" in out  # 12.3456 s, 1.2 s in ms
    assert "Hit" in out and "(%)" in out and "87.5" in out and "87.5%" not in out
    wide = format_rows(rows, "table", width=160)
    assert "20.4 ms" in wide and "12.35 s" in wide and not _wrapped_cells(wide)


def test_table_uses_the_width_given_and_a_wide_default() -> None:
    rows = [_row("0-512", 120), _row("all", 120)]
    wide = format_rows(rows, "table")
    # at the default width (WIDE_WIDTH, not a terminal's 80 columns) the table keeps its natural
    # width, over 90 columns, with one line per row
    assert 90 < max(len(line) for line in wide.splitlines()) <= table.WIDE_WIDTH
    assert len(_lines_of(wide, "│ 0-512 ")) == 1 and "20.4 ms" in wide
    assert "Avg cached tokens" in wide
    # 90 columns given: the table fits them whole, a header wrapped to make room
    narrow = format_rows(rows, "table", width=90)
    assert max(len(line) for line in narrow.splitlines()) <= 90
    top = next(line for line in narrow.splitlines() if line.startswith("┏"))
    assert top.endswith("┓") and "…" not in narrow
    assert "Avg cached tokens" not in narrow and "cached" in narrow


def test_side_by_side_cells_do_not_wrap_at_150_columns() -> None:
    client = [_row("0-512", 120), _row("513-1024", 15, 1.2), _row("16385+", 3, 0.95), _row("all", 138)]
    server = [_row("0-512", 121, 0.0206), _row("513-1024", 15, 1.31), _row("16385+", 3, 1.1),
              _row("all", 139)]
    out = _render(side_by_side(client, server), 150)
    assert max(len(line) for line in out.splitlines()) <= 150
    body = [line for line in out.splitlines() if line.startswith("│")]
    assert len(body) == len(client), out  # one line per bucket
    assert "20.4/20.6 ms" in out and "1.20/1.31 s" in out and "950.0 ms/1.10 s" in out


def _scrape_file(tmp_path: Path) -> Path:
    metrics = FrontendMetrics(isl_buckets=IslBuckets.default())
    metrics.register_model("m")
    feed(metrics, synthetic_samples(60, IslBuckets.default(), seed=1), "m")
    path = tmp_path / "metrics.txt"
    path.write_bytes(metrics.exposition())
    return path


def test_report_cli_uses_the_terminal_width_and_a_wide_one_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _scrape_file(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["report", "--metrics", str(path)]) == 0
    piped = capsys.readouterr().out
    assert 80 < max(len(line) for line in piped.splitlines()) <= table.WIDE_WIDTH
    monkeypatch.setenv("COLUMNS", "80")  # a pipe: $COLUMNS is not read (readline leaves 80 there)
    assert main(["report", "--metrics", str(path)]) == 0
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) > 80
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(shutil, "get_terminal_size", lambda *a, **k: os.terminal_size((80, 24)))
    assert main(["report", "--metrics", str(path)]) == 0
    tty = capsys.readouterr().out
    assert max(len(line) for line in tty.splitlines()) <= 80
    assert len(_lines_of(tty, "│ 513-1024 ")) == 1
    assert "…" not in "".join(line for line in tty.splitlines() if "│" in line)  # no cell cut


def test_requests_in_no_bucket_are_explained() -> None:
    # 34 in "all", 33 in the buckets: one request failed before its prompt length was known
    rows = [_row("0-512", 20), _row("513-1024", 13), _row("all", 34)]
    for fmt in ("table", "markdown"):
        assert "1 request in no bucket" in format_rows(rows, fmt, width=200), fmt
    assert "no bucket" in _render(side_by_side(rows, rows), 200)
    assert "no bucket" not in format_rows(MANY, "table", width=200)  # they add up: no note


def test_interpolated_percentiles_say_how_far_off_they_can_be() -> None:
    out = format_rows(MANY, "table", width=200)  # rows from histograms (exact=False)
    assert "off by up to a bucket's width" in out
