"""The report's Requests column from a Prometheus API: an exact count of the window, not increase()."""

from __future__ import annotations

from typing import Any

import pytest

from servelens.report.promapi import PromClient, Series
from servelens.report.sources import counter_increase, exact_counts


def test_counter_increase_is_last_minus_start_without_extrapolation() -> None:
    # 25 requests over a window holding only two samples: increase() would extrapolate, this does not
    assert counter_increase([(10.0, 5.0), (11.0, 30.0)], start=5.0) == 25
    assert counter_increase([(10.0, 5.0), (11.0, 30.0)], start=0.0) == 30


def test_counter_increase_younger_series_counts_from_its_first_sample() -> None:
    assert counter_increase([(10.0, 3.0), (11.0, 7.0), (12.0, 9.0)], start=None) == 6
    assert counter_increase([], start=4.0) == 0


def test_counter_increase_reset_is_never_negative() -> None:
    # a restart between samples: 10 -> 12 (+2), reset to 3 (+3), 3 -> 5 (+2)
    assert counter_increase([(1.0, 12.0), (2.0, 3.0), (3.0, 5.0)], start=10.0) == 7
    # a reset right at the window start
    assert counter_increase([(1.0, 2.0)], start=50.0) == 2


class _FakeApi(PromClient):
    def __init__(self, answers: dict[str, list[Series]]) -> None:
        super().__init__("http://127.0.0.1:1")
        object.__setattr__(self, "answers", answers)
        object.__setattr__(self, "asked", [])

    def query(self, expr: str, time_s: float | None = None) -> list[Series]:
        self.asked.append((expr, time_s))  # type: ignore[attr-defined]
        got: list[Series] = self.answers[expr]  # type: ignore[attr-defined]
        return got


def _s(bucket: str, model: str, *points: tuple[float, float]) -> Series:
    labels: dict[str, Any] = {"__name__": "x_count", "isl_bucket": bucket, "model": model}
    return Series(labels, tuple(points))


def test_exact_counts_per_bucket_summed_over_series() -> None:
    api = _FakeApi({
        "x_count{} offset 5m": [_s("0-512", "a", (100.0, 4.0)), _s("0-512", "b", (100.0, 1.0))],
        "x_count{}[5m]": [
            _s("0-512", "a", (150.0, 4.0), (200.0, 10.0)),  # +6
            _s("0-512", "b", (150.0, 1.0), (200.0, 2.0)),  # +1
            _s("513-1024", "a", (250.0, 2.0), (300.0, 5.0)),  # younger than the window: +3
        ],
    })
    assert exact_counts(api, "x_count", "", "5m", 400.0) == {"0-512": 7, "513-1024": 3}
    assert api.asked == [("x_count{} offset 5m", 400.0), ("x_count{}[5m]", 400.0)]  # type: ignore[attr-defined]
    assert exact_counts(api, "x_count", "", "5m", 400.0, by=None) == {"": 10}


@pytest.mark.parametrize("model", ['model="m"'])
def test_exact_counts_passes_the_model_matcher(model: str) -> None:
    api = _FakeApi({f"x_count{{{model}}} offset 1m": [], f"x_count{{{model}}}[1m]": []})
    assert exact_counts(api, "x_count", model, "1m", 0.0) == {}
