"""Two bench runs compared bucket by bucket: bootstrap intervals on quantile differences."""

import math
from dataclasses import replace

import numpy as np
import pytest

from servelens.core.compare import (
    MIXED,
    NO_DATA_RUNS,
    ONLY_BASELINE,
    ONLY_CANDIDATE,
    bootstrap_quantiles,
    compare_runs,
    linear_quantiles,
)
from servelens.core.decompose import FASTER, SLOWER, TOO_FEW, UNCHANGED
from servelens.core.summary import RequestSample, rows_from_samples
from servelens.core.windows import BucketSamples, ExplainError, SampleWindow
from servelens.testing.latency_windows import BUCKETS, EARLY_MIX, clustered_window, sample_window

N = 3000


def verdicts(rows: tuple) -> dict[str, str]:  # type: ignore[type-arg]
    return {r.label: r.verdict for r in rows}


def test_linear_quantiles_are_numpys() -> None:
    rng = np.random.default_rng(0)
    v = np.sort(rng.lognormal(0, 1, 57))
    qs = (0.0, 0.5, 0.95, 0.99, 1.0)
    assert linear_quantiles(v, np.ones((1, v.size)), qs)[0] == pytest.approx(np.quantile(v, qs))
    w = rng.integers(0, 4, (5, v.size))
    got = linear_quantiles(v, w, qs)
    for r in range(5):
        assert got[r] == pytest.approx(np.quantile(np.repeat(v, w[r]), qs))
    assert np.isnan(linear_quantiles(v, np.zeros((1, v.size)), qs)).all()


def test_run_figures_equal_the_tables() -> None:
    a = sample_window(1, EARLY_MIX, 800)
    samples = [RequestSample(int(BUCKETS.boundaries[k] if k < 6 else 20000), True, t)
               for k, b in enumerate(a.buckets) for t in b.values_s]
    rows = rows_from_samples(samples, BUCKETS)
    got = compare_runs(a, a, resamples=20)
    for row, cmp in zip(rows, got, strict=False):
        assert cmp.label == row.bucket
        assert cmp.quantiles[0].baseline_s == pytest.approx(row.ttft_p50_s)
        assert cmp.quantiles[1].candidate_s == pytest.approx(row.ttft_p95_s)


@pytest.mark.parametrize("seed", [1, 2])
def test_same_engine_twice_is_no_significant_change_everywhere(seed: int) -> None:
    got = compare_runs(sample_window(seed, EARLY_MIX, N), sample_window(seed + 10, EARLY_MIX, N), seed=seed)
    assert set(verdicts(got).values()) == {UNCHANGED}
    for r in got:
        for d in r.quantiles:
            if d.verdict != TOO_FEW:
                assert d.ci_s is not None and d.ci_s[0] < 0 < d.ci_s[1]


@pytest.mark.parametrize("seed", [1, 2])
def test_slowdown_shows_in_its_buckets_only(seed: int) -> None:
    got = compare_runs(sample_window(seed, EARLY_MIX, N), sample_window(seed + 10, EARLY_MIX, N, {1: 1.3, 3: 0.7}),
                       seed=seed)
    want = {label: UNCHANGED for label in BUCKETS.labels} | {"513-1024": SLOWER, "2049-4096": FASTER}
    assert verdicts(got) == want
    slow = got[1]
    assert slow.quantiles[0].diff_s is not None and slow.quantiles[0].diff_s > 0
    assert slow.quantiles[0].ci_s is not None and slow.quantiles[0].ci_s[0] > 0


def test_faster_median_slower_tail_is_mixed() -> None:
    rng = np.random.default_rng(3)
    base = rng.lognormal(0, 0.3, 2000)
    cand = np.concatenate([rng.lognormal(-0.3, 0.3, 1800), rng.lognormal(1.0, 0.3, 200)])
    one = ("0-512",)
    got = compare_runs(SampleWindow("TTFT", one, (BucketSamples(tuple(base)),)),
                       SampleWindow("TTFT", one, (BucketSamples(tuple(cand)),)))
    assert [d.verdict for d in got[0].quantiles] == [FASTER, SLOWER, SLOWER]
    assert got[0].verdict == MIXED


def test_small_buckets_and_tails_are_not_judged() -> None:
    a, b = sample_window(4, EARLY_MIX, 1000), sample_window(5, EARLY_MIX, 1000, {6: 3.0})
    # 16385+ has about 30 requests: p50 is judged, p95 (1.5 above it) and p99 are not
    got = compare_runs(a, b)
    top = got[6]
    assert [d.verdict for d in top.quantiles] == [SLOWER, TOO_FEW, TOO_FEW]
    assert top.quantiles[2].diff_s is not None and top.quantiles[2].ci_s is None
    assert top.verdict == SLOWER
    # p99 needs 500 observations in each run
    assert all(d.verdict == TOO_FEW for r in got for d in r.quantiles[2:])
    empty = replace(b, buckets=(BucketSamples(()), *b.buckets[1:]))
    first = compare_runs(a, empty, resamples=50)[0]
    # no request in the candidate is not "too few": it has none (was TOO_FEW, as a bucket of 3 requests)
    assert first.verdict == ONLY_BASELINE and first.requests_candidate == 0
    assert [d.verdict for d in first.quantiles] == [ONLY_BASELINE] * 3
    assert first.quantiles[0].candidate_s is None and first.quantiles[0].baseline_s is not None
    assert compare_runs(empty, a, resamples=50)[0].verdict == ONLY_CANDIDATE


def test_a_bucket_empty_in_both_runs_has_no_data() -> None:
    """As explain says of its windows; ``report --compare`` called such a bucket "too few"."""
    a, b = sample_window(4, EARLY_MIX, 1000), sample_window(5, EARLY_MIX, 1000)
    a, b = (replace(w, buckets=(*w.buckets[:6], BucketSamples(()))) for w in (a, b))
    top = compare_runs(a, b, resamples=50)[6]
    assert (top.label, top.verdict, top.requests_baseline, top.requests_candidate) == ("16385+", NO_DATA_RUNS, 0, 0)
    assert [(d.verdict, d.baseline_s, d.candidate_s) for d in top.quantiles] == [(NO_DATA_RUNS, None, None)] * 3


def test_itl_resamples_whole_requests() -> None:
    a, b = clustered_window(6, EARLY_MIX, 300, 30), clustered_window(7, EARLY_MIX, 300, 30)
    point, reps = bootstrap_quantiles(a.buckets[0], (0.5,), 500, np.random.default_rng(0))
    flat = BucketSamples(a.buckets[0].values_s)
    _, naive = bootstrap_quantiles(flat, (0.5,), 500, np.random.default_rng(0))
    assert point[0] == pytest.approx(np.quantile(a.buckets[0].values_s, 0.5))
    assert reps[:, 0].std() > 3 * naive[:, 0].std()  # 30 correlated tokens per request
    got = compare_runs(a, b)
    assert set(verdicts(got).values()) <= {UNCHANGED, TOO_FEW}
    assert got[0].requests_baseline == a.buckets[0].request_sizes().size


def test_compare_errors() -> None:
    a = sample_window(1, EARLY_MIX, 100)
    with pytest.raises(ExplainError, match="ISL buckets differ"):
        compare_runs(a, SampleWindow("TTFT", tuple(f"b{i}" for i in range(7)), a.buckets))
    with pytest.raises(ExplainError, match="different metrics"):
        compare_runs(a, replace(a, metric="ITL"))
    with pytest.raises(ExplainError, match="candidate run has no TTFT"):
        compare_runs(a, replace(a, buckets=(BucketSamples(()),) * 7))
    with pytest.raises(ValueError):
        compare_runs(a, a, resamples=1)
    with pytest.raises(ValueError):
        compare_runs(a, a, quantiles=(95,))
    assert math.isfinite(compare_runs(a, a, resamples=10)[0].quantiles[0].baseline_s or math.nan)
