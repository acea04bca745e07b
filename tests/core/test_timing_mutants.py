"""Request timing behaviours that mutation testing found unchecked (scripts/mutation.py, docs/mutation.md).

The ITL histogram has two paths: a plain loop under ``_VECTORISE_FROM`` chunks without ``keep_values``
(the one the gateway uses for most requests), and a vectorised one. Both are checked against exact counts.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np
import pytest

from servelens.core import timing
from servelens.core.timing import RequestTimer, itl_histogram

MS = 1_000_000
EDGES = (0.005, 0.01, 0.02, 0.05, 1.0)
LONG = timing._VECTORISE_FROM + 2  # chunks: the vectorised path


def expected_counts(values: list[float]) -> list[int]:
    counts = [0] * (len(EDGES) + 1)
    for v in values:
        counts[bisect_left(EDGES, v)] += 1
    return counts


@pytest.mark.parametrize("n", [3, LONG])
def test_one_token_chunks_exact_counts_sum_and_no_values_unless_asked(n: int) -> None:
    times = [i * 3 * MS for i in range(n)]  # gaps of 3 ms: all in the first bucket, the top ones empty
    hist, values = itl_histogram(times, {}, EDGES)
    assert values == ()
    assert hist.counts == expected_counts([0.003] * (n - 1))
    assert len(hist.counts) == len(EDGES) + 1
    assert all(type(c) is int for c in hist.counts)
    assert hist.sum == pytest.approx(0.003 * (n - 1))


@pytest.mark.parametrize("n", [4, LONG])
def test_multi_token_chunks_exact_counts_and_no_values_unless_asked(n: int) -> None:
    times = [i * 30 * MS for i in range(n)]
    tokens = {n - 1: 3}  # the last chunk: 3 tokens after 30 ms, so three ITLs of 10 ms
    hist, values = itl_histogram(times, tokens, EDGES)
    assert values == ()
    assert hist.counts == expected_counts([0.030] * (n - 2) + [0.010] * 3)
    assert all(type(c) is int for c in hist.counts) and len(hist.counts) == len(EDGES) + 1
    assert hist.sum == pytest.approx(0.030 * (n - 2) + 0.030)


def test_loop_path_clamps_a_clock_going_back_to_zero() -> None:
    # the loop path (few chunks, no values kept) is what the gateway runs for a short reply
    hist, _ = itl_histogram([10 * MS, 40 * MS, 30 * MS, 50 * MS], {}, EDGES)
    assert hist.counts == expected_counts([0.030, 0.0, 0.020])
    assert hist.sum == pytest.approx(0.050)


def test_the_timer_keeps_no_values_and_no_token_counts_by_default() -> None:
    t = RequestTimer(0, EDGES)
    assert t.keep_values is False
    for i in range(1, 4):
        t.output(i * MS)
    t.output(5 * MS, tokens=1)
    t.output(6 * MS, tokens=0)  # < 1 counts as 1
    assert t.chunk_tokens == {}  # only chunks of more than one token are remembered
    t.output(9 * MS, tokens=2)
    assert t.chunk_tokens == {5: 2} and t.output_tokens == 7
    rec = t.finish(10 * MS, "success")
    assert rec.itl_values_s == ()
    assert rec.error_type == "" and rec.ok


def test_finish_copies_every_field_into_the_record() -> None:
    t = RequestTimer(100 * MS, EDGES)
    t.output(150 * MS)
    t.output(160 * MS)
    rec = t.finish(200 * MS, "error", error_type="cancelled", isl=11, osl=22, cached_tokens=5)
    assert (rec.arrival_ns, rec.first_output_ns, rec.end_ns) == (100 * MS, 150 * MS, 200 * MS)
    assert (rec.isl, rec.osl, rec.cached_tokens) == (11, 22, 5)
    assert (rec.status, rec.error_type, rec.ok) == ("error", "cancelled", False)
    assert (rec.output_chunks, rec.output_tokens) == (2, 2)
    assert rec.ttft_s == pytest.approx(0.050) and rec.duration_s == pytest.approx(0.100)


def test_itl_per_chunk_of_fewer_than_two_chunks_is_empty() -> None:
    for times in ([], [5 * MS]):
        values, weights = timing.itl_per_chunk(times, {})
        assert values.shape == (0,) and values.dtype == np.float64 and weights is None
