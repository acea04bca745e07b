import itertools

import numpy as np
import pytest

from servelens.bench.arrivals import constant_offsets, poisson_offsets, trace_offsets
from servelens.bench.distributions import parse_length_dist


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_fixed() -> None:
    d = parse_length_dist("300")
    assert d.kind == "fixed"
    assert d.sample(rng(), 4) == [300, 300, 300, 300]


def test_uniform_bounds_inclusive_and_seeded() -> None:
    d = parse_length_dist("uniform:10-12")
    xs = d.sample(rng(1), 2000)
    assert set(xs) == {10, 11, 12}
    assert d.sample(rng(7), 50) == d.sample(rng(7), 50)
    assert d.sample(rng(7), 50) != d.sample(rng(8), 50)


def test_lognormal_mean_and_sd_are_the_distributions_own() -> None:
    d = parse_length_dist("lognormal:1000,400")
    xs = np.asarray(d.sample(rng(3), 50_000), dtype=float)
    assert abs(xs.mean() - 1000) < 15
    assert abs(xs.std() - 400) < 15
    assert xs.min() >= 1


def test_mix_weights_normalised() -> None:
    d = parse_length_dist("300:0.6,12000:0.4")
    assert d.kind == "mix"
    xs = d.sample(rng(5), 20_000)
    assert set(xs) == {300, 12000}
    share = xs.count(300) / len(xs)
    assert 0.58 < share < 0.62
    assert parse_length_dist("300:3,12000:2").params == pytest.approx(d.params)
    assert d.mean == pytest.approx(0.6 * 300 + 0.4 * 12000)


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("", "empty"),
        ("abc", "positive integer"),
        ("0", "positive integer"),
        ("uniform:5", "A-B"),
        ("uniform:9-3", "below"),
        ("lognormal:100", "MEAN,SD"),
        ("lognormal:-1,3", "> 0"),
        ("300:0.5,abc", "VALUE:WEIGHT"),
        ("300:0,400:0", "sum to 0"),
    ],
)
def test_bad_specs(spec: str, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        parse_length_dist(spec)


def test_poisson_offsets_seeded_and_rate() -> None:
    a = poisson_offsets(20_000, 50.0, seed=1)
    assert a == poisson_offsets(20_000, 50.0, seed=1)
    assert a != poisson_offsets(20_000, 50.0, seed=2)
    assert a[0] == 0 and all(x <= y for x, y in itertools.pairwise(a))
    mean_gap_s = a[-1] / (len(a) - 1) / 1e9
    assert abs(mean_gap_s - 0.02) < 0.0006


def test_constant_and_trace_offsets() -> None:
    assert constant_offsets(3, 4.0) == [0, 250_000_000, 500_000_000]
    assert trace_offsets([0, 1_000, 3_000], 0.1) == [0, 100, 300]
    with pytest.raises(ValueError):
        constant_offsets(3, 0)
