"""detect_clumping at its exact thresholds and ClumpingReport.line word for word (issue 21)."""

import itertools

import pytest

from servelens.core.clumping import ClumpingReport, detect_clumping

MS = 1_000_000


def one_stream(gaps_ns: list[int]) -> list[list[int]]:
    return [list(itertools.accumulate(gaps_ns, initial=0))]


# 25 gaps of 0 (near), 16 of exactly 1 ms (not near: the bound is strict) and one of 4 ms (20 ms between
# them, neither near nor long), 8 of exactly 10 ms (long: the bound is inclusive) = 80 ms.
# 50 gaps, near fraction 25/50 = 0.5, long share 80/100 = 0.8: every threshold met exactly.
AT_THRESHOLDS = [0] * 25 + [MS] * 16 + [4 * MS] + [10 * MS] * 8


def test_every_threshold_met_exactly_is_clumped() -> None:
    rep = detect_clumping(one_stream(AT_THRESHOLDS))
    assert rep == ClumpingReport(gaps=50, near_zero_fraction=0.5, long_time_share=0.8, clumped=True,
                                 near_zero_ns=MS)


def test_one_gap_fewer_than_min_gaps_is_not_flagged() -> None:
    gaps = [0] * 25 + [MS] * 15 + [5 * MS] + [10 * MS] * 8  # 49 gaps, fraction 25/49, share 0.8
    assert detect_clumping(one_stream(gaps)).clumped is False
    assert detect_clumping(one_stream(gaps), min_gaps=49).clumped is True


def test_the_long_bound_is_near_zero_ns_times_long_factor() -> None:
    # with a 2 ms near-zero bound and factor 3: 1 ms is near, 2 ms is not, 6 ms is long, 5.9 ms is not
    rep = detect_clumping(one_stream([MS, 2 * MS, 6 * MS, 5_900_000]), near_zero_ns=2 * MS, long_factor=3,
                          min_gaps=1)
    assert rep.gaps == 4 and rep.near_zero_fraction == 0.25 and rep.near_zero_ns == 2 * MS
    assert rep.long_time_share == 6 / 14.9


def test_a_time_going_back_is_a_gap_of_zero() -> None:
    rep = detect_clumping([[10 * MS, 0, 10 * MS]], min_gaps=1)
    assert (rep.gaps, rep.near_zero_fraction, rep.long_time_share, rep.clumped) == (2, 0.5, 1.0, True)


def test_no_gaps_reads_zero_and_is_not_clumped() -> None:
    assert detect_clumping([]) == ClumpingReport(0, 0.0, 0.0, False, MS)
    assert detect_clumping([[5], []], min_gaps=0) == ClumpingReport(0, 0.0, 0.0, False, MS)


def test_the_smallest_bounds_allowed() -> None:
    assert detect_clumping([[0, 0]], near_zero_ns=1).near_zero_fraction == 1.0
    assert detect_clumping([[0, 0]], long_factor=1.5).gaps == 1
    with pytest.raises(ValueError, match=r"^near_zero_ns must be >= 1, got 0$"):
        detect_clumping([], near_zero_ns=0)
    with pytest.raises(ValueError, match=r"^long_factor must be > 1, got 1$"):
        detect_clumping([], long_factor=1)


def test_the_lines_word_for_word() -> None:
    assert ClumpingReport(40, 0.25, 0.5, False).line() == "token arrival: no clumping (25% of 40 chunk gaps near 0)"
    assert ClumpingReport(50, 0.5, 0.8, True, 1_500_000).line() == (
        "WARNING: tokens arrive in clumps: 50% of 50 chunk gaps are under 1.5 ms and 80% of the time is in "
        "long gaps; a proxy is buffering the stream (nginx: proxy_buffering off, or X-Accel-Buffering: no): "
        "client ITL and TTFT are not the engine's")
    # the default bound reads "1 ms" (a divisor off by one part in a million would read 0.999999)
    assert "are under 1 ms and" in ClumpingReport(50, 0.5, 0.8, True).line()
