"""core/capacity on inputs worked out by hand: every field of every bucket's row (engine split, fit
split, engine-wide split), the notes word for word and in order, the thresholds met exactly (five
requests judged, queue equal to prefill, counts of 1), and the verdict line in each of its branches
(issue 21)."""

from __future__ import annotations

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.capacity import (
    PREFILL,
    QUEUE,
    BucketCapacity,
    BucketMeans,
    CapacityReport,
    CapacitySample,
    EngineTimes,
    PrefillFit,
    capacity_from_histograms,
    capacity_from_samples,
    intercept_note,
    verdict_line,
)

BUCKETS = IslBuckets((1000, 4000))  # 0-1000, 1001-4000, 4001+
S = CapacitySample
EMPTY_MIDDLE = BucketCapacity("1001-4000", 0, None, None, None, None, None, None, None)

NO_ENGINE_WITH_FIT = ("no queue or prefill time per request from the engine: the split is TTFT minus the fitted "
                      "prefill time, and the wait includes fixed overhead and time in steps shared with other "
                      "requests' prefill")
NO_ENGINE_NO_FIT = "no queue or prefill time per request from the engine and no fit: no split"
HIST_NO_ENGINE = ("no queue or prefill times from the engine (vllm:request_queue_time_seconds, "
                  "vllm:request_prefill_time_seconds): ")
HIST_NO_TOKENS = ("prefill throughput: the fit needs uncached tokens per bucket: per-request data (bench "
                  "results) or a prompt-token sum per isl_bucket, which this source does not have")


def test_engine_split_rows_field_by_field_and_the_notes_in_order() -> None:
    samples = (
        # five requests, queue == prefill: judged (five is enough), prefill-limited (queue not above prefill);
        # 400 uncached tokens each (1000 - 600 cached): 2000 tokens in 2.5 s of prefill
        [S(1000, 600, 1.0, 0.5, 0.5) for _ in range(5)]
        # one request, its prompt wholly cached: no uncached tokens, no rate
        + [S(2000, 2000, 0.3, 0.2, 0.1)]
        # two requests, one without a prefill time: the split is the other's; 5000 tokens in 0.25 s
        + [S(5000, 0, 2.0, 1.0, 0.25), S(5000, 0, 2.0, 1.0, None)]
    )
    rep = capacity_from_samples(samples, BUCKETS)
    assert rep.buckets == (
        BucketCapacity("0-1000", 5, 1.0, 0.5, 0.5, 400.0, 800.0, PREFILL, "engine"),
        BucketCapacity("1001-4000", 1, 0.3, 0.2, 0.1, 0.0, None, None, "engine"),
        BucketCapacity("4001+", 2, 2.0, 1.0, 0.25, 5000.0, 20000.0, None, "engine"),
    )
    assert rep.fit is None
    assert rep.notes == (
        "prefill throughput: 8 request(s) with a TTFT and known prompt tokens, a fit needs at least 20",
        "1 of 8 requests have no engine times: the split is over the others",
        "fewer than 5 requests in 1001-4000, 4001+: not judged",
    )
    assert (rep.engine_queue_mean_s, rep.engine_prefill_mean_s) == (None, None)


def test_engine_rate_needs_prefill_time_and_tokens_and_one_token_is_enough() -> None:
    samples = [S(1, 0, 0.6, 0.1, 0.5),  # one uncached token in 0.5 s: 2 tokens/s
               S(2000, 0, 0.3, 0.3, 0.0)]  # no prefill time: no rate
    rep = capacity_from_samples(samples, BUCKETS)
    assert [b.prefill_rate_tps for b in rep.buckets] == [2.0, None, None]
    assert rep.buckets[1] == BucketCapacity("1001-4000", 1, 0.3, 0.3, 0.0, 2000.0, None, None, "engine")
    # every request has engine times: no note about the ones that do not
    assert rep.notes == (
        "prefill throughput: 2 request(s) with a TTFT and known prompt tokens, a fit needs at least 20",
        "fewer than 5 requests in 0-1000, 1001-4000: not judged",
    )


# 20 requests, 100 tokens cached each: ten at 500 uncached tokens (TTFT 1.25 s), ten at 5000 (5.75 s).
# TTFT = 0.75 s + uncached / 1000 tokens/s: every pairwise slope is 1 ms/token; against ISL the intercept
# would be 0.65 s. Per bucket: prefill = uncached / 1000, the rest of the TTFT is the wait.
FIT_LINE = [S(600, 100, 1.25) for _ in range(10)] + [S(5100, 100, 5.75) for _ in range(10)]


def test_fit_split_rows_field_by_field() -> None:
    rep = capacity_from_samples(FIT_LINE, BUCKETS)
    assert rep.fit is not None
    assert rep.fit.x == "uncached" and rep.fit.requests == 20
    assert rep.fit.throughput_tps == pytest.approx(1000, rel=1e-12)
    assert rep.fit.intercept_s == pytest.approx(0.75, rel=1e-12)
    low, mid, high = rep.buckets
    assert mid == EMPTY_MIDDLE  # no requests: no rate, no split, even with a fit
    assert (low.label, low.requests, low.ttft_mean_s, low.uncached_mean_tokens) == ("0-1000", 10, 1.25, 500.0)
    assert low.queue_mean_s == pytest.approx(0.75) and low.prefill_mean_s == pytest.approx(0.5)
    assert low.prefill_rate_tps == rep.fit.throughput_tps
    assert (low.limited_by, low.split) == (QUEUE, "fit")
    assert (high.label, high.requests, high.ttft_mean_s, high.uncached_mean_tokens) == ("4001+", 10, 5.75, 5000.0)
    assert high.queue_mean_s == pytest.approx(0.75) and high.prefill_mean_s == pytest.approx(5.0)
    assert high.prefill_rate_tps == rep.fit.throughput_tps
    assert (high.limited_by, high.split) == (PREFILL, "fit")
    assert rep.notes == (NO_ENGINE_WITH_FIT,)
    assert verdict_line(rep) == (
        "where the capacity is short: 0-1000 wait in the queue (queue 60% of queue + prefill); 4001+ are slow "
        "to prefill (prefill 87% of queue + prefill); prefill throughput 1,000 tokens/s, fixed overhead + "
        "queue floor 750 ms")


def test_requests_without_cached_tokens_are_left_out_of_the_fit_and_their_bucket_is_not_split() -> None:
    rep = capacity_from_samples(FIT_LINE + [S(2000, None, 3.0) for _ in range(3)], BUCKETS)
    assert rep.fit is not None and rep.fit.requests == 20
    assert rep.fit.intercept_s == pytest.approx(0.75, rel=1e-12)
    assert rep.buckets[1] == BucketCapacity("1001-4000", 3, 3.0, None, None, None, None, None, None)
    assert rep.notes == (
        "3 of 23 requests without cached tokens are left out of the fit",
        NO_ENGINE_WITH_FIT,
        "fewer than 5 requests in 1001-4000: not judged",
    )


def test_no_cached_tokens_anywhere_fits_against_isl_and_says_so() -> None:
    rep = capacity_from_samples([S(s.isl, None, s.ttft_s) for s in FIT_LINE], BUCKETS)
    assert rep.fit is not None and rep.fit.x == "isl"
    assert rep.fit.intercept_s == pytest.approx(0.65, rel=1e-12)  # TTFT = 0.65 s + ISL / 1000
    assert rep.buckets[0].uncached_mean_tokens == 600.0  # the ISL, what the fit is against
    assert rep.notes == (
        "no request reported cached tokens: the fit is against ISL (exact only when the engine has no prefix "
        "cache)",
        NO_ENGINE_WITH_FIT,
    )


def test_nothing_timed_has_one_note() -> None:
    for samples in ([], [S(500, 0, None, 0.1, 0.2)]):
        rep = capacity_from_samples(samples, BUCKETS)
        assert rep.notes == ("no request with a first token: nothing to split",)
        assert rep.fit is None
        assert rep.buckets == (BucketCapacity("0-1000", 0, None, None, None, None, None, None, None), EMPTY_MIDDLE,
                               BucketCapacity("4001+", 0, None, None, None, None, None, None, None))


def test_no_engine_times_and_no_fit_is_no_split() -> None:
    rep = capacity_from_samples([S(500, 0, 0.5) for _ in range(6)], BUCKETS)
    assert rep.buckets[0] == BucketCapacity("0-1000", 6, 0.5, None, None, 500.0, None, None, None)
    assert rep.notes == (
        "prefill throughput: 6 request(s) with a TTFT and known prompt tokens, a fit needs at least 20",
        NO_ENGINE_NO_FIT,
    )


# Bucket means on TTFT = 0.75 s + uncached / 1000 tokens/s (an exact line: the weighted fit recovers it).
ON_THE_LINE = [BucketMeans("0-1000", 10, 1.25, 500.0), BucketMeans("1001-4000", 1, 3.25, 2500.0),
               BucketMeans("4001+", 8, 6.25, 5500.0)]


def test_histogram_fit_split_rows_and_a_bucket_without_requests() -> None:
    # the last bucket has a mean TTFT but no requests (a rounding of the window's counts): it is not a
    # point of the fit, shows no TTFT and is not split
    rep = capacity_from_histograms([*ON_THE_LINE, BucketMeans("16385+", 0, 0.3, None)], None)
    assert rep.fit is not None and rep.fit.requests == 3
    assert rep.fit.throughput_tps == pytest.approx(1000, rel=1e-9)
    assert rep.fit.intercept_s == pytest.approx(0.75, rel=1e-9)
    rows = rep.buckets
    assert [(b.label, b.requests, b.ttft_mean_s, b.uncached_mean_tokens, b.split) for b in rows] == [
        ("0-1000", 10, 1.25, 500.0, "fit"), ("1001-4000", 1, 3.25, 2500.0, "fit"), ("4001+", 8, 6.25, 5500.0, "fit"),
        ("16385+", 0, None, None, None)]
    for b, prefill in zip(rows[:3], (0.5, 2.5, 5.5), strict=True):
        assert b.prefill_mean_s == pytest.approx(prefill, rel=1e-9)
        assert b.queue_mean_s == pytest.approx(0.75, rel=1e-9)
        assert b.prefill_rate_tps == pytest.approx(1000, rel=1e-9)  # uncached / prefill
    assert [b.limited_by for b in rows] == [QUEUE, None, PREFILL, None]
    assert (rows[3].queue_mean_s, rows[3].prefill_mean_s, rows[3].prefill_rate_tps) == (None, None, None)
    assert rep.notes == (HIST_NO_ENGINE + "the split is TTFT minus the fitted prefill time",)


def test_histogram_engine_wide_split_with_counts_of_one() -> None:
    rep = capacity_from_histograms(
        [BucketMeans("0-1000", 10, 1.0, 400.0), BucketMeans("1001-4000", 1, 0.3, None),
         BucketMeans("4001+", 0, 0.2, None)],
        EngineTimes(0.5, 1, 0.25, 1))
    assert (rep.engine_queue_mean_s, rep.engine_prefill_mean_s) == (0.5, 0.25)
    assert rep.buckets == (
        # the engine's 0.5 s of queue, the rest of the mean TTFT prefill: equal, so prefill-limited
        BucketCapacity("0-1000", 10, 1.0, 0.5, 0.5, 400.0, 800.0, PREFILL, "engine-wide"),
        # a TTFT under the engine's queue mean: all of it queue; one request, not judged
        BucketCapacity("1001-4000", 1, 0.3, 0.3, 0.0, None, None, None, "engine-wide"),
        BucketCapacity("4001+", 0, None, None, None, None, None, None, None),
    )
    assert rep.fit is None
    assert rep.notes == (
        HIST_NO_TOKENS,
        "the engine's queue and prefill histograms are not per ISL bucket: each bucket is taken to wait the "
        "engine's mean queue time (0.5 s; FIFO admission does not look at a prompt's length), its prefill is its "
        "mean TTFT minus that",
    )


@pytest.mark.parametrize("engine", [EngineTimes(1.0, 0, 0.5, 10), EngineTimes(1.0, 10, 0.5, 0)])
def test_histogram_engine_without_queue_or_prefill_observations_is_no_engine(engine: EngineTimes) -> None:
    rep = capacity_from_histograms(ON_THE_LINE, engine)
    assert (rep.engine_queue_mean_s, rep.engine_prefill_mean_s) == (None, None)
    assert [b.split for b in rep.buckets] == ["fit", "fit", "fit"]
    assert rep.notes == (HIST_NO_ENGINE + "the split is TTFT minus the fitted prefill time",)


def test_histogram_one_request_no_tokens_no_engine() -> None:
    rep = capacity_from_histograms([BucketMeans("a", 1, 0.5, None)], None)
    assert rep.buckets == (BucketCapacity("a", 1, 0.5, None, None, None, None, None, None),)
    assert rep.notes == (HIST_NO_TOKENS, HIST_NO_ENGINE + "no split")


def test_histogram_notes_of_the_fit_and_of_no_observations() -> None:
    rep = capacity_from_histograms(ON_THE_LINE[:2], None)
    assert rep.fit is None
    assert rep.notes == ("prefill throughput: 2 bucket(s) with requests, a fit over bucket means needs 3",
                         HIST_NO_ENGINE + "no split")
    rep = capacity_from_histograms([BucketMeans("a", 0, None, None)], None)
    assert rep.notes == ("no TTFT observations in any bucket: nothing to split", HIST_NO_ENGINE + "no split")


def row(label: str, limited_by: str | None, queue: float | None = None, prefill: float | None = None) -> BucketCapacity:
    return BucketCapacity(label, 10, None, queue, prefill, None, None, limited_by, "engine")


def test_verdict_every_bucket_waits_with_a_span() -> None:
    # the unjudged bucket does not count: both judged buckets wait
    rep = CapacityReport((row("a", QUEUE, 0.6, 0.4), row("b", None), row("c", QUEUE, 0.8, 0.2)), None, ())
    assert verdict_line(rep) == ("where the capacity is short: every bucket waits in the queue (queue 60-80% of "
                                 "queue + prefill)")


def test_verdict_every_bucket_is_slow_to_prefill() -> None:
    rep = CapacityReport((row("a", PREFILL, 0.2, 0.8), row("b", PREFILL, 0.3, 0.7)), None, ())
    assert verdict_line(rep) == ("where the capacity is short: every bucket is slow to prefill (prefill 70-80% of "
                                 "queue + prefill)")


def test_verdict_shares_that_round_alike_are_one_figure_and_the_fit_is_added() -> None:
    rep = CapacityReport((row("a", QUEUE, 0.601, 0.399), row("b", QUEUE, 0.604, 0.396), row("c", PREFILL, 0.25, 0.75)),
                         PrefillFit(100, 5991.4, 5000.0, 7000.0, 0.3004, "uncached", "theil-sen"), ())
    assert verdict_line(rep) == (
        "where the capacity is short: a, b wait in the queue (queue 60% of queue + prefill); c are slow to "
        "prefill (prefill 75% of queue + prefill); prefill throughput 5,991 tokens/s, fixed overhead + queue "
        "floor 300 ms")


def test_verdict_one_judged_bucket_is_named() -> None:
    rep = CapacityReport((row("a", QUEUE, 0.6, 0.4), row("b", None)), None, ())
    assert verdict_line(rep) == "where the capacity is short: a wait in the queue (queue 60% of queue + prefill)"


def test_verdict_a_bucket_without_a_share_is_not_in_the_line() -> None:
    # zero queue and zero prefill: judged (prefill, as queue is not above it) but no share to show
    rep = CapacityReport((row("a", PREFILL, 0.0, 0.0),), None, ())
    assert verdict_line(rep) == "where the capacity is short: no bucket could be judged (see the notes)"


@pytest.mark.parametrize(("intercept_s", "floor"), [
    (0.0, "fixed overhead + queue floor 0 ms"),  # 0 is no overhead, not below 0
    (-0.9, "fixed overhead + queue floor not resolved (the fit's intercept is -900 ms, below 0: see the note)"),
])
def test_verdict_fit_intercept_at_zero_and_below(intercept_s: float, floor: str) -> None:
    rep = CapacityReport((row("a", QUEUE, 0.6, 0.4),), PrefillFit(3, 2000.0, None, None, intercept_s, "uncached",
                                                                    "wls-bucket-means"), ())
    assert verdict_line(rep) == ("where the capacity is short: a wait in the queue (queue 60% of queue + prefill); "
                                 f"prefill throughput 2,000 tokens/s, {floor}")


def test_intercept_note_only_below_zero() -> None:
    def fit(intercept_s: float) -> PrefillFit:
        return PrefillFit(3, 2000.0, None, None, intercept_s, "uncached", "wls-bucket-means")

    assert intercept_note(None) is None and intercept_note(fit(0.0)) is None and intercept_note(fit(0.25)) is None
    assert intercept_note(fit(-0.9)) == (
        "prefill throughput: the fitted line's intercept is -900.0 ms, below 0, which no overhead or wait can be: "
        "TTFT is not linear in the prompt's tokens here (attention makes long prompts cost more per token), so the "
        "fixed overhead + queue floor cannot be read from the fit")
