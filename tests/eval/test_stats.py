"""The statistics against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from servelens.eval.stats import (
    compare_scores,
    holm,
    mcnemar_exact,
    paired_bootstrap_ci,
    paired_permutation_p,
    paired_wald_ci,
    real_difference,
)


def test_mcnemar_by_hand() -> None:
    # b=2, c=8: 2 * P(X <= 2), X ~ Bin(10, 1/2) = 2 * (1 + 10 + 45) / 1024
    assert mcnemar_exact(2, 8) == pytest.approx(112 / 1024)
    assert mcnemar_exact(8, 2) == pytest.approx(112 / 1024)
    # b=5, c=0: 2 / 2^5
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(0, 0) == 1.0  # nothing discordant
    # the write-up's MMLU row: 46 only BF16, 24 only NVFP4 -> p = 0.012
    assert round(mcnemar_exact(46, 24), 3) == 0.012
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_wald_interval_by_hand() -> None:
    # b=10, c=30, n=200: d = 0.1, se = sqrt(40 - 400/200)/200 = sqrt(38)/200
    lo, hi = paired_wald_ci(10, 30, 200)
    se = math.sqrt(38) / 200
    assert lo == pytest.approx(0.1 - 1.959964 * se, abs=1e-6)
    assert hi == pytest.approx(0.1 + 1.959964 * se, abs=1e-6)
    assert paired_wald_ci(0, 0, 50) == (0.0, 0.0)


def test_bootstrap_by_hand() -> None:
    # two items, differences 0 and 1: a resample's mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4,
    # so the 95 % percentile interval is [0, 1]
    assert paired_bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    assert paired_bootstrap_ci([0.25] * 7) == (0.25, 0.25)  # no spread at all
    lo, hi = paired_bootstrap_ci([0.0] * 50 + [1.0] * 50)
    # the mean of 100 resampled 0/1 values: sd 0.05, so about 0.5 -/+ 0.098
    assert 0.38 < lo < 0.42 and 0.58 < hi < 0.62
    with pytest.raises(ValueError):
        paired_bootstrap_ci([])


def test_permutation_by_hand() -> None:
    # five differences of +1: of the 32 sign patterns only all-plus and all-minus reach |mean| 1 -> 2/32
    assert paired_permutation_p([1, 1, 1, 1, 1]) == pytest.approx(2 / 32)
    # +1 and -1: every pattern has |mean| >= 0 -> 1
    assert paired_permutation_p([1, -1]) == 1.0
    assert paired_permutation_p([0, 0, 0]) == 1.0


def test_holm_by_hand() -> None:
    # sorted 0.01, 0.03, 0.04, 0.2 -> x4, x3, x2, x1 = 0.04, 0.09, 0.08 -> 0.09 (monotone), 0.2
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]) == []


def test_compare_single_run_is_mcnemar() -> None:
    # 10 items both right, 2 only A right, 8 only B right, 5 both wrong
    a = [[1.0]] * 10 + [[1.0]] * 2 + [[0.0]] * 8 + [[0.0]] * 5
    b = [[1.0]] * 10 + [[0.0]] * 2 + [[1.0]] * 8 + [[0.0]] * 5
    p = compare_scores(a, b)
    assert (p.test, p.n, p.only_a, p.only_b) == ("mcnemar-exact", 25, 2, 8)
    assert p.p_value == pytest.approx(112 / 1024)
    assert p.difference == pytest.approx(6 / 25)
    assert (p.ci_low, p.ci_high) == pytest.approx(paired_wald_ci(2, 8, 25))


def test_compare_repeated_runs_uses_item_means() -> None:
    # item means: A 1.0 for 5 items, B 0.5 for them: every difference -0.5 -> exact p 2/32
    a = [[1.0, 1.0]] * 5
    b = [[1.0, 0.0]] * 5
    p = compare_scores(a, b)
    assert p.test == "paired-permutation"
    assert (p.only_a, p.only_b) == (5, 0)
    assert p.difference == pytest.approx(-0.5)
    assert p.p_value == pytest.approx(2 / 32)
    assert (p.ci_low, p.ci_high) == (-0.5, -0.5)
    with pytest.raises(ValueError):
        compare_scores([[1.0]], [[1.0], [0.0]])
    with pytest.raises(ValueError):
        compare_scores([[]], [[1.0]])


def test_real_difference_rule() -> None:
    assert real_difference(0.01, 0.05, -0.02, None, None)
    assert not real_difference(0.06, 0.05, -0.2, None, None)
    # the write-up's function-calling row: 0.947 +/- 0.003 vs 0.945 +/- 0.002: gap 0.002 < 2 x 0.003
    assert not real_difference(0.001, 0.05, 0.945 - 0.947, 0.003, 0.002)
    assert real_difference(0.001, 0.05, 0.93 - 0.947, 0.003, 0.002)
