"""core/units.py's ``format_in``, the cases mutation testing found unchecked (issue 21): each text worked
out from the docstring's rules (two significant figures, at most three decimals, trailing zeros dropped
below 1 s, one decimal in seconds from 1 s to 100 s)."""

import math

import pytest

from servelens.core.units import format_in


@pytest.mark.parametrize(("x", "unit", "signed", "text"), [
    # infinities: a sign only when signed (and positive), or when negative
    (math.inf, "s", False, "inf s"), (math.inf, "ms", True, "+inf ms"),
    (-math.inf, "ms", False, "-inf ms"), (-math.inf, "s", True, "-inf s"),
    # 1 s exactly: seconds keep their decimal; 99.7 s is under 100 s (one decimal), 99.96 s rounds to 100.0
    (1.0, "s", False, "1.0 s"), (1.0, "s", True, "+1.0 s"), (-1.0, "s", True, "-1.0 s"),
    (99.7, "s", False, "99.7 s"), (99.96, "s", False, "100 s"),
    # 1 ms: "1.0" with its zero and then its point dropped
    (0.001, "ms", False, "1 ms"), (0.001, "ms", True, "+1 ms"),
    # under the third decimal: 0, never -0 (and signed: +0)
    (1.2e-6, "ms", False, "0.001 ms"), (0.0001, "s", False, "0 s"), (-2e-9, "ms", False, "0 ms"),
    (-2e-9, "ms", True, "+0 ms"), (-0.0, "s", False, "0 s"),
    # two significant figures: 0.61 ms (two decimals), 0.096 ms (three)
    (0.00061, "ms", False, "0.61 ms"), (0.000096, "ms", False, "0.096 ms"), (-0.00061, "ms", True, "-0.61 ms"),
    # rounding up to the next power of ten: 0.0999 ms -> 0.1 ms, 9.96 ms -> 10 ms
    (9.99e-5, "ms", False, "0.1 ms"), (0.00996, "ms", False, "10 ms"),
])
def test_format_in_exact_texts(x: float, unit: str, signed: bool, text: str) -> None:
    assert format_in(x, unit, signed) == text
