"""Weighted quantiles of grouped samples from their counts per value bin and the values of a few bins:
by definition the inverted-CDF weighted quantile of all the observations at once."""

import math

import numpy as np
import pytest

from servelens.core import binned_quantiles
from servelens.core.binned_quantiles import BinnedValues, in_memory, mixture_quantiles
from servelens.core.quantiles import weighted_quantiles
from servelens.core.selection import NBINS

QS = (0.0, 0.01, 0.25, 0.37, 0.5, 0.9, 0.95, 0.99, 1.0)


def groups_of(rng: np.random.Generator, n_groups: int, trial: int) -> list[np.ndarray]:
    """Values with ties, zeros, a group much larger than the others, and empty groups."""
    out = []
    for g in range(n_groups):
        n = int(rng.integers(0, 3)) if g == n_groups - 1 else int(rng.integers(1, 9000 if g == 0 else 800))
        v = np.round(rng.lognormal(-3.5, 0.5 + 0.2 * g, n), int(rng.integers(2, 12)))
        if trial % 4 == 0:
            v[: n // 4] = 0.0
        if trial % 5 == 0:
            v[: n // 2] = 0.025  # one value over half a group: one bin, one sub-bin
        out.append(v)
    return out


Plain = list[list[tuple[list[np.ndarray], np.ndarray]]]


def expected(rows: Plain, qs: tuple[float, ...]) -> list[tuple[float | None, ...]]:
    """The definition on all observations at once (servelens.core.quantiles.weighted_quantiles)."""
    got: list[tuple[float | None, ...]] = []
    for row in rows:
        picked = [(v, x) for groups, w in row for v, x in zip(groups, w, strict=True) if x > 0]
        vals = np.concatenate([v for v, _ in picked] or [np.zeros(0)])
        wts = np.concatenate([np.full(v.size, x) for v, x in picked] or [np.zeros(0)])
        got.append((None,) * len(qs) if wts.sum() <= 0 else tuple(weighted_quantiles(vals, wts, qs)))
    return got


@pytest.mark.parametrize("trial", range(30))
def test_equals_the_weighted_quantile_of_all_observations(trial: int) -> None:
    rng = np.random.default_rng(trial)
    k = int(rng.integers(2, 6))
    a, b = groups_of(rng, k, trial), groups_of(rng, k, trial + 100)
    src_a, src_b = in_memory(a), in_memory(b)
    ones, eye = np.ones(k), np.eye(k)
    # a counterfactual's weights: share / count, counts of a group that is empty get no share
    counts_b = np.array([v.size for v in b], dtype=float)
    shares = rng.random(k) * (counts_b > 0)
    cf = np.where(counts_b > 0, shares / np.maximum(counts_b, 1) / max(shares.sum(), 1e-9), 0.0)
    fallback = np.where(counts_b > 0, 0.0, 1.0 / max(1, a[-1].size)) * (np.array([v.size for v in a]) > 0)
    rows = [[(src_a, ones)], *[[(src_a, eye[i])] for i in range(k)], [(src_b, cf)], [(src_b, cf), (src_a, fallback)],
            [(src_a, np.zeros(k))]]
    plain: Plain = [[([*a], ones)], *[[([*a], eye[i])] for i in range(k)], [([*b], cf)], [([*b], cf), ([*a], fallback)],
             [([*a], np.zeros(k))]]
    assert mixture_quantiles(rows, QS) == expected(plain, QS)


def test_values_in_one_bin_beyond_the_sort_size_are_narrowed_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many candidates in one bin: sub-bins of the float64 bits pick the same value a sort would."""
    monkeypatch.setattr(binned_quantiles, "SMALL", 16)
    rng = np.random.default_rng(5)
    v = [0.025 * (1 + rng.random(20000) * 1e-3), 0.025 * (1 + rng.random(3000) * 1e-3)]  # all in one or two bins
    v[0][:500] = v[0][0]  # ties across a sub-bin
    w = np.array([0.3 / v[0].size, 0.7 / v[1].size])
    for row in ([(in_memory(v), np.ones(2))], [(in_memory(v), w)], [(in_memory(v), np.array([0.0, 1.0]))]):
        got = mixture_quantiles([row], QS)[0]
        assert got == tuple(weighted_quantiles(np.concatenate(v), np.concatenate(
            [np.full(x.size, float(y)) for x, y in zip(v, row[0][1], strict=True)]), QS))


def test_each_source_is_read_once_for_every_row() -> None:
    calls: list[int] = []
    inner = in_memory([np.arange(1.0, 101.0), np.arange(0.5, 50.5)])

    def gather(want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        calls.append(int(want.sum()))
        return inner.gather(want)

    src = BinnedValues(inner.counts, gather)
    rows = [[(src, np.ones(2))], [(src, np.array([1.0, 0.0]))], [(src, np.array([0.0, 1.0]))]]
    got = mixture_quantiles(rows, (0.5, 0.95))
    assert len(calls) == 1 and got[1] == (50.0, 95.0) and got[2] == (24.5, 47.5)


def test_bad_input() -> None:
    src = in_memory([np.array([1.0, 2.0])])
    with pytest.raises(ValueError, match="quantile must be within"):
        mixture_quantiles([[(src, np.ones(1))]], (1.5,))
    with pytest.raises(ValueError, match="shape"):
        mixture_quantiles([[(src, np.ones(2))]], (0.5,))
    with pytest.raises(ValueError, match="finite and >= 0"):
        mixture_quantiles([[(src, np.array([-1.0]))]], (0.5,))
    with pytest.raises(ValueError, match="shape"):
        BinnedValues(np.zeros((1, 3), dtype=np.int64), src.gather)
    with pytest.raises(ValueError, match=">= 0"):
        in_memory([np.array([-0.5])])
    assert mixture_quantiles([[(src, np.zeros(1))], []], (0.5,)) == [(None,), (None,)]
    assert src.counts.shape == (1, NBINS) and src.cumulative[0, -1] == 2.0
    assert not math.isnan(mixture_quantiles([[(src, np.ones(1))]], (0.0,))[0][0] or math.nan)
