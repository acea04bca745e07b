"""The HTML report a person looks at: footnotes only when called for, a histogram quantile of one
observation marked as an interpolation, one meaning per colour, the over-time chart's origin and
gaps; and, where Chromium is installed, the page rendered in a real browser."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.summary import BucketRow, RequestSample, rows_from_samples
from servelens.formats.table import format_rows, one_bucket_note, row_cells, side_by_side
from servelens.prometheus.frontend import FrontendMetrics
from servelens.prometheus.names import MetricNames
from servelens.report import palette
from servelens.report.html import render_html, table_notes, write_html
from servelens.report.sources import TimeSeries, report_from_metrics
from servelens.testing import browser

B = IslBuckets.parse("512,1024")


def _samples(per_bucket: dict[int, int]) -> list[RequestSample]:
    """``n`` requests at each ISL, TTFT rising by 1 ms per request from 10 ms, ITL 20 ms."""
    out = []
    for isl, n in per_bucket.items():
        out += [RequestSample(isl, True, 0.010 + 0.001 * i, (0.020, 0.021)) for i in range(n)]
    return out


def _figures(text: str) -> list[dict[str, Any]]:
    """Each plotly figure's JSON (data, layout) in page order."""
    out = []
    for call in text.split("Plotly.newPlot(")[1:]:
        args = call[call.index("[") :]
        data, end = json.JSONDecoder().raw_decode(args)
        layout, _ = json.JSONDecoder().raw_decode(args[end:].lstrip(", "))
        out.append({"data": data, "layout": layout})
    return out


def test_low_count_footnote_only_when_a_row_is_starred() -> None:
    full = rows_from_samples(_samples({100: 25, 700: 30, 2000: 20}), B)
    assert not any("fewer than" in n for n in table_notes(full))
    assert "fewer than" not in render_html(full)
    starred = rows_from_samples(_samples({100: 25, 700: 3, 2000: 20}), B)
    text = render_html(starred)
    assert text.count("* fewer than 20 requests") == 1
    assert "3 *" in text
    # the comparison: each table carries its own footnote
    both = render_html(full, compare_rows=starred, names=("client", "gateway"))
    assert both.count("* fewer than 20 requests") == 1


def _one_request_scrape(tmp_path: Path) -> list[BucketRow]:
    m = FrontendMetrics(isl_buckets=B)
    m.register_model("a")
    from servelens.testing.exporter import feed

    feed(m, _samples({100: 30, 700: 1, 2000: 2}), "a")
    path = tmp_path / "metrics.txt"
    path.write_bytes(m.exposition())
    return list(report_from_metrics(str(path), MetricNames()).rows)


def test_one_observation_is_shown_as_an_interpolation_inside_its_le_bucket(tmp_path: Path) -> None:
    rows = {r.bucket: r for r in _one_request_scrape(tmp_path)}
    one = rows["513-1024"]
    assert one.requests == 1 and not one.exact
    # histogram_quantile gives three different "percentiles" from the one TTFT (10 ms) ...
    assert len({one.ttft_p50_s, one.ttft_p95_s, one.ttft_p99_s}) == 3
    # ... all inside the one le bucket that holds it: that range is what is known
    assert one.ttft_le_range_s is not None
    lo, hi = one.ttft_le_range_s
    qs = (one.ttft_p50_s, one.ttft_p95_s, one.ttft_p99_s)
    assert lo < 0.010 <= hi and all(q is not None and lo <= q <= hi for q in qs)
    # two TTFTs 10% apart (10 and 11 ms) sit in two le buckets (edges 2^(1/8) apart): no single range
    assert rows["1025+"].ttft_le_range_s is None
    assert rows["0-512"].ttft_le_range_s is None and rows["all"].ttft_le_range_s is None
    cells = row_cells(one)
    assert all(c.startswith("~") for c in cells[2:5]) and not cells[5].startswith("~")
    assert not any(c.startswith("~") for c in row_cells(rows["0-512"]))
    note = one_bucket_note(list(rows.values()))
    assert note is not None and "513-1024" in note and "interpolated" in note and "0-512" not in note
    table = format_rows(list(rows.values()), "table")
    assert "~" in table and "one le bucket" in table
    # exact rows (a results file) never carry the mark, whatever their count
    exact = rows_from_samples(_samples({700: 1}), B)
    assert all(r.ttft_le_range_s is None for r in exact) and one_bucket_note(exact) is None
    # the side-by-side terminal table marks the server's figure only
    client = rows_from_samples(_samples({100: 30, 700: 1, 2000: 2}), B)
    buf = format_side(client, list(rows.values()))
    assert re.search(r"/~\d", buf) and "one le bucket" in buf
    # the HTML: the cells, a tooltip with the range, a mark over the bar and the note
    text = render_html(client, compare_rows=list(rows.values()), names=("client", "gateway"))
    assert "<td title='every TTFT of this row is in the le bucket" in text
    ttft = _figures(text)[0]["data"]
    marked = [t for t in ttft if t.get("text")]
    assert marked and all(t["name"].endswith("(gateway)") for t in marked)


def format_side(client: list[BucketRow], server: list[BucketRow]) -> str:
    import io

    from rich.console import Console

    c = Console(file=io.StringIO(), width=200, record=True)
    c.print(side_by_side(client, server))
    return c.export_text()


def test_colours_have_one_meaning_across_charts() -> None:
    client = rows_from_samples(_samples({100: 25, 700: 30, 2000: 20}), B)
    server = rows_from_samples(_samples({100: 26, 700: 31, 2000: 21}), B)
    series = [TimeSeries(label, (1.0, 2.0, 3.0), (0.01, None, 0.02), (3, 0, 30), "client", "m", 1.0)
              for label in B.labels]
    figs = _figures(render_html(client, series, compare_rows=server, names=("client", "gateway")))
    ttft, itl = figs[0]["data"], figs[1]["data"]
    by_name = {t["name"]: t for t in [*ttft, *itl]}
    for p in ("p50", "p95"):
        a, b = by_name[f"{p} (client)"], by_name[f"{p} (gateway)"]
        # the same hue for client and gateway, the gateway's lighter and hatched
        assert a["marker"]["line"]["color"] == b["marker"]["line"]["color"] == palette.PERCENTILE[p]
        assert a["marker"]["color"] == palette.PERCENTILE[p] and b["marker"]["pattern"]["shape"]
        assert b["marker"]["color"] == palette.lighter(palette.PERCENTILE[p])
    # p50 in the TTFT chart is p50 in the ITL chart
    assert [t["marker"]["line"]["color"] for t in ttft if t["name"].startswith("p50")] == \
        [t["marker"]["line"]["color"] for t in itl if t["name"].startswith("p50")]
    lines = figs[-1]["data"]
    bucket_colours = {t["line"]["color"] for t in lines}
    assert len(bucket_colours) == len(B.labels)
    assert not bucket_colours & set(palette.PERCENTILE.values())
    assert palette.ALL_REQUESTS not in bucket_colours and palette.COUNT not in bucket_colours
    assert [t["line"]["color"] for t in lines] == [palette.bucket_colours(B.labels)[x] for x in B.labels]
    requests = figs[2]["data"]
    assert {t["marker"]["line"]["color"] for t in requests} == {palette.COUNT}


def test_bucket_colours_stay_cool_and_ordered_for_many_buckets() -> None:
    labels = IslBuckets(tuple(256 * (i + 1) for i in range(32))).labels
    colours = palette.bucket_colours(labels)
    assert len(set(colours.values())) == 33
    for c in colours.values():
        r, g = int(c[1:3], 16), int(c[3:5], 16)
        assert not (r > 200 and g < 190)  # never a warm amber/orange/wine


def test_over_time_chart_says_whose_data_and_skips_empty_windows() -> None:
    rows = rows_from_samples(_samples({100: 25, 700: 30}), B)
    series = [
        TimeSeries("0-512", (10.0, 20.0, 30.0, 40.0), (0.01, None, 0.03, 0.04), (30, 0, 2, 25), "client",
                   "exact p95 of the requests sent in the window that starts there", 10.0),
        # a second segment (another phase) of the same bucket: same colour, one legend entry
        TimeSeries("0-512", (100.0, 110.0), (0.02, 0.02), (21, 22), "client", "exact p95 of the requests sent "
                   "in the window that starts there", 10.0),
    ]
    text = render_html(rows, series)
    fig = _figures(text)[-1]
    assert "(client data)" in fig["layout"]["title"]["text"]
    first, second = fig["data"]
    assert len(first["x"]) == 3 and None not in first["y"]  # the empty window is skipped, not a gap
    assert first["marker"]["symbol"] == ["circle", "circle-open", "circle"]  # 2 requests: hollow
    assert first["line"]["color"] == second["line"]["color"] and second["showlegend"] is False
    assert "windows of 10 s" in text and "the line joins the windows either side" in text
    assert "Hollow points rest on fewer than 20 requests" in text
    server = [TimeSeries("0-512", (10.0, 20.0), (0.01, 0.02), origin="server", method="histogram_quantile")]
    assert "(server data)" in _figures(render_html(rows, server))[-1]["layout"]["title"]["text"]


def test_no_cached_tokens_is_a_line_not_an_empty_chart() -> None:
    rows = rows_from_samples(_samples({100: 25}), B)
    text = render_html(rows)
    assert "Mean cached prompt tokens by input length: no chart" in text
    assert all("cached" not in str(f["layout"]) for f in _figures(text))


def _chromium() -> str:
    """Chromium, else a skip with the reason; a failure where CI installed it
    (``SERVELENS_REQUIRE_BINARIES=1``), so it never skips silently there."""
    try:
        return browser.find_chromium()
    except browser.BrowserError as exc:
        if os.environ.get("SERVELENS_REQUIRE_BINARIES") == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def test_report_renders_in_chromium_with_drawn_charts(tmp_path: Path) -> None:
    """The page in a real browser: every chart drawn with its traces and points (not a pixel
    comparison), and a screenshot written at a laptop width."""
    chromium = _chromium()
    client = rows_from_samples([RequestSample(isl, True, 0.01 + isl / 1e6, (0.02,), isl // 2)
                                for isl in (100, 700, 2000) for _ in range(25)], B)
    series = [TimeSeries(label, (1.7e9, 1.7e9 + 5), (0.01, 0.02), (25, 25), "client", "m", 5.0)
              for label in B.labels]
    path = write_html(tmp_path / "report.html", client, series, compare_rows=client, names=("client", "gateway"))
    plots = browser.rendered_plots(chromium, path, width=1280)
    assert [p.title for p in plots] == ["TTFT by input length: p50, p95, p99", "ITL by input length: p50, p95",
                                        "Requests by input length", "Mean cached prompt tokens by input length",
                                        "p95 TTFT by input length over time (client data)"]
    assert [p.traces for p in plots] == [6, 4, 2, 2, 3]
    assert all(p.points >= 3 * p.traces for p in plots[:4])  # a bar per bucket and trace
    assert plots[-1].points >= 3
    png = browser.screenshot(chromium, path, tmp_path / "r.png", 1024, 2000)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bar_charts_draw_every_set_of_rows_given_the_demos_three_phases() -> None:
    """The demo gives three phases (two compared, the third as an extra table); the bar charts drew only
    the first two. Each source keeps the percentile's hue, in its own style, named in the note."""
    phases = [rows_from_samples(_samples({100: 20 + k, 700: 20, 2000: 20 + 2 * k}), B) for k in range(3)]
    names = ("phase 1: baseline", "phase 2: shift")
    figs = _figures(render_html(phases[0], compare_rows=phases[1], names=names,
                                extra_tables=[("phase 3: slow", phases[2])]))
    every = (*names, "phase 3: slow")
    ttft, itl, requests = figs[0]["data"], figs[1]["data"], figs[2]["data"]
    assert [t["name"] for t in ttft] == [f"{p} ({n})" for p in ("p50", "p95", "p99") for n in every]
    assert [t["name"] for t in itl] == [f"{p} ({n})" for p in ("p50", "p95") for n in every]
    assert [t["name"] for t in requests] == list(every)
    assert [t["y"] for t in requests] == [[20.0 + k, 20.0, 20.0 + 2 * k] for k in range(3)]
    third = next(t for t in ttft if t["name"] == "p95 (phase 3: slow)")
    assert third["marker"]["line"]["color"] == palette.PERCENTILE["p95"]
    assert (third["marker"]["color"], third["marker"]["pattern"]["shape"]) == (
        palette.lighter(palette.PERCENTILE["p95"], 0.3), "x")
    page = render_html(phases[0], compare_rows=phases[1], names=names, extra_tables=[("phase 3: slow", phases[2])])
    assert ("Solid: phase 1: baseline; lighter, hatched /: phase 2: shift; hatched x: phase 3: slow."
            in page)
