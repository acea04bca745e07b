"""Times in running text (the verdict line, explain's notes): one unit for the figures read together.

A pair such as ``77 ms -> 0.11 s`` makes the reader convert before comparing; :func:`format_times`
writes every figure of a group in the unit of the largest: seconds when it is at least 1 s, else
milliseconds (``77 ms -> 110 ms``, ``0.5 s -> 1.2 s``, ``+0.14 ms, not +0.28 ms``).

Precision: two significant figures (trailing zeros dropped: ``0.5 s``), at most three decimals, never
an exponent (a figure under the last decimal reads ``0``); seconds from 1 s to 100 s keep one decimal
(``9.8 s``, ``2.0 s``), from 100 s none (``510 s``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def time_unit(values: Iterable[float | None]) -> str:
    """``s`` when the largest finite ``|value|`` (seconds) is at least 1 s, else ``ms``."""
    top = max((abs(v) for v in values if v is not None and math.isfinite(v)), default=0.0)
    return "s" if top >= 1 else "ms"


def format_in(x: float | None, unit: str, signed: bool = False) -> str:
    """``x`` seconds in ``unit`` (``s`` or ``ms``) with the unit (``46 ms``, ``1.2 s``, ``0.077 s``); ``-``
    for None or NaN; ``signed``: a leading ``+`` for 0 and above (``+0.14 ms``). Raises ValueError for
    another unit."""
    if unit not in ("s", "ms"):
        raise ValueError(f"unit must be 's' or 'ms', got {unit!r}")
    if x is None or math.isnan(x):
        return "-"
    if math.isinf(x):
        return ("+" if signed and x > 0 else "") + ("inf" if x > 0 else "-inf") + f" {unit}"
    v = x * (1000.0 if unit == "ms" else 1.0)
    a = abs(v)
    if unit == "s" and a >= 1:
        decimals = 0 if round(a, 1) >= 100 else 1
    elif a > 0:
        decimals = min(3, max(0, 1 - math.floor(math.log10(a))))  # two significant figures
        if round(a, decimals) >= 10 ** (2 - decimals) and decimals > 0:  # 0.0999 -> 0.1, not 0.100
            decimals -= 1
    else:
        decimals = 0
    text = f"{v:.{decimals}f}"
    if "." in text and not (unit == "s" and a >= 1):  # two significant figures: 0.5, not 0.50
        text = text.rstrip("0").rstrip(".")
    if float(text) == 0:
        text = "0"
    sign = "+" if signed and not text.startswith("-") else ""
    return f"{sign}{text} {unit}"


def format_times(*values: float | None, signed: bool = False) -> tuple[str, ...]:
    """Each of ``values`` (seconds) in the one unit of :func:`time_unit` over all of them."""
    unit = time_unit(values)
    return tuple(format_in(v, unit, signed) for v in values)
