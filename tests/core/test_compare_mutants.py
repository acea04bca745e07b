"""core/compare at its exact thresholds: the tail rule met exactly (five requests, five observations
above the quantile, ties at the cut), the interval's composition (baseline drawn first, ``ddof=1``,
the Bonferroni level over what is judged, nothing drawn for a bucket not judged), a zero-width
interval, empty buckets and the error messages word for word (issue 21)."""

from __future__ import annotations

import statistics
from statistics import NormalDist

import numpy as np
import pytest

from servelens.core.compare import (
    ONLY_BASELINE,
    ONLY_CANDIDATE,
    QuantileDiff,
    bootstrap_quantiles,
    compare_runs,
    linear_quantiles,
)
from servelens.core.decompose import TOO_FEW, UNCHANGED
from servelens.core.windows import BucketSamples, ExplainError, SampleWindow


def window(*buckets: BucketSamples, metric: str = "TTFT") -> SampleWindow:
    return SampleWindow(metric, tuple(f"b{i}" for i in range(len(buckets))), buckets)


def one(values: list[float] | tuple[float, ...]) -> BucketSamples:
    return BucketSamples(tuple(values))


TENTHS = one([0.1 * i for i in range(1, 11)])  # 10 requests, 0.1 .. 1.0 s


def verdicts(w: SampleWindow, qs: tuple[float, ...]) -> list[str]:
    return [d.verdict for d in compare_runs(w, w, qs, resamples=50)[0].quantiles]


def test_the_tail_rule_met_exactly() -> None:
    # 10 requests: at q = 0.5, 10 * 0.5 = 5 observations above (MIN_TAIL exactly) and the cut (0.55 s)
    # has exactly 5 distinct requests above it: judged. At q = 0.501, 10 * 0.499 = 4.99: not judged,
    # although 5 requests are still above its cut (0.5509 s).
    w = window(TENTHS)
    assert verdicts(w, (0.5, 0.501)) == [UNCHANGED, TOO_FEW]


def test_five_requests_are_enough_requests() -> None:
    # 5 requests of 2 tokens (ITL): one token of each under the median, one above: 5 distinct above
    w = window(BucketSamples((0.01, 1.0, 0.02, 1.1, 0.03, 1.2, 0.04, 1.3, 0.05, 1.4), (2, 2, 2, 2, 2)), metric="ITL")
    assert verdicts(w, (0.5,)) == [UNCHANGED]


def test_observations_equal_to_the_cut_are_not_above_it() -> None:
    # the median of 1,1,1,1,2,2,3,3,3,3 is 2: only the four 3s are above it
    assert verdicts(window(one([1.0] * 4 + [2.0] * 2 + [3.0] * 4)), (0.5,)) == [TOO_FEW]


# 40 requests a run: the baseline 0.01 .. 0.40 s, the candidate 0.15 s slower. A bucket of 3 requests
# before it is never judged.
SMALL = one([0.2, 0.4, 0.6])
BASE = one([0.01 * i for i in range(1, 41)])
CAND = one([0.01 * i + 0.15 for i in range(1, 41)])


def expected_interval(qs: tuple[float, ...], k: int, judged: int, resamples: int, seed: int) -> tuple[float, float]:
    """The interval as the module docstring defines it, from the bootstrap resamples drawn in order
    (the small bucket draws nothing, then the baseline's bucket, then the candidate's)."""
    rng = np.random.default_rng(seed)
    pa, ra = bootstrap_quantiles(BASE, qs, resamples, rng)
    pc, rc = bootstrap_quantiles(CAND, qs, resamples, rng)
    sd = statistics.stdev(float(x) for x in rc[:, k] - ra[:, k])
    z = NormalDist().inv_cdf(0.5 + (1 - 0.05 / judged) / 2)
    diff = float(pc[k] - pa[k])
    return diff - z * sd, diff + z * sd


def test_interval_is_the_difference_plus_minus_z_sd_with_the_defaults() -> None:
    got = compare_runs(window(SMALL, BASE), window(SMALL, CAND), (0.5,))
    small, big = got
    assert small.quantiles == (QuantileDiff(0.5, 0.4, 0.4, 0.0, None, TOO_FEW),)
    (d,) = big.quantiles
    assert d.diff_s == pytest.approx(0.15, abs=1e-12)
    assert d.ci_s == pytest.approx(expected_interval((0.5,), 0, 1, 2000, 0), rel=1e-9)
    assert (big.label, big.metric, big.requests_baseline, big.requests_candidate) == ("b1", "TTFT", 40, 40)


def test_the_level_is_bonferroni_over_the_judged_quantiles() -> None:
    got = compare_runs(window(SMALL, BASE), window(SMALL, CAND), (0.5, 0.75), resamples=300, seed=5)
    for k in (0, 1):
        assert got[1].quantiles[k].ci_s == pytest.approx(expected_interval((0.5, 0.75), k, 2, 300, 5), rel=1e-9)


def test_a_zero_width_interval_at_zero_is_no_change() -> None:
    # q = 0: half the requests sit at the minimum, so every resample's minimum is 1.0 s in both runs
    w = window(one([1.0] * 30 + [2.0] * 30))
    (row,) = compare_runs(w, w, (0.0,), resamples=100)
    assert row.quantiles == (QuantileDiff(0.0, 1.0, 1.0, 0.0, (0.0, 0.0), UNCHANGED),)
    assert row.verdict == UNCHANGED


def fields(d: QuantileDiff) -> tuple[object, ...]:
    return (d.q, d.baseline_s, d.candidate_s, d.diff_s, d.ci_s, d.verdict)


def test_a_bucket_empty_in_one_run_has_its_points_and_no_verdict() -> None:
    empty = BucketSamples(())
    before, after = compare_runs(window(empty, BASE), window(SMALL, BASE), (0.5, 0.95), resamples=20)
    # no request in a run is not "too few": the bucket is only in the other run
    assert before.quantiles[0] == QuantileDiff(0.5, None, 0.4, None, None, ONLY_CANDIDATE)
    assert fields(before.quantiles[1]) == (0.95, None, pytest.approx(0.58), None, None, ONLY_CANDIDATE)
    assert (before.requests_baseline, before.requests_candidate, before.verdict) == (0, 3, ONLY_CANDIDATE)
    gone = compare_runs(window(SMALL, BASE), window(empty, BASE), (0.95,), resamples=20)[0]
    assert [fields(d) for d in gone.quantiles] == [(0.95, pytest.approx(0.58), None, None, None, ONLY_BASELINE)]
    assert gone.verdict == ONLY_BASELINE
    assert after.metric == "TTFT"


def test_one_observation_each_is_compared_without_a_verdict() -> None:
    got = compare_runs(window(one([0.3])), window(one([0.5])), (0.5,), resamples=2)
    assert [fields(d) for d in got[0].quantiles] == [(0.5, 0.3, 0.5, pytest.approx(0.2), None, TOO_FEW)]


def test_a_quantile_judged_in_one_run_only_is_not_judged() -> None:
    got = compare_runs(window(TENTHS), window(one([0.1, 0.2, 0.3, 0.4])), (0.5,), resamples=20)
    assert got[0].quantiles[0].verdict == TOO_FEW
    assert got[0].quantiles[0].ci_s is None


def test_errors_word_for_word() -> None:
    with pytest.raises(ExplainError) as e:
        compare_runs(SampleWindow("TTFT", ("a", "b"), (TENTHS, TENTHS)),
                     SampleWindow("TTFT", ("c", "d"), (TENTHS, TENTHS)))
    assert str(e.value) == ("the ISL buckets differ between the runs (a, b; c, d): re-read both with the same "
                            "--isl-buckets")
    with pytest.raises(ExplainError) as e:
        compare_runs(window(BucketSamples(())), window(TENTHS))
    assert str(e.value) == "the baseline run has no TTFT observations in any ISL bucket"
    with pytest.raises(ValueError) as v:
        compare_runs(window(TENTHS), window(TENTHS), resamples=1)
    assert str(v.value) == "resamples must be >= 2, got 1"
    with pytest.raises(ValueError) as v:
        compare_runs(window(TENTHS), window(TENTHS), (1.5,))
    assert str(v.value) == "quantiles must be within [0, 1]"


def test_the_bounds_allowed() -> None:
    rows = compare_runs(window(TENTHS), window(TENTHS), (0.0, 1.0), resamples=2)
    assert [(d.q, d.baseline_s) for d in rows[0].quantiles] == [(0.0, pytest.approx(0.1)), (1.0, pytest.approx(1.0))]


def test_linear_quantiles_of_a_row_holding_one_value() -> None:
    got = linear_quantiles(np.array([1.0, 2.0, 3.0]), np.array([[0, 1, 0], [1, 1, 1], [0, 0, 0]]), (0.5, 1.0))
    assert got[:2].tolist() == [[2.0, 2.0], [2.0, 3.0]]
    assert np.isnan(got[2]).all()


def test_bootstrap_of_one_request_draws_it_every_time() -> None:
    point, reps = bootstrap_quantiles(one([0.5]), (0.5,), 10, np.random.default_rng(0))
    assert point.tolist() == [0.5] and reps.tolist() == [[0.5]] * 10
