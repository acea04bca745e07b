"""The buffering-proxy detector on synthetic chunk times (int ns)."""

import itertools

import pytest

from servelens.core.clumping import detect_clumping

MS = 1_000_000


def stream(gaps_ns: list[int], start: int = 0) -> list[int]:
    return list(itertools.accumulate(gaps_ns, initial=start))


def test_an_engine_at_real_speed_is_not_clumped() -> None:
    rep = detect_clumping([stream([20 * MS] * 100)] * 4)
    assert not rep.clumped and rep.near_zero_fraction == 0 and rep.gaps == 400


def test_bursts_between_long_gaps_are_clumped() -> None:
    # as measured behind nginx's proxy_buffering: bursts of 12 chunks read together, 84 ms apart
    gaps = ([0] * 11 + [84 * MS]) * 10
    rep = detect_clumping([stream(gaps)] * 3)
    assert rep.clumped and rep.near_zero_fraction == pytest.approx(11 / 12, abs=0.01)
    assert rep.long_time_share == 1.0 and "WARNING" in rep.line() and "proxy_buffering" in rep.line()


def test_a_very_fast_engine_has_no_long_gaps_and_is_not_clumped() -> None:
    assert not detect_clumping([stream([300_000] * 200)]).clumped


def test_an_engine_sending_two_tokens_per_read_is_not_clumped() -> None:
    # half the gaps near 0, but the time is spread over 20 ms steps, not held in long gaps
    assert not detect_clumping([stream([0, 9 * MS] * 50)]).clumped


def test_few_gaps_are_never_flagged_and_gaps_never_span_two_streams() -> None:
    burst = [0] * 9 + [90 * MS]
    assert not detect_clumping([stream(burst * 4)]).clumped  # 39 gaps < 50
    # bursts only within streams, long waits only between them: no long gap seen
    rep = detect_clumping([stream([0] * 20, start=k * 100 * MS) for k in range(5)])
    assert rep.gaps == 100 and rep.long_time_share == 0 and not rep.clumped


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="near_zero_ns"):
        detect_clumping([], near_zero_ns=0)
    with pytest.raises(ValueError, match="long_factor"):
        detect_clumping([], long_factor=1)
