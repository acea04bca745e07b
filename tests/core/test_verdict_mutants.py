"""The verdict line's exact text on explanations built by hand: every branch of the verdict, the
figures of the buckets named, the buckets the traffic moved toward, the number format (issue 21)."""

from __future__ import annotations

from dataclasses import replace

from servelens.core.decompose import FASTER, SLOWER, UNCHANGED, BucketChange, Explanation, QuantileShift
from servelens.core.verdict import format_s, not_measured, shifted_toward, verdict_line

LABELS = ("0-512", "513-1024", "1025-2048", "2049+")


def bucket(label: str, share: tuple[float, float], mean: tuple[float | None, float | None], change: str = UNCHANGED,
           p95: tuple[float | None, float | None] = (None, None), latency: float = 0.0) -> BucketChange:
    return BucketChange(
        label=label, count_before=10.0, count_after=10.0, share_before=share[0], share_after=share[1],
        mean_before_s=mean[0], mean_after_s=mean[1], mean_change_ci_s=None, mix_effect_s=0.0,
        latency_effect_s=latency, latency_effect_ci_s=(0.0, 0.0), change=change,
        quantiles_before_s=(p95[0],), quantiles_after_s=(p95[1],),
    )


def explanation(verdict: str, buckets: tuple[BucketChange, ...], p95: tuple[float | None, float | None, float | None],
                mix: float = 0.0, latency: float = 0.0, mean: tuple[float, float] = (1.0, 1.0)) -> Explanation:
    return Explanation(
        metric="TTFT", labels=LABELS, exact=True, count_before=40.0, count_after=40.0, mean_before_s=mean[0],
        mean_after_s=mean[1], counterfactual_mean_s=mean[0], quantiles=(QuantileShift(0.95, *p95),),
        mix_effect_s=mix, mix_effect_ci_s=(0.0, 0.0), latency_effect_s=latency, latency_effect_ci_s=(0.0, 0.0),
        interaction_s=0.0, verdict=verdict, buckets=buckets, confidence=0.95, uncertainty="", limitations=(),
    )


# the traffic moves from 0-512 (mean 0.5 s, below the 1 s overall) to 2049+ (2 s, above it)
MOVED = (
    bucket("0-512", (0.5, 0.2), (0.5, 0.5)),
    bucket("513-1024", (0.2, 0.2), (1.0, 1.0)),
    bucket("1025-2048", (0.2, 0.2), (1.5, 1.5)),
    bucket("2049+", (0.1, 0.4), (2.0, 2.0)),
)


def test_format_s_at_its_thresholds() -> None:
    assert [format_s(x) for x in (1.0, 0.999, 0.1, 0.0999, 0.0125, 0.0, None)] == [
        "1.0 s", "999 ms", "100 ms", "100 ms", "12 ms", "0 ms", "-"]


def test_mix_verdict_without_changed_buckets() -> None:
    e = explanation("mix", MOVED, (1.0, 1.6, 1.05), mix=0.45)
    assert verdict_line(e) == ("TTFT p95 rose 1.0 s -> 1.6 s; at the earlier mix it would be 1.1 s: a traffic shift "
                               "toward 2049+ prompts (mean: mix +450 ms, latency +0 ms), no bucket slower")
    toward_short = tuple(replace(b, share_before=b.share_after, share_after=b.share_before) for b in MOVED)
    e = explanation("mix", toward_short, (1.6, 1.0, None), mix=-0.45)
    assert verdict_line(e) == ("TTFT p95 fell 1.6 s -> 1.0 s: a traffic shift toward 0-512 prompts (mean: mix -450 ms, "
                               "latency +0 ms), no bucket faster")


def test_mix_verdict_with_buckets_that_also_changed() -> None:
    slowed = replace(MOVED[1], change=SLOWER, quantiles_before_s=(1.2,), quantiles_after_s=(1.8,), latency_effect_s=0.1)
    faster = replace(MOVED[2], change=FASTER, quantiles_before_s=(2.0,), quantiles_after_s=(1.5,),
                     latency_effect_s=-0.05)
    e = explanation("mix", (MOVED[0], slowed, faster, MOVED[3]), (1.0, 1.6, None), mix=0.45)
    assert verdict_line(e) == ("TTFT p95 rose 1.0 s -> 1.6 s: mostly a traffic shift toward 2049+ prompts (mean: mix "
                               "+450 ms, latency +0 ms); 513-1024 also slowed, 1.2 s -> 1.8 s; 1025-2048 also got "
                               "faster, 2.0 s -> 1.5 s")
    # a quantile that did not move the bucket's way (both in one le bucket): its mean, named so
    flat = replace(slowed, quantiles_before_s=(1.5,), quantiles_after_s=(1.5,), mean_before_s=1.0, mean_after_s=1.3)
    backwards = replace(faster, quantiles_before_s=(1.5,), quantiles_after_s=(1.6,))
    e = explanation("mix", (MOVED[0], flat, backwards, MOVED[3]), (1.0, 1.6, None), mix=0.45)
    assert verdict_line(e).endswith("; 513-1024 also slowed, mean 1.0 s -> 1.3 s; 1025-2048 also got faster, "
                                    "mean 1.5 s -> 1.5 s")
    unknown = replace(slowed, quantiles_before_s=(None,), mean_before_s=1.0, mean_after_s=1.3)
    e = explanation("mix", (MOVED[0], unknown, MOVED[2], MOVED[3]), (1.0, 1.6, None), mix=0.45)
    assert verdict_line(e).endswith("; 513-1024 also slowed, mean 1.0 s -> 1.3 s")


def test_latency_both_and_none_verdicts() -> None:
    slow = tuple(replace(b, change=SLOWER, quantiles_before_s=(1.0,), quantiles_after_s=(2.0,),
                         latency_effect_s=0.1 * (4 - i)) for i, b in enumerate(MOVED))
    e = explanation("latency", slow, (1.0, 2.0, 2.0), latency=0.5)
    assert verdict_line(e) == ("TTFT p95 rose 1.0 s -> 2.0 s; at the earlier mix it would be 2.0 s: slower within "
                               "buckets, not a traffic shift (mean: mix +0 ms, latency +500 ms); 0-512 slowed, "
                               "1.0 s -> 2.0 s; 513-1024 slowed, "
                               "1.0 s -> 2.0 s; 1025-2048 slowed, 1.0 s -> 2.0 s; 1 more bucket changed")
    assert verdict_line(e, top=2).endswith("; 2 more buckets changed")
    assert verdict_line(explanation("latency", MOVED, (2.0, 1.0, None), latency=-0.5)) == \
        "TTFT p95 fell 2.0 s -> 1.0 s: faster within buckets, not a traffic shift (mean: mix +0 ms, latency -500 ms)"
    e = explanation("both", MOVED, (1.0, 1.01, None), mix=0.45, latency=0.0)
    assert verdict_line(e) == ("TTFT p95 stayed at 1.0 s: a traffic shift toward 2049+ prompts and slower buckets "
                               "(mean: mix +450 ms, latency +0 ms)")
    e = explanation("both", MOVED, (None, 1.0, None), mix=-0.5, latency=-0.25)
    assert verdict_line(e) == ("TTFT p95 - -> 1.0 s: a traffic shift toward 2049+ prompts and faster buckets "
                               "(mean: mix -500 ms, latency -250 ms)")
    e = explanation("none", (replace(MOVED[0], change=SLOWER, quantiles_before_s=(0.5,), quantiles_after_s=(0.6,)),),
                    (1.0, 1.0, None), mean=(1.0, 1.02))
    assert verdict_line(e) == ("TTFT p95 stayed at 1.0 s: no significant change of the mean (1.0 s -> 1.0 s: mix "
                               "+0 s, latency +0 s); 0-512 slowed, 500 ms -> 600 ms")
    assert verdict_line(explanation("none", MOVED, (1.0, 1.0, None), mix=-0.01, latency=0.03)).endswith(
        "of the mean (1.0 s -> 1.0 s: mix -0.01 s, latency +0.03 s)")


def test_shifted_toward_covers_the_mix_effect() -> None:
    # both 1025-2048 and 2049+ gain and sit above the 1 s mean: pushes 1/8 x 0.5 and 1/4 x 1.0
    two = (MOVED[0], MOVED[1], replace(MOVED[2], share_before=0.25, share_after=0.375),
           replace(MOVED[3], share_before=0.125, share_after=0.375))
    e = explanation("mix", two, (1.0, 1.6, None), mix=0.3)
    assert shifted_toward(e) == "2049+"  # 0.25 of 0.3125 is exactly the 80 % cover: enough
    assert shifted_toward(e, cover=0.9) == "1025+"  # both, named as one range
    # a bucket only in the later window is weighed at its later mean
    later_only = (MOVED[0], MOVED[1], MOVED[2], replace(MOVED[3], mean_before_s=None))
    assert shifted_toward(explanation("mix", later_only, (1.0, 1.6, None), mix=0.45)) == "2049+"
    # no bucket pushes the mean the mix's way: the largest gain is named
    against = (replace(MOVED[0], share_after=0.6), replace(MOVED[1], share_after=0.1), MOVED[2],
               replace(MOVED[3], share_after=0.1))
    assert shifted_toward(explanation("mix", against, (1.0, 1.6, None), mix=0.2)) == "0-512"


def test_edge_cases_of_the_line() -> None:
    slow = tuple(replace(b, change=SLOWER, quantiles_before_s=(1.0,), quantiles_after_s=(2.0,),
                         latency_effect_s=0.1 * (4 - i)) for i, b in enumerate(MOVED))
    assert verdict_line(explanation("latency", slow, (1.0, 2.0, None), latency=0.5), top=4).endswith(
        "2049+ slowed, 1.0 s -> 2.0 s")  # all four shown: no "more buckets"
    assert verdict_line(explanation("latency", MOVED, (1.0, 1.0, None), latency=0.0)).endswith(
        # a latency effect of exactly 0 reads "slower"
        ": slower within buckets, not a traffic shift (mean: mix +0 ms, latency +0 ms)")
    assert verdict_line(explanation("mix", MOVED, (1.0, 1.6, None), mix=0.0)).endswith(", no bucket slower")
    assert verdict_line(explanation("none", MOVED, (1.0, None, None))).startswith("TTFT p95 1.0 s -> -: ")


def test_shifted_toward_weighs_the_earlier_mean_and_the_mix_sign() -> None:
    # 2049+ gains but its earlier mean (0.5 s) is below the overall 1 s: only 1025-2048 pushes the mean up
    earlier = (replace(MOVED[0], share_after=0.2), MOVED[1], replace(MOVED[2], share_after=0.3),
               replace(MOVED[3], share_after=0.3, mean_before_s=0.5))
    assert shifted_toward(explanation("mix", earlier, (1.0, 1.6, None), mix=0.1)) == "1025-2048"
    # a bucket only in the later window pushes with its later mean, ahead of a larger gain the other way
    later = (replace(MOVED[0], share_before=0.1, share_after=0.5),
             replace(MOVED[1], share_before=0.4, share_after=0.1),
             replace(MOVED[2], share_before=0.4, share_after=0.1),
             replace(MOVED[3], share_after=0.3, mean_before_s=None))
    assert shifted_toward(explanation("mix", later, (1.0, 1.6, None), mix=0.1)) == "2049+"
    # a mix effect of exactly 0 counts as a rise: 2049+ (above the mean) pushes, 0-512 (below) does not
    flat = (replace(MOVED[0], share_after=0.6), replace(MOVED[1], share_after=0.1),
            replace(MOVED[2], share_after=0.1), replace(MOVED[3], share_after=0.2))
    assert shifted_toward(explanation("mix", flat, (1.0, 1.0, None), mix=0.0)) == "2049+"
    # a gaining bucket exactly at the overall mean pushes neither way: the largest gain is named
    at_mean = (replace(MOVED[0], share_after=0.8), replace(MOVED[1], share_after=0.3),
               replace(MOVED[2], share_after=0.0), replace(MOVED[3], share_after=0.0))
    assert shifted_toward(explanation("mix", at_mean, (1.0, 1.0, None), mix=0.2)) == "0-512"


def test_a_quantile_interpolated_inside_one_le_bucket_gives_way_to_the_mean() -> None:
    """``duration p95 stayed at 1.9 s`` was 0.95 x the 2 s edge of the one le bucket holding every request;
    the line headlines the exact mean instead, and says why, and a bucket's figures are its means."""
    slowed = replace(MOVED[1], change=SLOWER, quantiles_before_s=(1.9,), quantiles_after_s=(1.95,),
                     mean_before_s=0.3, mean_after_s=0.45, latency_effect_s=0.1, le_range_before_s=(0.0, 2.0))
    e = replace(explanation("latency", (MOVED[0], slowed, MOVED[2], MOVED[3]), (1.9, 1.9, 1.9), latency=0.1,
                            mean=(0.245, 0.329)), counterfactual_mean_s=0.33, le_range_before_s=(0.0, 2.0),
                le_range_after_s=(0.0, 2.0), le_range_counterfactual_s=(0.0, 2.0))
    assert verdict_line(e) == (
        "TTFT mean rose 245 ms -> 329 ms (p95 not measured: every TTFT of both windows in the le bucket 0-2.0 s); "
        "at the earlier mix it would be 330 ms: slower within buckets, not a traffic shift (mean: mix +0 ms, "
        "latency +100 ms); 513-1024 slowed, mean 300 ms -> 450 ms")
    one = replace(e, le_range_after_s=None, le_range_counterfactual_s=None)
    assert "(p95 not measured: every TTFT of the earlier window in the le bucket 0-2.0 s)" in verdict_line(one)
    two = replace(e, le_range_after_s=(2.0, 4.0), le_range_counterfactual_s=None)
    assert "(p95 not measured: every value in one le bucket: earlier 0-2.0 s, later 2.0-4.0 s)" in verdict_line(two)
    top = replace(e, le_range_before_s=(510.0, float("inf")), le_range_after_s=None, le_range_counterfactual_s=None)
    assert "in the le bucket over 510 s)" in verdict_line(top)


def test_not_measured_names_the_counterfactual_alone_and_among_others() -> None:
    e = explanation("latency", MOVED, (1.0, 1.0, 1.0))
    assert not_measured(e) is None
    # only the later window at the earlier mix in one le bucket (each window's own quantiles measured)
    cf = replace(e, le_range_counterfactual_s=(0.0, 2.0))
    assert not_measured(cf) == "every TTFT of the later window at the earlier mix in the le bucket 0-2.0 s"
    # the earlier window and the counterfactual in different buckets: each named, in order
    both = replace(e, le_range_before_s=(0.0, 2.0), le_range_counterfactual_s=(2.0, 4.0))
    assert not_measured(both) == "every value in one le bucket: earlier 0-2.0 s, at the earlier mix 2.0-4.0 s"
    # the later window and the counterfactual in one bucket: the later window named
    later = replace(e, le_range_after_s=(0.022, 0.024), le_range_counterfactual_s=(0.022, 0.024))
    assert not_measured(later) == "every TTFT of the later window in the le bucket 22-24 ms"
