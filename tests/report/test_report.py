"""servelens report from results files and /metrics text; the HTML writer."""

from __future__ import annotations

import csv
import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.core.summary import rows_from_samples
from servelens.formats.results import BenchRecord, write_results
from servelens.formats.table import format_rows
from servelens.prometheus.frontend import FrontendMetrics
from servelens.prometheus.names import MetricNames
from servelens.report.html import bucket_order, render_html, write_html
from servelens.report.results import load_timed_samples
from servelens.report.sources import (
    TimeSeries,
    p95_over_time,
    report_from_metrics,
    report_from_results,
)
from servelens.testing.exporter import feed, serve_metrics, synthetic_samples

BUCKETS = IslBuckets.default()
MS = 1_000_000
WALL0 = 1_700_000_000 * 1_000_000_000


def _record(i: int, isl: int, ttft_ms: int, gaps_ms: list[int], cached: int | None, ok: bool = True,
            wall_s: float = 0.0) -> BenchRecord:
    send = 10_000 * MS + i * MS
    offs, t = [], ttft_ms * MS
    for g in [0, *gaps_ms]:
        t += g * MS
        offs.append(t)
    return BenchRecord(
        index=i, request_id=None, scheduled_ns=i * MS, send_ns=send, wall_send_ns=WALL0 + int(wall_s * 1e9),
        first_output_ns=send + ttft_ms * MS if ok else None, end_ns=send + offs[-1] + MS,
        chunk_offsets_ns=tuple(offs) if ok else (), chunk_tokens=tuple(1 for _ in offs) if ok else (),
        tokens_from_usage=False, isl_target=isl, isl_server=isl, osl_target=len(offs), osl=len(offs) if ok else None,
        cached_tokens=cached, status="success" if ok else "error", error_type="" if ok else "internal",
    )


FIXTURE_ISLS = (300, 700, 1500, 20000)
FIXTURE_GAPS_MS = (20, 22, 25)


def _fixture_ttft_ms(i: int, isl: int) -> int:
    return 10 + isl // 100 + i % 7


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    recs = []
    for i in range(60):
        isl = FIXTURE_ISLS[i % 4]
        recs.append(_record(i, isl, ttft_ms=_fixture_ttft_ms(i, isl), gaps_ms=list(FIXTURE_GAPS_MS), cached=isl // 2,
                            wall_s=i * 0.5))
    recs.append(_record(60, 700, 0, [], None, ok=False, wall_s=30))
    return write_results(tmp_path / "results.jsonl", recs)


def _expected_figures() -> dict[str, dict[str, float]]:
    """What ``results_file`` holds, per bucket label, worked out from its formulas (numpy's exact
    percentiles, seconds): requests, errors, TTFT p50/p95/p99, ITL p50/p95, mean cached tokens and the
    prefix-cache hit ratio (cached over prompt tokens)."""
    groups: dict[str, list[tuple[int, int]]] = {}
    for i in range(60):
        isl = FIXTURE_ISLS[i % 4]
        for label in (BUCKETS.label(isl), "all"):
            groups.setdefault(label, []).append((i, isl))
    out = {}
    for label, members in groups.items():
        ttft = [_fixture_ttft_ms(i, isl) / 1e3 for i, isl in members]
        itl = [g / 1e3 for _ in members for g in FIXTURE_GAPS_MS]
        failed = 1 if label in ("513-1024", "all") else 0  # the one error, ISL 700
        out[label] = {"requests": len(members) + failed, "errors": failed,
                      **{f"ttft_p{q}_s": float(np.percentile(ttft, q)) for q in (50, 95, 99)},
                      **{f"itl_p{q}_s": float(np.percentile(itl, q)) for q in (50, 95)},
                      "mean_cached_tokens": sum(isl // 2 for _, isl in members) / len(members),
                      "cache_hit_ratio": sum(isl // 2 for _, isl in members) / sum(isl for _, isl in members)}
    return out


def test_results_file_gives_exact_rows_and_time_series(results_file: Path) -> None:
    rep = report_from_results(results_file, BUCKETS)
    rows = {r.bucket: r for r in rep.rows}
    assert [r.bucket for r in rep.rows] == [*BUCKETS.labels, "all"]
    assert rows["513-1024"].requests == 16 and rows["513-1024"].errors == 1
    assert rows["2049-4096"].requests == 0 and rows["2049-4096"].ttft_p95_s is None
    assert rows["all"].requests == 61
    assert rows["0-512"].itl_p50_s == pytest.approx(0.022)
    assert rows["16385+"].mean_cached_tokens == 10000
    assert all(r.exact for r in rep.rows)
    # the same as the core's exact rows of the bench's samples
    samples = [t.sample for t in load_timed_samples(results_file)]
    assert list(rep.rows) == rows_from_samples(samples, BUCKETS)
    # over time: only buckets with traffic, numeric order, bins over 30 s of send times: 61 requests
    # in 4 buckets aim at 10 per bucket and window, at least 3 windows
    assert [ts.bucket for ts in rep.timeseries] == ["0-512", "513-1024", "1025-2048", "16385+"]
    ts = rep.timeseries[0]
    assert ts.times_s[0] == pytest.approx(WALL0 / 1e9)
    assert len(ts.times_s) == len(ts.ttft_p95_s) == len(ts.counts) == 3
    assert ts.window_s == pytest.approx(10.0) and ts.origin == "client"
    assert sum(t.counts[0] for t in rep.timeseries) == 20  # the 20 requests sent in the first 10 s


def test_p95_over_time_bins_exactly() -> None:
    from servelens.core.summary import RequestSample
    from servelens.report.results import TimedSample

    b = IslBuckets.parse("100")
    samples = [TimedSample(RequestSample(50, True, float(k)), 1000.0 + k // 10) for k in range(40)]
    series = p95_over_time(samples, b, bins=4)
    assert len(series) == 1 and series[0].bucket == "0-100"
    # bins: send times 1000..1003 -> width 1 s; each bin holds 10 TTFTs k..k+9
    assert series[0].ttft_p95_s[0] == pytest.approx(8.55)
    assert series[0].ttft_p95_s[3] == pytest.approx(38.55)


def test_metrics_text_since_start_and_difference(tmp_path: Path) -> None:
    b = IslBuckets.parse("512,1024,2048")
    m = FrontendMetrics(isl_buckets=b)
    m.register_model("a")
    first = synthetic_samples(40, b, seed=1)
    feed(m, first, "a")
    before = tmp_path / "before.txt"
    before.write_bytes(m.exposition())
    second = synthetic_samples(80, b, seed=2, ttft_per_token_s=400e-6)  # ten times slower prefill
    feed(m, second, "a")
    after = tmp_path / "after.txt"
    after.write_bytes(m.exposition())
    names = MetricNames()
    since_start = {r.bucket: r for r in report_from_metrics(str(after), names).rows}
    diff = {r.bucket: r for r in report_from_metrics(str(after), names, before=str(before)).rows}
    assert since_start["all"].requests == 120 and diff["all"].requests == 80
    assert [*diff] == [*b.labels, "all"]
    for label in b.labels:
        assert diff[label].requests == 20
        assert (diff[label].ttft_p50_s or 0) > (since_start[label].ttft_p50_s or 0)
    exact = {r.bucket: r for r in rows_from_samples(second, b)}
    assert diff["all"].mean_cached_tokens == pytest.approx(exact["all"].mean_cached_tokens)
    assert diff["all"].ttft_mean_s == pytest.approx(exact["all"].ttft_mean_s, rel=1e-6)
    # --model filters; buckets the server has not exported show as empty rows
    with pytest.raises(ValueError, match="no servelens_time_to_first_token_by_isl_seconds series for model"):
        report_from_metrics(str(after), names, model="other")
    partial = tmp_path / "partial.txt"
    partial.write_text("".join(line for line in after.read_text().splitlines(keepends=True)
                               if 'isl_bucket="1025-2048"' not in line))
    assert [r.bucket for r in report_from_metrics(str(partial), names).rows] == ["0-512", "513-1024", "2049+", "all"]
    filled = report_from_metrics(str(partial), names, buckets=b).rows
    assert [r.bucket for r in filled] == [*b.labels, "all"]
    assert filled[2].requests == 0 and filled[2].ttft_p95_s is None


def test_metrics_url_over_http() -> None:
    b = IslBuckets.parse("1000")
    m = FrontendMetrics(isl_buckets=b, prefix="dynamo_frontend")
    m.register_model("a")
    feed(m, synthetic_samples(10, b), "a")
    with serve_metrics(m) as url:
        rep = report_from_metrics(url, MetricNames("dynamo_frontend"))
        with pytest.raises(ValueError, match="check --metrics-prefix"):
            report_from_metrics(url, MetricNames())
    assert {r.bucket: r.requests for r in rep.rows} == {"0-1000": 5, "1001+": 5, "all": 10}


def test_html_is_self_contained_and_in_numeric_order(results_file: Path, tmp_path: Path) -> None:
    rep = report_from_results(results_file, BUCKETS)
    shuffled = list(reversed(rep.rows))
    path = write_html(tmp_path / "sub" / "report.html", shuffled, list(reversed(rep.timeseries)), title="T<1>")
    text = path.read_text()
    assert "T&lt;1&gt;" in text
    assert text.count("<script") >= 5
    assert not re.search(r"<script[^>]+src=", text)  # plotly inlined, no CDN
    assert len(text) > 1_000_000  # plotly.js itself
    for heading in ("TTFT by input length: p50, p95, p99", "ITL by input length: p50, p95",
                    "Requests by input length", "Mean cached prompt tokens by input length",
                    "p95 TTFT by input length over time"):
        assert heading in text, heading
    arrays = re.findall(r'"categoryarray":(\[[^\]]*\])', text)
    assert arrays and all(json.loads(a) == list(BUCKETS.labels) for a in arrays)
    # the over-time chart (the last figure) draws its bucket lines in numeric order
    last_figure = text.split("Plotly.newPlot(")[-1]
    assert "over time" in last_figure
    assert re.findall(r'"name":"([^"]+)"', last_figure) == ["0-512", "513-1024", "1025-2048", "16385+"]
    # table rows in numeric order, "all" last
    cells = re.findall(r"<tr[^>]*><td>([^<]+)</td>", text)
    assert cells == [*BUCKETS.labels, "all requests"]
    no_time = render_html(rep.rows, None)
    assert "over time" not in no_time


def test_html_side_by_side_for_the_demo(results_file: Path) -> None:
    rows = report_from_results(results_file, BUCKETS).rows
    text = render_html(rows, [TimeSeries("0-512", (1.0,), (None,))], compare_rows=rows, names=("client", "gateway"))
    assert "p50 (client)" in text and "p50 (gateway)" in text
    assert bucket_order(rows) == list(BUCKETS.labels)


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _shown(figures: dict[str, float]) -> list[str]:
    """The cells a table or Markdown row shows for ``figures`` (times in ms at this fixture's sizes)."""
    req = f"{figures['requests']:,}" + (f" ({figures['errors']} err)" if figures["errors"] else "")
    times = [f"{figures[k] * 1e3:.1f} ms" for k in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "itl_p50_s",
                                                     "itl_p95_s")]
    return [req, *times, f"{figures['mean_cached_tokens']:,.0f}", f"{100 * figures['cache_hit_ratio']:.1f}%"]


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "markdown"])
def test_cli_formats(results_file: Path, fmt: str) -> None:
    """Every format: the buckets in numeric order, "all" last, and each row's figures those of the file."""
    rc, out, _ = _run(["report", "--results", str(results_file), "--format", fmt])
    assert rc == 0
    assert out.index("0-512") < out.index("513-1024") < out.index("1025-2048") < out.index("16385+")
    want = _expected_figures()
    assert set(want) == {"0-512", "513-1024", "1025-2048", "16385+", "all"}
    if fmt in ("csv", "json"):
        rows = json.loads(out) if fmt == "json" else list(csv.DictReader(io.StringIO(out)))
        assert [r["bucket"] for r in rows] == [*BUCKETS.labels, "all"]
        for r in rows:
            figures = want.get(r["bucket"])
            if figures is None:  # an empty bucket
                assert int(r["requests"]) == 0 and r["ttft_p50_s"] in (None, ""), r
                continue
            got = {k: float(r[k]) for k in figures}
            assert got == pytest.approx(figures), r["bucket"]
        return
    cells = {}
    for line in out.splitlines():
        parts = [p.strip().strip("*").strip() for p in line.replace("│", "|").split("|")[1:-1]]
        if parts and parts[0] in (*BUCKETS.labels, "all requests"):
            cells["all" if parts[0] == "all requests" else parts[0]] = parts[1:]
    assert list(cells) == [*BUCKETS.labels, "all"]
    for label, shown in cells.items():
        figures = want.get(label)
        if figures is None:
            assert shown == ["0", *["-"] * 7], label
        else:
            assert [c.removesuffix(" *") for c in shown] == _shown(figures), label


def test_cli_results_folder_and_html(results_file: Path, tmp_path: Path) -> None:
    rc, out, err = _run(["report", "--results", str(results_file.parent), "--isl-buckets", "1000",
                         "--html", str(tmp_path / "r.html")])
    assert rc == 0 and "1001+" in out and "r.html" in err
    assert (tmp_path / "r.html").stat().st_size > 1_000_000


@pytest.mark.parametrize("argv, message", [
    (["--results", "/nonexistent/results.jsonl"], "cannot read results file"),
    (["--metrics", "/nonexistent.txt"], "cannot read metrics file"),
    (["--metrics", "http://127.0.0.1:1/metrics"], "cannot fetch"),
    (["--prometheus", "ftp://x"], "http(s)"),
    (["--prometheus", "http://127.0.0.1:1", "--window", "5m"], "cannot reach"),
    (["--results", "x", "--metrics-before", "y"], "--metrics-before needs --metrics"),
    (["--results", "x", "--isl-buckets", "0"], "positive integer"),
    (["--results", "x", "--isl-buckets", ""], "ISL bucket boundaries must not be empty"),  # was the default
    (["--results", "x", "--window", "10m"], "--window applies to --prometheus only"),
    (["--results", "/dev/null"], "no requests in it"),
    (["--prometheus", "http://127.0.0.1:1", "--range", "2h"], "--range is the span of the HTML report's chart"),
    (["--metrics", "x", "--range", "2h"], "--range applies to --prometheus only"),
])
def test_cli_errors_are_one_line(argv: list[str], message: str) -> None:
    rc, _, err = _run(["report", *argv])
    assert rc == 2, err
    assert err.startswith("servelens: error:") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize("extra", [[], ["--capacity"], ["--slo-ttft", "1"], ["--compare", "EMPTY"], ["--convert"]])
def test_cli_empty_folder_says_it_holds_no_results(tmp_path: Path, extra: list[str]) -> None:
    """An existing empty folder was reported as "cannot read results file emptydir: No such file or
    directory"; a failed --convert also left an empty results.cols in it."""
    empty = tmp_path / "emptydir"
    empty.mkdir()
    rc, out, err = _run(["report", "--results", str(empty), *[str(empty) if a == "EMPTY" else a for a in extra]])
    assert (rc, out) == (2, "")
    assert err == (f"servelens: error: {empty}: the folder holds no results.jsonl or results.cols (give a bench "
                   "--output-dir or a results file)\n")
    assert list(empty.iterdir()) == []
    rc, _, err = _run(["explain", "--results", str(empty), str(empty)])
    assert rc == 2 and err.startswith(f"servelens: error: {empty}: the folder holds no results.jsonl")


def test_cli_convert_of_a_missing_file_leaves_nothing_behind(tmp_path: Path) -> None:
    rc, _, err = _run(["report", "--results", str(tmp_path / "missing.jsonl"), "--convert"])
    assert rc == 2
    missing = tmp_path / "missing.jsonl"
    assert err == f"servelens: error: cannot convert {missing}: {missing} does not exist\n"
    assert list(tmp_path.iterdir()) == []


def test_cli_missing_metrics_file_is_named_once() -> None:
    rc, _, err = _run(["report", "--metrics", "nope.txt"])
    assert rc == 2 and err == "servelens: error: cannot read metrics file nope.txt: No such file or directory\n"


def test_cli_html_into_a_missing_folder_is_an_error_before_any_work(results_file: Path, tmp_path: Path) -> None:
    """A typo in the folder no longer creates a tree of folders in silence; nothing is read first (the
    source here does not exist, and the error is the folder's)."""
    target = tmp_path / "missing-dir" / "deeper" / "r.html"
    rc, out, err = _run(["report", "--prometheus", "http://127.0.0.1:1", "--html", str(target)])
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert f"--html {target}: the folder {target.parent} does not exist (create it first)" in err
    assert not (tmp_path / "missing-dir").exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, _, err = _run(["report", "--results", str(results_file), "--html", str(afile / "r.html")])
    assert rc == 2 and "is not a folder" in err
    rc, _, err = _run(["report", "--results", str(results_file), "--html", str(tmp_path / "r.html")])
    assert rc == 0 and (tmp_path / "r.html").exists()


@pytest.mark.parametrize("status, body, content_type", [
    (404, b"404: Not Found", "text/plain"),  # the gateway's answer to /api/v1/...
    (200, b"# HELP x\n# TYPE x counter\nx_total 1\n", "text/plain"),  # an exporter answering every path
    (200, b'{"object": "list", "data": []}', "application/json"),  # JSON, but another API's
    (404, b'{"error": {"message": "not found"}}', "application/json"),  # an OpenAI-style error object
])
def test_cli_prometheus_url_that_is_not_a_prometheus_api_says_so(status: int, body: bytes,
                                                                content_type: str) -> None:
    from servelens.testing.static import serve_static

    with serve_static(body, content_type=content_type, status=status) as url:
        rc, _, err = _run(["report", "--prometheus", url])
    assert rc == 2 and err.count("\n") == 1, err
    assert "not a Prometheus API (give the base URL of Prometheus or VictoriaMetrics" in err, err


def test_cli_csv_has_no_float_noise(results_file: Path) -> None:
    rc, out, _ = _run(["report", "--results", str(results_file), "--format", "csv"])
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    cells = [v for r in rows for v in r.values() if v and v.replace(".", "", 1).isdigit() and "." in v]
    assert cells and all(len(v.split(".")[1]) <= 9 for v in cells), cells  # nanoseconds at most
    json_rows = json.loads(_run(["report", "--results", str(results_file), "--format", "json"])[1])
    for r, j in zip(rows, json_rows, strict=True):  # the same figures, rounded to the nanosecond
        for k, v in j.items():
            if isinstance(v, float):
                assert float(r[k]) == pytest.approx(v, abs=1e-9)


def test_data_until_line() -> None:
    from servelens.cli.report import data_until

    assert data_until(1_800_000_000.0, 1_800_000_012.4) == (
        "data up to 2027-01-15 08:00:00 UTC (12 s ago), the last scrape: requests that ended since then are "
        "counted after the next scrape")


def test_cli_garbage_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"index": 1}\n')
    rc, _, err = _run(["report", "--results", str(bad)])
    assert rc == 2 and "bad.jsonl:1" in err and err.count("\n") == 1
    txt = tmp_path / "m.txt"
    txt.write_text("this is { not exposition\n")
    rc, _, err = _run(["report", "--metrics", str(txt)])
    assert rc == 2 and err.count("\n") == 1
    scrape = tmp_path / "scrape.txt"  # a /metrics scrape given to --results: pointed at --metrics
    scrape.write_text("# HELP x a\n# TYPE x counter\nx_total 1\n")
    rc, _, err = _run(["report", "--results", str(scrape)])
    assert rc == 2 and err.count("\n") == 1 and "use --metrics" in err


def test_cli_results_use_the_bench_runs_buckets_and_refuse_the_summary(results_file: Path) -> None:
    summary = results_file.parent / "summary.json"
    summary.write_text(json.dumps({"format": "servelens-bench-summary/1", "config": {"isl_buckets": [1024, 4096]}}))
    rc, out, _ = _run(["report", "--results", str(results_file.parent), "--format", "csv"])
    assert rc == 0 and "0-1024" in out and "4097+" in out and "513-1024" not in out
    rc, out, _ = _run(["report", "--results", str(results_file), "--format", "csv", "--isl-buckets", "512"])
    assert rc == 0 and "513+" in out  # the flag wins
    rc, _, err = _run(["report", "--results", str(summary)])
    assert rc == 2 and "is the bench's summary; give its results.jsonl" in err and err.count("\n") == 1


@pytest.mark.parametrize(("prefix", "edges", "said"), [
    ("servelens", None, "(TTFT edges 2^(1/8) apart (servelens' fine edges, 0.977 ms to 128 s): within 9.8 % of "
     "the value; ITL gaps of 0, chunks read together, share the first of fine ITL edges with gaps up to 0.12 ms)"),
    ("dynamo_frontend", None, "(with Dynamo's edges TTFT jumps 0.47 s, 1 s, 2.2 s; ITL gaps of 0, chunks read "
     "together, share the first of Dynamo's ITL edges with gaps up to 1.8 ms)"),
    ("servelens", "custom", "(TTFT edges as the server was given them; ITL gaps of 0, chunks read together, "
     "share the first of fine ITL edges with gaps up to 0.12 ms)"),
])
def test_interpolation_note_describes_the_edges_scraped(tmp_path: Path, prefix: str, edges: str | None,
                                                        said: str) -> None:
    """The note under a server-side table quoted Dynamo's edges ("TTFT jumps 0.47 s, 1 s, 2.2 s") whatever
    the scrape held; it now says which edges the histograms have."""
    from servelens.core.edges import MetricEdges

    kw = {"edges": MetricEdges(ttft_s=(0.01, 0.1, 1.0))} if edges else {}
    m = FrontendMetrics(isl_buckets=BUCKETS, prefix=prefix, **kw)  # type: ignore[arg-type]
    m.register_model("a")
    feed(m, synthetic_samples(30, BUCKETS, seed=2), "a")
    path = tmp_path / "m.txt"
    path.write_bytes(m.exposition())
    rep = report_from_metrics(str(path), MetricNames(prefix))
    text = format_rows(list(rep.rows), "markdown")
    note = ("percentiles interpolated inside the histograms' le buckets: off by up to a bucket's width " + said)
    assert note in text.splitlines()
    assert ("Dynamo" in text) == (prefix == "dynamo_frontend")
    html_page = render_html(list(rep.rows))
    assert html_page.count(note.replace("'", "&#x27;")) == 1
