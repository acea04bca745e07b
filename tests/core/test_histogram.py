import math

import pytest

from servelens.core.histogram import HistogramState, validate_edges


def test_le_semantics_inclusive_upper_bound() -> None:
    h = HistogramState((0.0, 1.0, 2.0))
    for v in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0):
        h.observe(v)
    assert h.counts == [1, 2, 2, 1]
    assert h.cumulative() == [(0.0, 1), (1.0, 3), (2.0, 5), (math.inf, 6)]
    assert h.count == 6
    assert h.sum == pytest.approx(8.0)


def test_observe_n_and_merge() -> None:
    a = HistogramState((1.0, 2.0))
    b = HistogramState((1.0, 2.0))
    a.observe(0.5, 3)
    b.observe(1.5, 2)
    a.merge(b)
    assert a.counts == [3, 2, 0]
    assert a.sum == pytest.approx(4.5)
    assert b.counts == [0, 2, 0]  # merge does not touch the source


def test_merge_rejects_other_edges() -> None:
    with pytest.raises(ValueError, match="different edges"):
        HistogramState((1.0,)).merge(HistogramState((2.0,)))


@pytest.mark.parametrize(("edges", "msg"), [((), "empty"), ((1, 1), "strictly increasing"),
                                            ((1, float("inf")), "finite")])
def test_validate_edges(edges: tuple[float, ...], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        validate_edges(edges)
