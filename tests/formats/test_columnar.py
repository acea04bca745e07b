"""The columnar results folder: written by the bench's writer or converted from JSONL, read back to the
same records, and the report's table and p95-over-time from it identical to the JSONL path's; bad
folders give one line; the reader's memory is per-request arrays and fixed-size blocks, by definition."""

import json
from pathlib import Path

import numpy as np
import pytest

from servelens.core import selection
from servelens.core.buckets import IslBuckets
from servelens.core.decompose import counterfactual, observed_quantiles
from servelens.core.summary import rows_from_samples
from servelens.core.windows import BinnedSampleWindow, Mix, PerRequestWindow, SampleWindow
from servelens.formats import columnar, columnar_write
from servelens.formats.columnar import COLUMNS_DIR, columns_for, iter_columns, open_columns
from servelens.formats.columnar_write import convert_jsonl, export_jsonl, write_columnar
from servelens.formats.results import BenchRecord, load_results, to_samples, write_results
from servelens.report import columnar as report_columnar
from servelens.report.results import load_timed_samples
from servelens.report.sources import p95_over_time, report_from_results


def random_records(n: int, seed: int = 7) -> list[BenchRecord]:
    """Requests with every case the definitions have: multi-token chunks, chunks read together (one
    timestamp), failures without output, unknown server ISL and cached tokens, one-chunk outputs."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ok = rng.random() > 0.1
        chunks = int(rng.integers(1, 60)) if ok else 0
        gaps = rng.integers(0, 80_000_000, max(chunks - 1, 0))
        gaps[rng.random(gaps.size) < 0.05] = 0  # read together
        first = [int(rng.integers(1, 2_000_000_000))]
        offs: list[int] = np.cumsum(np.concatenate((first, gaps))).tolist() if chunks else []
        toks = tuple(int(t) for t in np.where(rng.random(chunks) < 0.1, rng.integers(2, 5, chunks), 1))
        send = 5_000_000_000 + i * 3_000_000
        isl = int(rng.integers(1, 20_000))
        out.append(BenchRecord(
            index=i, request_id=f"r{i}" if i % 7 else None, scheduled_ns=i * 1000, send_ns=send,
            wall_send_ns=(1_764_000_000_000_000_000 + i * 37_123_457) if i % 11 else 0,
            first_output_ns=send + int(offs[0]) if chunks else None, end_ns=send + (int(offs[-1]) if chunks else 9),
            chunk_offsets_ns=tuple(int(o) for o in offs), chunk_tokens=toks, tokens_from_usage=bool(i % 2),
            isl_target=isl, isl_server=isl + int(rng.integers(-3, 4)) if i % 3 else None, osl_target=64,
            osl=sum(toks) if ok else None, cached_tokens=int(rng.integers(0, isl)) if i % 4 else None,
            status="success" if ok else "error", error_type="" if ok else "overload",
            error="" if ok else 'HTTP 429: "busy"\n', http_status=200 if ok else (429 if i % 2 else None),
        ))
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("run")
    write_results(d / "results.jsonl", random_records(1500))
    return d


def test_round_trip_records_and_jsonl(run_dir: Path, tmp_path: Path) -> None:
    records = load_results(run_dir / "results.jsonl")
    cols = write_columnar(tmp_path / COLUMNS_DIR, records)
    assert list(iter_columns(cols)) == records
    export_jsonl(cols, tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_bytes() == (run_dir / "results.jsonl").read_bytes()
    c = open_columns(cols)
    assert c.requests == 1500 and c.weighted
    assert c.chunks == sum(len(r.chunk_offsets_ns) for r in records)
    assert np.load(cols / "itl_s.npy", mmap_mode="r").dtype == np.float64  # ordinary .npy files


@pytest.mark.parametrize("by, spec", [("isl", "512,1024,4096,8192"), ("uncached", "256,2048"),
                                      ("isl", "16384")])
def test_same_table_as_jsonl(run_dir: Path, tmp_path: Path, by: str, spec: str) -> None:
    buckets = IslBuckets.parse(spec)
    old = report_from_results(run_dir / "results.jsonl", buckets, by)
    cols = convert_jsonl(run_dir / "results.jsonl", tmp_path / COLUMNS_DIR)
    new = report_from_results(cols, buckets, by)
    assert new.rows == old.rows  # every float to the last bit
    assert new.timeseries == old.timeseries
    assert any(r.itl_p99_s for r in new.rows) and (by == "uncached" or new.timeseries)


def test_time_series_with_fixed_bins(run_dir: Path, tmp_path: Path) -> None:
    buckets = IslBuckets.default()
    cols = convert_jsonl(run_dir, tmp_path / COLUMNS_DIR)
    timed = report_columnar.timed_ttft(cols, buckets)
    for bins in (1, 4, 17):
        assert report_columnar.p95_over_time_columns(timed, buckets, bins) == p95_over_time(
            load_timed_samples(run_dir / "results.jsonl"), buckets, bins)


def test_converted_folder_is_used_for_its_jsonl_until_the_jsonl_changes(
        run_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    jsonl = tmp_path / "results.jsonl"
    jsonl.write_bytes((run_dir / "results.jsonl").read_bytes())
    assert columns_for(jsonl) is None
    cols = convert_jsonl(jsonl)
    assert cols == tmp_path / COLUMNS_DIR and columns_for(jsonl) == cols and columns_for(tmp_path) == cols
    assert report_from_results(jsonl, IslBuckets.default()).source == f"results {cols}"
    with open(jsonl, "ab") as f:  # the JSONL grew: the folder no longer stands for it
        f.write(b"\n")
    with caplog.at_level("WARNING", logger="servelens.results"):
        assert columns_for(jsonl) is None
        assert report_from_results(jsonl, IslBuckets.default()).source == f"results file {jsonl}"
    # the reader is told, once, that the columns beside it were passed over and how to rebuild them
    notes = [r.getMessage() for r in caplog.records if "--convert" in r.getMessage()]
    assert len(notes) == 1 and str(cols) in notes[0], notes


def test_rows_equal_the_samples_definition(run_dir: Path, tmp_path: Path) -> None:
    records = load_results(run_dir / "results.jsonl")
    cols = write_columnar(tmp_path / COLUMNS_DIR, records)
    buckets = IslBuckets.default()
    assert report_columnar.rows_from_columns(cols, buckets) == rows_from_samples(to_samples(records), buckets)


def test_single_token_chunks_have_no_weight_file(tmp_path: Path) -> None:
    records = [r for r in random_records(200, seed=3) if all(t == 1 for t in r.chunk_tokens)]
    cols = write_columnar(tmp_path / COLUMNS_DIR, records)
    assert not open_columns(cols).weighted and not (cols / "itl_weight.npy").exists()
    buckets = IslBuckets.default()
    assert report_columnar.rows_from_columns(cols, buckets) == rows_from_samples(to_samples(records), buckets)


def test_truncated_and_foreign_folders_give_one_line(run_dir: Path, tmp_path: Path) -> None:
    cols = convert_jsonl(run_dir, tmp_path / COLUMNS_DIR)
    buckets = IslBuckets.default()
    data = (cols / "itl_s.npy").read_bytes()
    (cols / "itl_s.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated") as exc:
        report_from_results(cols, buckets)
    assert "\n" not in str(exc.value)
    (cols / "meta.json").write_text(json.dumps({"format": "something/9"}))
    with pytest.raises(ValueError, match=r"not a servelens-bench-columns/1 folder"):
        open_columns(cols)
    (cols / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        open_columns(cols)
    with pytest.raises(ValueError, match=r"no readable meta\.json"):
        open_columns(tmp_path)


def test_reader_holds_arrays_and_blocks_not_objects(run_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory linear in requests by definition: every block the ITL pass sees is a flat float64 array
    of at most BLOCK values (plus one request's), and no record or sample object is made."""
    cols = convert_jsonl(run_dir, tmp_path / COLUMNS_DIR)
    monkeypatch.setattr(report_columnar, "BLOCK", 1000)
    seen: list[tuple[np.dtype, int, int]] = []
    real = selection.block_percentiles

    def spy(blocks, groups, rows, qs, counts=None):  # type: ignore[no-untyped-def]
        def watched():  # type: ignore[no-untyped-def]
            for lengths, runs, bins, w, values_at in blocks():
                seen.append((bins.dtype, bins.ndim, bins.size))
                assert runs.shape == lengths.shape and int(lengths.sum()) == bins.size  # a group per request
                assert w is None or w.shape == bins.shape
                yield lengths, runs, bins, w, values_at
        return real(watched, groups, rows, qs, counts)

    monkeypatch.setattr(report_columnar, "block_percentiles", spy)
    monkeypatch.setattr(columnar, "BenchRecord", None)  # building a record would fail
    longest = int(np.diff(open_columns(cols).column("itl_start")).max())
    for buckets, passes in ((IslBuckets.parse("1000,4000"), 2), (IslBuckets.default(), 1)):
        seen.clear()
        report_columnar.rows_from_columns(cols, buckets)
        assert seen and all(d == np.uint16 and nd == 1 and size <= 1000 + longest for d, nd, size in seen)
        # every value once a pass; with the buckets the writer counted (the default), pass 1 is its counts
        assert sum(s for _, _, s in seen) == passes * open_columns(cols).itl_values


def _blocks(lengths: np.ndarray, runs: np.ndarray, v: np.ndarray, w: np.ndarray | None,
            size: int) -> list[selection.Block]:
    """Blocks of about ``size`` values cut at run boundaries."""
    out: list[selection.Block] = []
    ends = np.cumsum(lengths)
    r0 = 0
    while r0 < runs.size:
        r1 = max(int(np.searchsorted(ends, ends[r0] - lengths[r0] + size, side="right")), r0 + 1)
        a, b = int(ends[r0] - lengths[r0]), int(ends[r1 - 1])
        part = v[a:b]

        def values_at(pos: np.ndarray, part: np.ndarray = part) -> np.ndarray:
            return part[pos]

        out.append((lengths[r0:r1], runs[r0:r1], selection.value_bins(part), None if w is None else w[a:b], values_at))
        r0 = r1
    return out


@pytest.mark.parametrize("trial", range(40))
def test_block_percentiles_equal_numpy_on_the_expanded_values(trial: int) -> None:
    """Exact by definition: numpy's percentile of ``np.repeat(values, weights)`` of each row's groups,
    with ties, zeros, zero weights, groups in no row, rows of several groups and runs of one value
    or several (a request's values share its group)."""
    rng = np.random.default_rng(trial)
    n_runs = int(rng.integers(1, 800))
    lengths = rng.integers(1 if trial % 3 else 0, 8 if trial % 4 else 2, n_runs)
    runs = rng.integers(0, 5, n_runs)  # group 4 is in no row
    g = np.repeat(runs, lengths)
    n = g.size
    v = np.round(rng.lognormal(-3.5, 0.6, n), int(rng.integers(3, 10)))
    if trial % 5 == 0:
        v[: n // 3] = 0.0
    w = rng.integers(0, 4, n) if trial % 2 else None
    rows = [[0], [1], [2], [3], [0, 1, 2, 3], []]
    qs = [50.0, 95.0, 99.0, 0.0, 100.0, 37.3]
    blocks = _blocks(lengths, runs, v, w, 257)
    assert sum(b[2].size for b in blocks) == n
    got = selection.block_percentiles(lambda: iter(blocks), 5, rows, qs)
    for r, members in enumerate(rows):
        mine = np.isin(g, members)
        expanded = np.repeat(v[mine], (np.ones(n, np.int64) if w is None else w)[mine])
        for i, q in enumerate(qs):
            assert got[r][i] == (float(np.percentile(expanded, q)) if expanded.size else None)


@pytest.mark.parametrize("seed, single", [(11, False), (12, True)])
def test_arrays_batch_writes_the_same_folder(tmp_path: Path, seed: int, single: bool) -> None:
    records = random_records(400, seed)
    if single:  # the vectorised path: one token per chunk, no chunks read together
        records = [r for r in records if all(t == 1 for t in r.chunk_tokens)
                   and len(set(r.chunk_offsets_ns)) == len(r.chunk_offsets_ns)]
    one = write_columnar(tmp_path / "one", records)
    with columnar_write.ColumnarWriter(tmp_path / "batch") as w:
        for part in (records[:150], records[150:]):
            fields = {f: np.array([columnar.NULL if getattr(r, f) is None else getattr(r, f) for r in part])
                      for f in columnar.INT_FIELDS}
            fields |= {"ok": np.array([r.ok for r in part]),
                       "tokens_from_usage": np.array([r.tokens_from_usage for r in part])}
            offs = np.array([o for r in part for o in r.chunk_offsets_ns], dtype=np.int64)
            toks = np.array([t for r in part for t in r.chunk_tokens], dtype=np.int64)
            text = [json.dumps([r.request_id, r.status, r.error_type, r.error], separators=(",", ":")).encode()
                    + b"\n" for r in part]
            w.add_arrays(fields, np.array([len(r.chunk_offsets_ns) for r in part]), offs, toks, text)
    for f in sorted(p.name for p in one.iterdir()):
        assert (tmp_path / "batch" / f).read_bytes() == (one / f).read_bytes(), f


def test_cli_convert_report_export_and_bad_folders(run_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from servelens.cli.main import main

    jsonl = tmp_path / "results.jsonl"
    jsonl.write_bytes((run_dir / "results.jsonl").read_bytes())
    assert main(["report", "--results", str(jsonl), "--format", "csv"]) == 0
    old = capsys.readouterr().out
    assert main(["report", "--results", str(jsonl), "--convert"]) == 0
    assert f"wrote {tmp_path / COLUMNS_DIR}" in capsys.readouterr().err
    for given in (tmp_path, tmp_path / COLUMNS_DIR, jsonl):
        assert main(["report", "--results", str(given), "--format", "csv"]) == 0
        assert capsys.readouterr().out == old
    assert main(["report", "--results", str(tmp_path), "--export-jsonl", str(tmp_path / "x.jsonl")]) == 0
    assert (tmp_path / "x.jsonl").read_bytes() == jsonl.read_bytes()
    capsys.readouterr()
    data = (tmp_path / COLUMNS_DIR / "ttft_s.npy").read_bytes()
    (tmp_path / COLUMNS_DIR / "ttft_s.npy").write_bytes(data[:200])
    assert main(["report", "--results", str(tmp_path / COLUMNS_DIR)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servelens: error: ") and "truncated" in err and err.count("\n") == 1
    (tmp_path / COLUMNS_DIR / "meta.json").write_text('{"format": "parquet?"}')
    assert main(["report", "--results", str(tmp_path / COLUMNS_DIR)]) == 2
    err = capsys.readouterr().err
    assert "not a servelens-bench-columns/1 folder" in err and err.count("\n") == 1
    assert main(["report", "--results", str(tmp_path / COLUMNS_DIR), "--convert"]) == 2
    assert "columns already" in capsys.readouterr().err
    assert main(["report", "--metrics", "x.txt", "--convert"]) == 2
    assert "give --results" in capsys.readouterr().err


def test_explain_reads_columns_as_records(run_dir: Path, tmp_path: Path) -> None:
    from servelens.report.explain_windows import from_results

    other = tmp_path / "other"
    write_results(other / "results.jsonl", random_records(300, seed=9))
    a, b = convert_jsonl(run_dir, tmp_path / "a.cols"), convert_jsonl(other, tmp_path / "b.cols")
    by_jsonl = from_results(str(run_dir / "results.jsonl"), str(other / "results.jsonl"))
    every_value = from_results(str(a), str(b), values=True)
    assert every_value.windows == by_jsonl.windows and every_value.requests == by_jsonl.requests
    compact = from_results(str(a), str(b))
    assert compact.requests == by_jsonl.requests
    for m in ("TTFT", "duration"):
        assert compact.windows[m] == by_jsonl.windows[m]
    for x, y in zip(compact.windows["ITL"], by_jsonl.windows["ITL"], strict=True):
        assert isinstance(x, BinnedSampleWindow) and isinstance(y, SampleWindow)
        assert_same_samples(x, y)


def assert_same_samples(a: PerRequestWindow, b: PerRequestWindow) -> None:
    """Two per-request windows hold the same samples, whatever their form: counts, exact sums, every
    request's size and sum, and every quantile (all, per bucket, a mixture of the buckets)."""
    assert a.labels == b.labels and a.unbucketed == b.unbucketed
    assert a.counts().tolist() == b.counts().tolist() and a.sums().tolist() == b.sums().tolist()
    for x, y in zip(a.request_table(), b.request_table(), strict=True):
        assert x.tolist() == y.tolist()
    qs = (0.0, 0.01, 0.37, 0.5, 0.95, 0.99, 1.0)
    for bucket in (None, *range(len(a.labels))):
        assert observed_quantiles(a, qs, bucket) == observed_quantiles(b, qs, bucket)
    counts = a.counts()
    mix = Mix(a.labels, tuple(float(k + 1) if c > 0 else 0.0 for k, c in enumerate(counts)))
    assert counterfactual(a, mix, qs) == counterfactual(b, mix, qs)


def _explain(*argv: str) -> str:
    import io
    from contextlib import redirect_stdout

    from servelens.cli.main import main

    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["explain", *argv]) == 0
    return out.getvalue()


def test_explain_from_columns_is_the_record_path(tmp_path: Path) -> None:
    from servelens.report.explain_windows import METRICS, from_results

    jsonl, cols = [], []
    for name, seed in (("before", 3), ("after", 4)):
        records = random_records(600, seed)
        write_results(tmp_path / name / "results.jsonl", records)
        write_columnar(tmp_path / f"{name}.cols" / COLUMNS_DIR, records)
        jsonl.append(str(tmp_path / name / "results.jsonl"))
        cols.append(str(tmp_path / f"{name}.cols" / COLUMNS_DIR))
    buckets = IslBuckets((1000, 4000, 8000, 16000))
    old = from_results(jsonl[0], jsonl[1], buckets)
    new = from_results(cols[0], cols[1], buckets)
    assert isinstance(new.windows["ITL"][0], BinnedSampleWindow)  # no value held, no record
    for m in METRICS:
        for a, b in zip(old.windows[m], new.windows[m], strict=True):
            assert isinstance(a, SampleWindow)
            if m == "ITL":
                assert isinstance(b, BinnedSampleWindow)
            else:
                assert isinstance(b, SampleWindow) and a == b and a.sums().tolist() == b.sums().tolist()
            assert_same_samples(a, b)
    assert (old.before_s, old.after_s, old.requests) == (new.before_s, new.after_s, new.requests)
    assert from_results(cols[0], cols[1], buckets, slo=False).requests is None
    flags = ("--isl-buckets", "1000,4000,8000,16000", "--resamples", "200", "--slo-ttft", "1.0", "--slo-itl", "0.03")
    for fmt in ("table", "json"):
        got = [_explain("--results", *paths, *flags, "--format", fmt) for paths in (jsonl, cols)]
        assert got[0] == got[1].replace(".cols/results.cols", "/results.jsonl")
    plain = [_explain("--results", *paths, "--resamples", "200") for paths in (jsonl, cols)]
    assert plain[0] == plain[1].replace(".cols/results.cols", "/results.jsonl")
    normal = [_explain("--results", *paths, "--intervals", "normal", "--format", "json") for paths in (jsonl, cols)]
    assert normal[0] == normal[1].replace(".cols/results.cols", "/results.jsonl")
    assert "normal approximation from per-request sums" in normal[0]


def _without_totals(cols: Path) -> None:
    """Make ``cols`` a folder as written before the writer kept totals and bin counts."""
    meta = json.loads((cols / "meta.json").read_text())
    for key in ("itl_totals", "itl_bin_counts_buckets"):
        meta.pop(key)
    (cols / "meta.json").write_text(json.dumps(meta))
    for name in ("itl_tokens.npy", "itl_sum_s.npy", columnar.BIN_COUNTS_FILE):
        (cols / name).unlink()


def test_what_the_writer_keeps_is_what_the_readers_compute(run_dir: Path, tmp_path: Path) -> None:
    """Per request its ITL tokens and reduceat sum, per ISL bucket and bin its tokens: the same
    integers and floats as one pass over the values computes, by every writer path."""
    from servelens.report.explain_columns import ColumnRun

    records = load_results(run_dir / "results.jsonl")
    buckets = IslBuckets.parse("1000,4000,8000")
    for cols in (write_columnar(tmp_path / "one", records, isl_buckets=buckets),
                 convert_jsonl(run_dir, tmp_path / "two")):
        c = open_columns(cols)
        run = ColumnRun(str(cols), buckets if cols.name == "one" else IslBuckets.default())
        tok, sums, _, counts = run._itl_pass(True, False, None)
        assert c.column("itl_tokens").tolist() == tok.tolist()
        assert c.column("itl_sum_s").tolist() == sums.tolist()
        assert (c.bin_counts() == counts[:-1]).all() and c.bin_count_buckets == run.boundaries
    assert open_columns(tmp_path / "two").bin_count_buckets == IslBuckets.default().boundaries  # no summary.json


def test_folders_without_kept_totals_give_the_same_figures(tmp_path: Path) -> None:
    """A folder written before the writer kept totals (or read with other buckets) is read with the
    passes: the same table and the same explanation."""
    records = [random_records(500, seed) for seed in (21, 22)]
    folders = [write_columnar(tmp_path / f"new{k}", r) for k, r in enumerate(records)]
    olds = [write_columnar(tmp_path / f"old{k}", r) for k, r in enumerate(records)]
    for cols in olds:
        _without_totals(cols)
    buckets = IslBuckets.default()
    for new, old in zip(folders, olds, strict=True):
        assert report_columnar.rows_from_columns(new, buckets) == report_columnar.rows_from_columns(old, buckets)
    for flags in ((), ("--isl-buckets", "1000,4000"), ("--slo-itl", "0.03")):
        got = [_explain("--results", str(a), str(b), "--format", "json", *flags) for a, b in (folders, olds)]
        assert got[0] == got[1].replace("/old", "/new")
    with pytest.raises(ValueError, match="no itl_tokens"):
        open_columns(olds[0]).column("itl_tokens")
    with pytest.raises(ValueError, match=r"no itl_bin_counts\.npy"):
        open_columns(olds[0]).bin_counts()
    np.save(folders[0] / columnar.BIN_COUNTS_FILE, np.zeros((2, 5), dtype=np.int64))
    with pytest.raises(ValueError, match="has shape"):
        report_columnar.rows_from_columns(folders[0], buckets)
