"""core/binned_quantiles.py, the cases mutation testing found unchecked (issue 21): quantiles inside the
two lowest value bins (zero and float32-subnormal values), narrowing by sub-bins at their first and
second sub-bin and one ulp apart, the documented dtypes, and every refusal's exact text. Each expected
value worked out by hand from the inverted-CDF definition (the smallest value whose cumulative weight
reaches ``q * total``)."""

from __future__ import annotations

import numpy as np
import pytest

from servelens.core import binned_quantiles
from servelens.core.binned_quantiles import BinnedValues, in_memory, mixture_quantiles
from servelens.core.selection import NBINS, value_bins


def _err(call: object) -> str:
    with pytest.raises(ValueError) as exc:
        call()  # type: ignore[operator]
    return str(exc.value)


def test_quantiles_inside_the_two_lowest_bins() -> None:
    # 0.0, 1e-41 and 5e-41 are all in bin 0 (float32 subnormals under 2**-133); 1e-40 and 1.5e-40 in bin 1
    low = np.array([0.0, 1e-41, 5e-41])
    assert value_bins(low).tolist() == [0, 0, 0]
    assert value_bins(np.array([1e-40, 1.5e-40])).tolist() == [1, 1]
    # three observations of weight 1: q = 0.5 reaches 1.5 at the second (1e-41), q = 1 at the third
    src = in_memory([low])
    assert mixture_quantiles([[(src, np.ones(1))]], (0.0, 0.5, 1.0)) == [(0.0, 1e-41, 5e-41)]
    # two zeros below, then 1e-40 and 1.5e-40: q = 0.75 reaches 3 at 1e-40 (two counted in bin 0)
    two = in_memory([np.array([0.0, 0.0, 1.5e-40, 1e-40])])
    assert mixture_quantiles([[(two, np.ones(1))]], (0.5, 0.75, 1.0)) == [(0.0, 1e-40, 1.5e-40)]


def _ulps(x: float, offsets: list[int]) -> np.ndarray:
    bits = np.array([x]).view(np.uint64)[0]
    return (np.array(offsets, dtype=np.uint64) + bits).view(np.float64)


def test_narrowing_at_the_first_and_second_sub_bin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sorted outright only under 4 candidates: 22 values in one value bin, the span 2**20 ulps (so 5 bits
    shifted away: sub-bins of 32 ulps): one value at 0 ulps, 20 at 32-51 ulps, one at 2**20 ulps."""
    monkeypatch.setattr(binned_quantiles, "SMALL", 4)
    offsets = [0, *range(32, 52), 1 << 20]
    v = _ulps(0.025, offsets)
    assert len(set(value_bins(v).tolist())) == 1
    src = in_memory([v[::-1].copy()])
    # 22 observations: q = k/22 reaches k at the k-th smallest, whose offset is offsets[k - 1]
    got = mixture_quantiles([[(src, np.ones(1))]], (1 / 22, 2 / 22, 11 / 22, 21 / 22, 1.0))[0]
    assert got == tuple(float(x) for x in v[[0, 1, 10, 20, 21]])
    # the first sub-bin holding many: 20 values at 0-19 ulps, one at 2**20
    w = _ulps(0.025, [*range(20), 1 << 20])
    got = mixture_quantiles([[(in_memory([w]), np.ones(1))]], (0.5, 20 / 21))[0]
    assert got == (float(w[10]), float(w[19]))  # 10.5 reached at the 11th, 20 at the 20th


def test_narrowing_values_one_ulp_apart_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five values and five one ulp above them (a span of 1): the first narrowing keeps one of the two
    sub-bins, all equal, and the answer is that value."""
    monkeypatch.setattr(binned_quantiles, "SMALL", 4)
    v = _ulps(0.5, [0] * 5 + [1] * 5)
    got = mixture_quantiles([[(in_memory([v]), np.ones(1))]], (0.2, 0.8))[0]
    assert got == (0.5, float(v[5]))


def test_documented_dtypes() -> None:
    src = in_memory([np.array([0.5, 0.25]), np.array([1.0])])
    assert src.counts.dtype == np.int64 and src.counts.shape == (2, NBINS)
    want = np.ones((2, NBINS), dtype=bool)
    values, groups = src.gather(want)
    assert (values.dtype, groups.dtype) == (np.float64, np.int64)
    assert sorted(zip(values.tolist(), groups.tolist(), strict=True)) == [(0.25, 0), (0.5, 0), (1.0, 1)]
    assert [a.dtype for a in src.gather(np.zeros((2, NBINS), dtype=bool))] == [np.float64, np.int64]


def test_refusal_texts() -> None:
    src = in_memory([np.array([1.0, 2.0])])
    assert _err(lambda: BinnedValues(np.full((1, NBINS), -1, dtype=np.int64), src.gather)) == "counts must be >= 0"
    assert _err(lambda: BinnedValues(np.zeros((1, 3), dtype=np.int64), src.gather)) == \
        f"counts must have shape (groups, {NBINS}), got (1, 3)"
    assert _err(lambda: mixture_quantiles([[(src, np.array([np.inf]))]], (0.5,))) == "weights must be finite and >= 0"
    assert _err(lambda: mixture_quantiles([[(src, np.ones(2))]], (0.5,))) == \
        "a part's weights must have shape (1,), got (2,)"
    assert _err(lambda: mixture_quantiles([[(src, np.ones(1))]], (-0.5,))) == "quantile must be within [0, 1], got -0.5"
    blind = BinnedValues(src.counts, lambda want: (np.zeros(0), np.zeros(0, dtype=np.int64)))
    assert _err(lambda: mixture_quantiles([[(blind, np.ones(1))]], (0.5,))) == \
        "a bin the counts say holds observations gathered none (counts and values differ)"
