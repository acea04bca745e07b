"""``servelens report --metrics``: swapped or reset scrapes, and buckets that do not match the server's."""

from __future__ import annotations

import csv
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.prometheus.frontend import FrontendMetrics
from servelens.testing.exporter import feed, synthetic_samples

BUCKETS = IslBuckets.parse("512,1024,2048")


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def scrapes(tmp_path: Path) -> tuple[Path, Path, Path]:
    """An earlier and a later scrape of one server, and a scrape of a restarted one (fewer counts)."""
    m = FrontendMetrics(isl_buckets=BUCKETS)
    m.register_model("a")
    feed(m, synthetic_samples(40, BUCKETS, seed=1), "a")
    before = tmp_path / "before.txt"
    before.write_bytes(m.exposition())
    feed(m, synthetic_samples(40, BUCKETS, seed=2), "a")
    after = tmp_path / "after.txt"
    after.write_bytes(m.exposition())
    fresh = FrontendMetrics(isl_buckets=BUCKETS)
    fresh.register_model("a")
    feed(fresh, synthetic_samples(8, BUCKETS, seed=3), "a")
    restarted = tmp_path / "restarted.txt"
    restarted.write_bytes(fresh.exposition())
    return before, after, restarted


def _csv_rows(out: str) -> dict[str, dict[str, float | None]]:
    return {r["bucket"]: {k: (float(v) if v not in ("", "True", "False") else None) for k, v in r.items()
                          if k not in ("bucket", "ttft_le_edges", "itl_le_edges")}
            for r in csv.DictReader(io.StringIO(out))}


def test_difference_of_two_scrapes_in_order(scrapes: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """``--metrics after --metrics-before before`` reports what happened between them: every figure of
    every bucket is that of a server that saw only the second batch of requests."""
    before, after, _ = scrapes
    rc, out, err = _run(["report", "--metrics", str(after), "--metrics-before", str(before), "--format", "csv"])
    assert rc == 0, err
    only = FrontendMetrics(isl_buckets=BUCKETS)
    only.register_model("a")
    feed(only, synthetic_samples(40, BUCKETS, seed=2), "a")
    second = tmp_path / "second_only.txt"
    second.write_bytes(only.exposition())
    rc, want, err = _run(["report", "--metrics", str(second), "--format", "csv"])
    assert rc == 0, err
    got, expected = _csv_rows(out), _csv_rows(want)
    assert list(got) == list(expected) == [*BUCKETS.labels, "all"]
    assert got["all"]["requests"] == 40
    for label, row in expected.items():
        assert {k for k, v in got[label].items() if v is None} == {k for k, v in row.items() if v is None}, label
        assert {k: v for k, v in got[label].items() if v is not None} == pytest.approx(
            {k: v for k, v in row.items() if v is not None}, rel=1e-9, abs=1e-9), label  # CSV: to the ns
    assert sum(1 for r in expected.values() if r["ttft_p50_s"] is not None) >= 3  # figures to compare, not blanks


@pytest.mark.parametrize("which", ["swapped", "restarted"])
def test_counters_that_decreased_are_a_one_line_error(scrapes: tuple[Path, Path, Path], which: str) -> None:
    before, after, restarted = scrapes
    later, earlier = (before, after) if which == "swapped" else (restarted, after)
    rc, out, err = _run(["report", "--metrics", str(later), "--metrics-before", str(earlier)])
    assert rc == 2 and out == ""
    assert err.startswith("servelens: error: counters decreased between the two scrapes") and err.count("\n") == 1
    assert "swapped" in err and "restarted" in err


def test_isl_buckets_that_do_not_match_the_server_are_a_one_line_error(scrapes: tuple[Path, Path, Path]) -> None:
    _, after, _ = scrapes
    rc, out, err = _run(["report", "--metrics", str(after), "--isl-buckets", "100,200"])
    assert rc == 2 and out == ""
    assert err.count("\n") == 1
    assert "0-512, 513-1024, 1025-2048, 2049+" in err and "--isl-buckets 512,1024,2048" in err
    # the server's own buckets without --isl-buckets, or matching boundaries
    for extra in ([], ["--isl-buckets", "512,1024,2048"]):
        rc, out, err = _run(["report", "--metrics", str(after), "--format", "csv", *extra])
        assert rc == 0, err
        assert [line.split(",")[0] for line in out.splitlines()[1:4]] == ["0-512", "513-1024", "1025-2048"]
        assert "101-200" not in out
