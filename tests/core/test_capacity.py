"""core/capacity: the TTFT split per bucket, the prefill-throughput fit, and the notes on bad input."""

from __future__ import annotations

import math

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.capacity import (
    MIN_FIT_REQUESTS,
    PREFILL,
    QUEUE,
    BucketMeans,
    CapacitySample,
    EngineTimes,
    capacity_from_histograms,
    capacity_from_samples,
    fit_bucket_means,
    fit_prefill,
    verdict_line,
)

BUCKETS = IslBuckets((1000, 4000))


def line(n: int, rate: float, base: float, cached: int | None = 0, queue: float | None = None) -> list[CapacitySample]:
    """Requests with TTFT = base + uncached / rate, ISL spread over 100..8000."""
    out = []
    for i in range(n):
        isl = 100 + (7900 * i) // max(1, n - 1)
        unc = isl - (cached or 0)
        ttft = base + unc / rate
        out.append(CapacitySample(isl, cached, ttft, queue, None if queue is None else ttft - queue))
    return out


def test_fit_recovers_rate_and_intercept_and_resists_outliers() -> None:
    xs = [float(100 * i) for i in range(1, 101)]
    ys = [0.05 + x / 20_000 for x in xs]
    for i in range(0, 100, 10):  # 10 % of the requests stuck behind something: +2 s
        ys[i] += 2.0
    fit, note = fit_prefill(xs, ys)
    assert note is None and fit is not None
    assert fit.throughput_tps == pytest.approx(20_000, rel=1e-6)
    assert fit.intercept_s == pytest.approx(0.05, abs=1e-6)
    assert fit.throughput_low_tps is not None and fit.throughput_high_tps is not None
    assert fit.throughput_low_tps <= fit.throughput_tps <= fit.throughput_high_tps
    assert fit.method == "theil-sen" and fit.requests == 100


@pytest.mark.parametrize(("xs", "ys", "says"), [
    ([1.0] * (MIN_FIT_REQUESTS - 1), [0.1] * (MIN_FIT_REQUESTS - 1), "a fit needs at least"),
    ([500.0] * 30, [0.1 + i / 100 for i in range(30)], "same uncached token count"),
    ([float(i) for i in range(30)], [1.0 - i / 100 for i in range(30)], "does not grow"),
])
def test_fit_refuses_with_a_note(xs: list[float], ys: list[float], says: str) -> None:
    fit, note = fit_prefill(xs, ys)
    assert fit is None and note is not None and says in note


def test_fit_lengths_must_match() -> None:
    with pytest.raises(ValueError, match="token counts for"):
        fit_prefill([1.0, 2.0], [1.0])


def test_engine_split_decides_per_bucket() -> None:
    # short prompts wait 1 s and prefill fast; long ones wait little and prefill for long
    samples = [CapacitySample(500, 0, 1.05, 1.0, 0.05) for _ in range(10)]
    samples += [CapacitySample(6000, 0, 2.1, 0.1, 2.0) for _ in range(10)]
    rep = capacity_from_samples(samples, BUCKETS)
    by = {b.label: b for b in rep.buckets}
    assert by["0-1000"].limited_by == QUEUE and by["4001+"].limited_by == PREFILL
    assert by["0-1000"].split == "engine" and by["0-1000"].queue_mean_s == pytest.approx(1.0)
    assert by["4001+"].prefill_rate_tps == pytest.approx(3000)
    assert by["1001-4000"].requests == 0 and by["1001-4000"].limited_by is None
    assert rep.waiting() == ("0-1000",) and rep.prefilling() == ("4001+",)
    text = verdict_line(rep)
    assert "0-1000 wait in the queue" in text and "4001+ are slow to prefill" in text
    # 20 requests: the fit is made, its note is absent; no request lacks engine times
    assert rep.fit is None or rep.fit.method == "theil-sen"


def test_split_from_the_fit_without_engine_times() -> None:
    rep = capacity_from_samples(line(60, 10_000, 0.5), BUCKETS)
    assert rep.fit is not None and rep.fit.throughput_tps == pytest.approx(10_000, rel=1e-6)
    by = {b.label: b for b in rep.buckets}
    for b in rep.buckets:
        assert b.split == "fit"
        assert b.queue_mean_s is not None and b.prefill_mean_s is not None and b.ttft_mean_s is not None
        assert b.queue_mean_s + b.prefill_mean_s == pytest.approx(b.ttft_mean_s)
    # the 0.5 s floor is longer than a short prompt's prefill, shorter than a long one's
    assert by["0-1000"].limited_by == QUEUE and by["4001+"].limited_by == PREFILL
    assert any("no queue or prefill time per request" in n for n in rep.notes)


def test_without_cached_tokens_the_fit_is_against_isl_and_says_so() -> None:
    rep = capacity_from_samples(line(40, 10_000, 0.0, cached=None), BUCKETS)
    assert rep.fit is not None and rep.fit.x == "isl"
    assert any("against ISL" in n for n in rep.notes)


def test_bad_input_is_a_note_never_a_number() -> None:
    empty = capacity_from_samples([], BUCKETS)
    assert empty.fit is None and all(b.limited_by is None for b in empty.buckets)
    assert any("no request with a first token" in n for n in empty.notes)
    few = capacity_from_samples(line(3, 10_000, 0.1, queue=0.05), BUCKETS)
    assert few.fit is None and any("a fit needs at least" in n for n in few.notes)
    assert any("not judged" in n for n in few.notes)
    assert all(b.limited_by is None for b in few.buckets)
    assert "no bucket could be judged" in verdict_line(few)
    # no engine times and no fit: no split at all
    none = capacity_from_samples(line(3, 10_000, 0.1), BUCKETS)
    assert all(b.queue_mean_s is None and b.prefill_mean_s is None for b in none.buckets)
    assert any("no split" in n for n in none.notes)


def test_histograms_engine_wide_split_assumes_the_same_queue_everywhere() -> None:
    means = [BucketMeans("0-1000", 50, 1.1, None), BucketMeans("1001-4000", 30, 1.5, None),
             BucketMeans("4001+", 20, 4.0, None)]
    rep = capacity_from_histograms(means, EngineTimes(100.0, 100, 50.0, 100))
    assert rep.engine_queue_mean_s == 1.0 and rep.engine_prefill_mean_s == 0.5
    by = {b.label: b for b in rep.buckets}
    assert by["0-1000"].queue_mean_s == 1.0 and by["0-1000"].prefill_mean_s == pytest.approx(0.1)
    assert by["0-1000"].limited_by == QUEUE and by["4001+"].limited_by == PREFILL
    assert all(b.split == "engine-wide" for b in rep.buckets)
    assert rep.fit is None
    assert any("not per ISL bucket" in n for n in rep.notes)
    assert any("needs uncached tokens per bucket" in n for n in rep.notes)


def test_histograms_without_engine_or_tokens_say_why() -> None:
    means = [BucketMeans("0-1000", 0, None, None), BucketMeans("1001-4000", 0, None, None)]
    rep = capacity_from_histograms(means, None)
    assert any("no TTFT observations" in n for n in rep.notes)
    assert any("no queue or prefill times from the engine" in n for n in rep.notes)
    assert all(b.limited_by is None and b.ttft_mean_s is None for b in rep.buckets)


def test_fit_over_bucket_means_is_exact_for_a_linear_engine() -> None:
    # mean TTFT = a + mean(uncached) / rate holds for means: the fit over buckets recovers it
    unc = [300.0, 2500.0, 9000.0]
    ttft = [0.2 + u / 8000 for u in unc]
    fit, note = fit_bucket_means(unc, ttft, [10, 5, 1])
    assert note is None and fit is not None
    assert fit.throughput_tps == pytest.approx(8000) and fit.intercept_s == pytest.approx(0.2)
    assert fit.throughput_low_tps is None and fit.method == "wls-bucket-means"
    fit, note = fit_bucket_means(unc[:2], ttft[:2], [1, 1])
    assert fit is None and note is not None and "needs 3" in note
    rep = capacity_from_histograms([BucketMeans(lab, n, t, u) for lab, n, t, u in
                                    zip(("a", "b", "c"), (10, 5, 1), ttft, unc, strict=True)], None)
    assert rep.fit is not None and all(b.split == "fit" for b in rep.buckets)
    assert not math.isnan(rep.fit.throughput_tps)


def test_a_fitted_intercept_below_zero_is_not_shown_as_an_overhead() -> None:
    """``explain --capacity`` printed "fixed overhead + queue floor -3 ms": a line through a TTFT that grows
    faster than linearly (attention) meets 0 tokens below 0, which no overhead can be."""
    xs = [100 + (7900 * i) // 59 for i in range(60)]
    convex = [CapacitySample(x, 0, 0.002 + x / 40_000 + 0.1 * (x / 4000) ** 2, None, None) for x in xs]
    rep = capacity_from_samples(convex, BUCKETS)
    assert rep.fit is not None and rep.fit.intercept_s < 0
    ms = rep.fit.intercept_s * 1000
    assert verdict_line(rep).endswith(
        f"prefill throughput {rep.fit.throughput_tps:,.0f} tokens/s, fixed overhead + queue floor not resolved (the "
        f"fit's intercept is {ms:.0f} ms, below 0: see the note)")
    assert rep.notes[0] == (
        f"prefill throughput: the fitted line's intercept is {ms:.1f} ms, below 0, which no overhead or wait can "
        "be: TTFT is not linear in the prompt's tokens here (attention makes long prompts cost more per token), so "
        "the fixed overhead + queue floor cannot be read from the fit")
    # the same from bucket means; an intercept at or above 0 is shown as it was, with no such note
    means = capacity_from_histograms([BucketMeans(lab, 10, 0.002 + u / 40_000 + 0.1 * (u / 4000) ** 2, u)
                                      for lab, u in (("a", 300.0), ("b", 2500.0), ("c", 9000.0))], None)
    assert means.fit is not None and means.fit.intercept_s < 0
    assert any(n.startswith("prefill throughput: the fitted line's intercept is ") for n in means.notes)
    linear = capacity_from_samples(line(60, 20_000, 0.05), BUCKETS)
    assert verdict_line(linear).endswith("fixed overhead + queue floor 50 ms")
    assert not any("intercept" in n for n in linear.notes)
