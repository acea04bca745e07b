"""The le edge sets (core/edges.py): Dynamo's kept exactly, the fine grid and its interpolation bound,
and edges given as text."""

import math
import random

import pytest

from servelens.core.edges import (
    DURATION_EDGES_S,
    FINE_DURATION_EDGES_S,
    FINE_ITL_EDGES_S,
    FINE_TTFT_EDGES_S,
    ITL_EDGES_S,
    TTFT_EDGES_S,
    MetricEdges,
    octave_edges,
    parse_edges,
)
from servelens.core.histogram import HistogramState
from servelens.core.quantiles import histogram_quantile


def test_fine_grid_shape() -> None:
    assert octave_edges(0, 1) == (1.0, 1.09, 1.19, 1.3, 1.41, 1.54, 1.68, 1.83, 2.0)
    assert len(FINE_TTFT_EDGES_S) == 140 and len(FINE_ITL_EDGES_S) == 134 and len(FINE_DURATION_EDGES_S) == 130
    assert FINE_TTFT_EDGES_S[0] == FINE_ITL_EDGES_S[0] == FINE_DURATION_EDGES_S[0] == 0.0
    assert FINE_DURATION_EDGES_S[1:4] == (0.00781, 0.00852, 0.00929) and FINE_DURATION_EDGES_S[-1] == 512.0
    assert [e for e in FINE_TTFT_EDGES_S if e > 128] == [220.0, 480.0]  # Dynamo's tail above the grid
    assert [e for e in FINE_ITL_EDGES_S if e > 8] == [13.0, 24.0, 44.0, 80.0]
    with pytest.raises(ValueError):
        octave_edges(2, 2)


def test_defaults_and_dynamo() -> None:
    assert MetricEdges().ttft_s == FINE_TTFT_EDGES_S and MetricEdges().itl_s == FINE_ITL_EDGES_S
    d = MetricEdges.dynamo()
    assert d.is_dynamo and not MetricEdges().is_dynamo
    assert d.ttft_s == tuple(float(e) for e in TTFT_EDGES_S) and d.itl_s == tuple(float(e) for e in ITL_EDGES_S)
    # the duration too: Dynamo's 0, 2, 4, ... s put every request of the demo (0.01-2 s) in one le bucket
    assert MetricEdges().duration_s == FINE_DURATION_EDGES_S
    assert d.duration_s == tuple(float(e) for e in DURATION_EDGES_S)
    assert MetricEdges().isl_tokens == d.isl_tokens and MetricEdges().osl_tokens == d.osl_tokens


@pytest.mark.parametrize(("spec", "want"), [
    ("dynamo", tuple(float(e) for e in TTFT_EDGES_S)),
    (" Fine ", FINE_TTFT_EDGES_S),
    ("0.01, 0.1,1", (0.01, 0.1, 1.0)),
    ([0, 0.5, 2], (0.0, 0.5, 2.0)),
])
def test_parse_edges(spec: object, want: tuple[float, ...]) -> None:
    assert parse_edges(spec, "ttft") == want


def test_parse_edges_itl_and_duration_presets() -> None:
    assert parse_edges("dynamo", "itl") == tuple(float(e) for e in ITL_EDGES_S)
    assert parse_edges("dynamo", "duration") == tuple(float(e) for e in DURATION_EDGES_S)
    assert parse_edges("fine", "duration") == FINE_DURATION_EDGES_S


@pytest.mark.parametrize(("spec", "msg"), [
    ("coarse", "fine, dynamo or comma-separated seconds"),
    ("0.1,abc", "'abc'"),
    ("1,0.5", "strictly increasing"),
    ("", "must not be empty"),
    ([0.1, True], "numbers of seconds"),
    (3, "fine, dynamo or a list"),
    ("0.1,inf", "finite"),
])
def test_parse_edges_errors_are_one_line(spec: object, msg: str) -> None:
    with pytest.raises(ValueError, match=msg) as err:
        parse_edges(spec, "ttft")
    assert "\n" not in str(err.value) and str(err.value).startswith("ttft edges")


@pytest.mark.parametrize("edges", [FINE_TTFT_EDGES_S, FINE_ITL_EDGES_S, FINE_DURATION_EDGES_S])
def test_fine_edges_bound_the_interpolation_error(edges: tuple[float, ...]) -> None:
    """histogram_quantile over the fine edges is within 9.8 % of the order statistic it estimates (the
    ceil(q * n)-th smallest value, which lies in the same bucket), for any distribution inside the grid:
    here point masses (the worst case), a narrow peak and a wide lognormal, 5 to 2,000 values."""
    rng = random.Random(7)
    lo, hi = edges[1], [e for e in edges if e <= 8][-1]
    for trial in range(300):
        n = rng.choice((5, 20, 37, 112, 2000))
        centre = math.exp(rng.uniform(math.log(lo) + 1, math.log(hi) - 1))
        kind = trial % 3
        if kind == 0:
            values = [centre] * n
        elif kind == 1:
            values = [centre * rng.uniform(0.98, 1.02) for _ in range(n)]
        else:
            values = [min(hi, max(lo, centre * rng.lognormvariate(0, 1))) for _ in range(n)]
        h = HistogramState(edges)
        for v in values:
            h.observe(v)
        ordered = sorted(values)
        for q in (0.5, 0.95, 0.99):
            exact = ordered[math.ceil(q * n) - 1]
            got = histogram_quantile(q, h.cumulative())
            assert abs(got - exact) <= 0.098 * exact, (trial, n, q, exact, got)


def test_octave_edges_start_at_the_first_octave() -> None:
    assert octave_edges(1, 2) == (2.0, 2.18, 2.38, 2.59, 2.83, 3.08, 3.36, 3.67, 4.0)
    assert octave_edges(-1, 0)[:2] == (0.5, 0.545)
    with pytest.raises(ValueError) as err:
        octave_edges(2, 2)
    assert str(err.value) == "first octave 2 must be below the end octave 2"
    with pytest.raises(ValueError) as err:
        parse_edges("fine", "osl")
    assert str(err.value) == "kind must be one of ttft, itl, duration, got 'osl'"


def test_the_fine_sets_are_built_as_documented() -> None:
    """0, the 2^(k/8) grid over the octaves, then the Dynamo edges strictly above its top (the
    constants are built once at import: this calls the builder itself)."""
    from servelens.core.edges import _fine

    assert _fine(0, 1, (0, 1, 2, 4, 8)) == (0.0, *octave_edges(0, 1), 4.0, 8.0)  # 2 is the grid's top already
    assert _fine(-10, 7, TTFT_EDGES_S) == FINE_TTFT_EDGES_S
    assert _fine(-13, 3, ITL_EDGES_S) == FINE_ITL_EDGES_S
    assert FINE_TTFT_EDGES_S[:2] == (0.0, 0.000977) and FINE_TTFT_EDGES_S[-4:] == (117.0, 128.0, 220.0, 480.0)
    assert FINE_ITL_EDGES_S[:2] == (0.0, 0.000122) and FINE_ITL_EDGES_S[-6:] == (7.34, 8.0, 13.0, 24.0, 44.0, 80.0)


def test_edges_kind_names_the_set_for_its_metric() -> None:
    """``edges_kind`` (what the report's notes describe): the fine and Dynamo sets of each metric, with
    or without the ``+Inf`` edge and as ints, a set of the other metric or by hand is ``other``."""
    from servelens.core.edges import edges_kind

    inf = math.inf
    assert edges_kind(FINE_TTFT_EDGES_S, "ttft") == "fine"
    assert edges_kind((*FINE_TTFT_EDGES_S, inf), "ttft") == "fine"
    assert edges_kind(FINE_ITL_EDGES_S, "itl") == "fine"
    assert edges_kind([*FINE_ITL_EDGES_S, inf], "itl") == "fine"
    assert edges_kind((0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1, 2.2, 4.7, 10, 22, 48, 100,
                       220, 480, inf), "ttft") == "dynamo"
    assert edges_kind(ITL_EDGES_S, "itl") == "dynamo"
    assert edges_kind((*ITL_EDGES_S, inf), "itl") == "dynamo"
    # one metric's set read as the other's
    assert edges_kind(FINE_TTFT_EDGES_S, "itl") == "other"
    assert edges_kind(FINE_ITL_EDGES_S, "ttft") == "other"
    assert edges_kind(TTFT_EDGES_S, "itl") == "other"
    assert edges_kind(ITL_EDGES_S, "ttft") == "other"
    assert edges_kind((0.1, 0.2, inf), "ttft") == "other"
    assert edges_kind((0.1, 0.2), "itl") == "other"
    with pytest.raises(ValueError) as exc:
        edges_kind(FINE_DURATION_EDGES_S, "duration")
    assert str(exc.value) == "metric must be 'ttft' or 'itl', got 'duration'"
    for metric in ("TTFT", "ITL"):
        with pytest.raises(ValueError):
            edges_kind(FINE_TTFT_EDGES_S, metric)
