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


def test_merge_adds_into_a_histogram_that_has_counts() -> None:
    a, b = HistogramState((1.0, 2.0)), HistogramState((1.0, 2.0))
    a.observe(1.5, 2)
    b.observe(1.2)
    a.merge(b)
    assert a.counts == [0, 3, 0] and a.sum == pytest.approx(4.2)


def test_edges_given_as_a_list_are_kept_as_a_tuple() -> None:
    listed = HistogramState([1.0, 2.0])
    assert listed.edges == (1.0, 2.0) and isinstance(listed.edges, tuple)
    listed.merge(HistogramState((1.0, 2.0)))  # the same edges however they were given


def test_copy_is_independent() -> None:
    a = HistogramState((1.0,))
    a.observe(0.5, 2)
    c = a.copy()
    assert (c.edges, c.counts, c.sum) == ((1.0,), [2, 0], 1.0)
    c.observe(3.0)
    assert (a.counts, a.sum) == ([2, 0], 1.0)


def test_error_messages() -> None:
    cases = [
        (lambda: validate_edges(()), "histogram edges must not be empty"),
        (lambda: validate_edges((1, 1)), "histogram edges must be strictly increasing: 1 follows 1"),
        (lambda: validate_edges((1, float("-inf"))), "histogram edges must be strictly increasing: -inf follows 1"),
        (lambda: validate_edges((float("nan"),)), "histogram edges must be finite (+Inf is added implicitly)"),
        (lambda: validate_edges((1, float("inf"))), "histogram edges must be finite (+Inf is added implicitly)"),
        (lambda: HistogramState((1.0,)).merge(HistogramState((2.0,))), "cannot merge histograms with different edges"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == message
