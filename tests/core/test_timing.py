import pytest

from servelens.core.edges import ITL_EDGES_S
from servelens.core.timing import RequestTimer

MS = 1_000_000
EDGES = tuple(float(e) for e in ITL_EDGES_S)


def test_ttft_itl_duration() -> None:
    t = RequestTimer(arrival_ns=1000 * MS, itl_edges=EDGES, keep_values=True)
    assert t.output(1050 * MS) is True
    assert t.output(1060 * MS) is False
    rec = t.finish(1100 * MS, "success", isl=10, osl=2, cached_tokens=None)
    assert rec.ttft_s == pytest.approx(0.050)
    assert rec.itl_values_s == pytest.approx((0.010,))
    assert rec.duration_s == pytest.approx(0.100)
    assert rec.itl.count == 1
    assert rec.cached_tokens is None  # unknown stays unknown
    assert rec.ok


def test_multi_token_chunk_splits_itl_per_token() -> None:
    # a chunk of 3 tokens after a 30 ms gap gives three ITL values of 10 ms
    t = RequestTimer(0, EDGES, keep_values=True)
    t.output(5 * MS)
    t.output(35 * MS, tokens=3)
    rec = t.finish(40 * MS, "success", osl=4)
    assert rec.itl_values_s == pytest.approx((0.010, 0.010, 0.010))
    assert rec.itl.count == 3
    assert rec.itl.sum == pytest.approx(0.030)
    # 10 ms falls in the (0.0059, 0.011] bucket
    idx = EDGES.index(0.011)
    assert rec.itl.counts[idx] == 3
    assert rec.output_tokens == 4 and rec.output_chunks == 2


def test_first_chunk_extra_tokens_get_no_itl() -> None:
    t = RequestTimer(0, EDGES, keep_values=True)
    t.output(5 * MS, tokens=4)
    rec = t.finish(6 * MS, "success")
    assert rec.itl.count == 0 and rec.itl_values_s == ()
    assert rec.output_tokens == 4


@pytest.mark.parametrize("keep_values", [True, False])  # False: the loop path, the one the gateway uses
def test_durations_clamped_at_zero(keep_values: bool) -> None:
    t = RequestTimer(100 * MS, EDGES, keep_values=keep_values)
    t.output(90 * MS)  # clock skew between sources: never negative
    t.output(80 * MS)
    t.output(60 * MS, tokens=2)
    rec = t.finish(50 * MS, "success")
    assert rec.ttft_s == 0.0
    assert rec.duration_s == 0.0
    assert rec.itl.count == 3 and rec.itl.sum == 0.0 and rec.itl.counts[0] == 3  # three gaps of 0, none below
    assert rec.itl_values_s == ((0.0, 0.0, 0.0) if keep_values else ())


def test_no_output_means_no_ttft() -> None:
    t = RequestTimer(0, EDGES)
    rec = t.finish(7 * MS, "error", "backend_error")
    assert rec.ttft_s is None and rec.first_output_ns is None
    assert rec.itl.count == 0
    assert not rec.ok and rec.error_type == "backend_error"


def test_record_is_immutable() -> None:
    rec = RequestTimer(0, EDGES).finish(1, "success")
    with pytest.raises(AttributeError):
        rec.ttft_s = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("n", [10, 47, 48, 200])
def test_vectorised_and_loop_paths_agree(n: int) -> None:
    from servelens.core.timing import itl_histogram

    times = [i * 7 * MS + (i * 7919) % (3 * MS) for i in range(n)]
    times[4] = times[3] - 2 * MS  # clocks going backwards: clamped to 0 on both paths
    times[7] = times[6] - MS
    tokens = {3: 2, n - 1: 4}
    loop, _ = itl_histogram(times, tokens, EDGES, keep_values=False)
    vec, values = itl_histogram(times, tokens, EDGES, keep_values=True)  # keep_values forces numpy
    assert loop.counts == vec.counts
    assert loop.sum == pytest.approx(vec.sum)
    assert len(values) == loop.count == (n - 1) + 1 + 3


def test_chunks_read_together_share_the_gap_since_the_previous_read() -> None:
    """Three chunks in one read 30 ms after the previous read: 10 ms each, not 30, 0, 0 (issue 16: a
    quarter of a gateway's ITL observations were exactly 0 that way)."""
    t = RequestTimer(0, EDGES, keep_values=True)
    t.output(5 * MS)
    t.output(15 * MS)
    for _ in range(3):
        t.output(45 * MS)
    t.output(57 * MS, tokens=2)  # a read holding one 2-token chunk ...
    t.output(81 * MS, tokens=2)  # ... and one holding a 2-token chunk and a 1-token chunk
    t.output(81 * MS)
    rec = t.finish(90 * MS, "success")
    assert rec.itl_values_s == pytest.approx((0.010, 0.010, 0.010, 0.010, 0.006, 0.006, 0.008, 0.008, 0.008))
    assert rec.itl.count == rec.output_tokens - 1 == 9  # one value per token after the first, as before
    assert rec.itl.sum == pytest.approx(0.076)  # the gaps are kept whole: last chunk minus first


def test_chunks_read_with_the_first_get_zero() -> None:
    t = RequestTimer(0, EDGES, keep_values=True)
    t.output(5 * MS)
    t.output(5 * MS, tokens=2)
    t.output(25 * MS)
    rec = t.finish(30 * MS, "success")
    assert rec.itl_values_s == pytest.approx((0.0, 0.0, 0.020))


@pytest.mark.parametrize("n", [10, 47, 48, 200])
def test_vectorised_and_loop_paths_agree_with_reads_of_several_chunks(n: int) -> None:
    from servelens.core.timing import itl_histogram

    times = [(i // 3) * 7 * MS + ((i // 3) * 7919) % (3 * MS) for i in range(n)]  # three chunks per read
    times[5] = times[4] - MS  # a clock going backwards: 0, and a read of its own
    tokens = {3: 2, 4: 3, n - 1: 4}
    loop, _ = itl_histogram(times, tokens, EDGES, keep_values=False)
    vec, values = itl_histogram(times, tokens, EDGES, keep_values=True)
    assert loop.counts == vec.counts
    assert loop.sum == pytest.approx(vec.sum)
    assert len(values) == loop.count == (n - 1) + 1 + 2 + 3
    assert 0.0 not in values[3:5]  # the chunks read with chunk 3 share its gap
