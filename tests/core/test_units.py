"""Times in running text: one unit for the figures read together (explain's verdict lines and notes)."""

import pytest

from servelens.core.units import format_in, format_times, time_unit


def test_a_pair_shares_the_unit_of_its_larger_figure() -> None:
    # the verdict line read "77 ms -> 0.11 s", a note "+0.000139 s, not +0.000283 s (interaction +0.000145 s)"
    assert format_times(0.077, 0.11) == ("77 ms", "110 ms")
    assert format_times(0.077, 1.23) == ("0.077 s", "1.2 s")
    assert format_times(0.5, 1.23) == ("0.5 s", "1.2 s")
    assert format_times(0.000139, 0.000283, 0.000146, signed=True) == ("+0.14 ms", "+0.28 ms", "+0.15 ms")
    assert format_times(0.45, 0.0, signed=True) == ("+450 ms", "+0 ms")
    assert format_times(1.5, 0.0, signed=True) == ("+1.5 s", "+0 s")


@pytest.mark.parametrize(("x", "unit", "text"), [
    (9.84, "s", "9.8 s"), (2.0, "s", "2.0 s"), (45.67, "s", "45.7 s"), (510.0, "s", "510 s"), (99.97, "s", "100 s"),
    (0.0999, "ms", "100 ms"),
    (0.0125, "ms", "12 ms"), (0.00312, "ms", "3.1 ms"), (0.000122, "ms", "0.12 ms"), (2e-9, "ms", "0 ms"),
    (-0.0005, "ms", "-0.5 ms"), (0.999, "ms", "999 ms"), (None, "ms", "-"), (float("nan"), "s", "-"),
])
def test_two_significant_figures_no_exponent(x: float | None, unit: str, text: str) -> None:
    assert format_in(x, unit) == text


def test_unit_and_errors() -> None:
    assert (time_unit([0.999, None]), time_unit([1.0]), time_unit([-2.0, 0.1]), time_unit([])) == ("ms", "s", "s", "ms")
    assert format_in(float("inf"), "s", signed=True) == "+inf s"
    with pytest.raises(ValueError, match="unit must be 's' or 'ms'"):
        format_in(1.0, "us")
