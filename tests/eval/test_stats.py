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


# Sixteen per-item differences: 2^16 sign patterns > 9999 resamples, so the permutation test and the
# bootstrap draw at random and their figures depend on the seed.
_SPREAD = [0.15, 0.3, 0.15, -0.35, 0.3, 0.2, -0.1, 0.2, 0.15, 0.15, 0.05, 0.2, -0.15, 0.0, -0.1, 0.25]


def test_error_messages() -> None:
    """Each refusal says what is wrong (the CLI prints it as one line)."""
    cases = [
        (lambda: mcnemar_exact(-1, 2), "b and c must be counts >= 0"),
        (lambda: mcnemar_exact(2, -1), "b and c must be counts >= 0"),
        (lambda: paired_wald_ci(1, 1, 0), "n must be > 0"),
        (lambda: paired_bootstrap_ci([]), "no paired items"),
        (lambda: paired_permutation_p([]), "no paired items"),
        (lambda: compare_scores([], []), "need the same items, at least one, on both sides"),
        (lambda: compare_scores([[1.0]], [[1.0], [0.0]]), "need the same items, at least one, on both sides"),
        (lambda: compare_scores([[]], [[1.0]]), "every item needs at least one score on each side"),
        (lambda: compare_scores([[1.0]], [[]]), "every item needs at least one score on each side"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == message


def test_mcnemar_is_the_binomial_test_at_one_half() -> None:
    """By definition: scipy's two-sided binomtest of b in b + c at p = 1/2; equal b and c give 1."""
    from scipy.stats import binomtest

    for b, c in [(0, 1), (1, 0), (1, 4), (7, 3), (12, 30), (9, 9), (1, 1)]:
        assert mcnemar_exact(b, c) == binomtest(b, b + c, 0.5).pvalue
    assert mcnemar_exact(0, 1) == 1.0  # 2 * P(X <= 0), X ~ Bin(1, 1/2) = 1
    assert mcnemar_exact(1, 4) == pytest.approx(2 * 6 / 32)  # 2 * (1 + 5) / 2^5


def test_wald_interval_of_one_item() -> None:
    # n = 1, only A right: d = -1, se = sqrt(1 - 1/1) / 1 = 0
    assert paired_wald_ci(1, 0, 1) == (-1.0, -1.0)


def test_bootstrap_is_scipys_percentile_bootstrap_of_the_mean() -> None:
    """By definition: scipy.stats.bootstrap, percentile method, the given level, resamples and seed."""
    import numpy as np
    from scipy import stats

    ref = stats.bootstrap((np.array(_SPREAD),), np.mean, confidence_level=0.8, n_resamples=300,
                          method="percentile", rng=np.random.default_rng(7))
    got = paired_bootstrap_ci(_SPREAD, confidence=0.8, seed=7, resamples=300)
    assert got == (ref.confidence_interval.low, ref.confidence_interval.high)
    # reproducible, the default seed is 0, and the seed matters (so the checks above mean something)
    assert paired_bootstrap_ci(_SPREAD, seed=3) == paired_bootstrap_ci(_SPREAD, seed=3)
    assert paired_bootstrap_ci(_SPREAD) == paired_bootstrap_ci(_SPREAD, seed=0) != paired_bootstrap_ci(_SPREAD, seed=1)
    # differences 0 and 1: resample means 0, 0.5, 1 with probability 1/4, 1/2, 1/4; the central 40 % is 0.5
    assert paired_bootstrap_ci([0.0, 1.0], confidence=0.4) == (0.5, 0.5)


def test_bootstrap_of_equal_differences_is_that_value_exactly() -> None:
    # np.mean of seven 0.1 is 0.09999999999999999: the value itself is returned, not a resampled mean
    assert paired_bootstrap_ci([0.1] * 7) == (0.1, 0.1)
    assert paired_bootstrap_ci([0.3]) == (0.3, 0.3)  # one item


def test_permutation_is_scipys_sign_flip_test() -> None:
    """By definition: scipy.stats.permutation_test of the mean, permutation_type "samples", two-sided."""
    import numpy as np
    from scipy import stats

    ref = stats.permutation_test((np.array(_SPREAD),), np.mean, permutation_type="samples", n_resamples=300,
                                 alternative="two-sided", rng=np.random.default_rng(7))
    assert paired_permutation_p(_SPREAD, seed=7, resamples=300) == ref.pvalue
    assert paired_permutation_p(_SPREAD, seed=3) == paired_permutation_p(_SPREAD, seed=3)
    default = paired_permutation_p(_SPREAD)
    assert default == paired_permutation_p(_SPREAD, seed=0) != paired_permutation_p(_SPREAD, seed=1)
    # one item: both sign patterns reach |mean| 0.5 -> p = 1
    assert paired_permutation_p([0.5]) == 1.0
    one = compare_scores([[1.0, 0.0]], [[1.0, 1.0]])  # one item over two runs (scipy needs two items)
    assert (one.test, one.difference, one.ci_low, one.ci_high) == ("paired-permutation", 0.5, 0.5, 0.5)
    assert one.p_value == 1.0


def test_compare_passes_level_and_seed_on() -> None:
    # McNemar's case: the Wald interval at the level asked for
    a = [[1.0]] * 10 + [[1.0]] * 2 + [[0.0]] * 8 + [[0.0]] * 5
    b = [[1.0]] * 10 + [[0.0]] * 2 + [[1.0]] * 8 + [[0.0]] * 5
    p = compare_scores(a, b, confidence=0.8)
    assert (p.ci_low, p.ci_high) == paired_wald_ci(2, 8, 25, 0.8)
    assert (p.ci_low, p.ci_high) != paired_wald_ci(2, 8, 25)
    # the permutation case: item means differ by _SPREAD; the bootstrap and the test at that level and seed
    a2 = [[0.5, 0.5]] * len(_SPREAD)
    b2 = [[0.5 + x, 0.5 + x] for x in _SPREAD]
    q = compare_scores(a2, b2, confidence=0.8, seed=3)
    d = [y[0] - x[0] for x, y in zip(a2, b2, strict=True)]
    assert (q.test, q.n, q.only_a, q.only_b) == ("paired-permutation", 16, 4, 11)
    assert (q.ci_low, q.ci_high) == paired_bootstrap_ci(d, 0.8, 3)
    assert q.p_value == paired_permutation_p(d, 3)
    default = compare_scores(a2, b2)
    assert (default.ci_low, default.ci_high, default.p_value) == (
        *paired_bootstrap_ci(d, 0.95, 0), paired_permutation_p(d, 0))


def test_holm_caps_at_one() -> None:
    # 2 x 0.6 = 1.2 -> 1; 1 x 0.9 = 0.9, made non-decreasing -> 1
    assert holm([0.6, 0.9]) == [1.0, 1.0]
    assert holm([0.9, 0.3]) == [0.9, 0.6]


def test_real_difference_is_strict_at_both_thresholds() -> None:
    assert not real_difference(0.05, 0.05, 1.0, None, None)  # p < alpha, not <=
    assert not real_difference(0.01, 0.05, 0.5, 0.25, None)  # gap 2 x SD exactly: not larger
    assert real_difference(0.01, 0.05, -0.5, None, 0.24)
