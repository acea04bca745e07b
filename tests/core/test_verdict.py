"""The one-line verdict, on synthetic windows that tell the issue's story."""

import re

import pytest

from servelens.core.decompose import explain
from servelens.core.units import format_times
from servelens.core.verdict import format_s, label_range, verdict_line
from servelens.testing.latency_windows import BUCKETS, EARLY_MIX, binned, sample_window

# the write-up's story: traffic moves to 8193+ prompts while 4097-8192 (same share) gets 4x slower
STORY_BEFORE = (35, 25, 15, 15, 5, 3, 2)
STORY_AFTER = (10, 5, 5, 5, 5, 35, 35)
FIG = r"[0-9.]+ m?s"


@pytest.mark.parametrize("binned_windows", [False, True])
def test_the_story_reads_mostly_mix_with_one_bucket_also_slower(binned_windows: bool) -> None:
    a = sample_window(1, STORY_BEFORE, 2000)
    b = sample_window(2, STORY_AFTER, 2000, {4: 4.0})
    e = explain(binned(a), binned(b)) if binned_windows else explain(a, b)
    assert e.verdict == "mix"
    line = verdict_line(e)
    assert re.fullmatch(
        rf"TTFT p95 rose {FIG} -> {FIG}; at the earlier mix it would be {FIG}: mostly a traffic shift toward "
        rf"8193\+ prompts \(mean: mix \+{FIG}, latency \+{FIG}\); 4097-8192 also slowed, {FIG} -> {FIG}",
        line,
    ), line
    p95 = e.quantile(0.95)
    assert f"rose {format_s(p95.before_s)} -> {format_s(p95.after_s)}" in line
    slowed = e.buckets[4]
    assert line.endswith(f"{format_s(slowed.quantiles_before_s[1])} -> {format_s(slowed.quantiles_after_s[1])}")
    assert "\n" not in line


def test_latency_verdict_names_the_buckets() -> None:
    a = sample_window(3, EARLY_MIX, 2000)
    e = explain(a, sample_window(4, EARLY_MIX, 2000, {4: 0.5, 5: 0.5}))
    line = verdict_line(e, q=0.5)
    assert line.startswith("TTFT p50 fell ")
    assert re.search(rf": faster within buckets, not a traffic shift \(mean: mix -{FIG}, latency -{FIG}\); "
                     "8193-16384 got faster, ", line), line
    assert "; 4097-8192 got faster, " in line
    assert "1 more bucket changed" in verdict_line(e, top=1)


def test_both_and_none_verdicts() -> None:
    a = sample_window(5, STORY_BEFORE, 2000)
    both = explain(a, sample_window(6, STORY_AFTER, 2000, {4: 3.0, 5: 3.0}))
    assert both.verdict == "both"
    line = verdict_line(both, q=0.99)
    assert line.startswith("TTFT p99 rose ")
    assert re.search(rf": a traffic shift toward 8193\+ prompts and slower buckets \(mean: mix \+{FIG}, "
                     rf"latency \+{FIG}\); 8193-16384 slowed, ", line), line
    none = explain(a, sample_window(7, STORY_BEFORE, 2000))
    assert none.verdict == "none"
    assert re.search(rf": no significant change of the mean \({FIG} -> {FIG}: mix [+-]{FIG}, latency [+-]{FIG}\)$",
                     verdict_line(none))
    with pytest.raises(KeyError):
        verdict_line(none, q=0.9)


def test_shift_toward_short_prompts() -> None:
    a = sample_window(8, EARLY_MIX, 2000)
    e = explain(a, sample_window(9, (60, 30, 5, 3, 1, 0.5, 0.5), 2000))
    assert e.verdict == "mix" and e.mix_effect_s < 0
    assert "fell" in verdict_line(e) and "a traffic shift toward 0-1024 prompts" in verdict_line(e)


def test_format_s() -> None:
    assert [format_s(x) for x in (9.84, 2.0, 0.9, 0.314, 0.0456, 0.00312, 0.09996, None)] == [
        "9.8 s", "2.0 s", "900 ms", "314 ms", "46 ms", "3.1 ms", "100 ms", "-"]


def test_label_range_merges_adjacent_buckets() -> None:
    order = BUCKETS.labels
    assert label_range(["16385+", "8193-16384"], order) == "8193+"
    assert label_range(["0-512", "513-1024"], order) == "0-1024"
    assert label_range(["0-512", "2049-4096", "4097-8192", "16385+"], order) == "0-512, 2049-8192 and 16385+"
    assert label_range(["1025-2048"], order) == "1025-2048"


def test_every_verdict_shows_the_mean_it_is_judged_on() -> None:
    """A quantile can move another way than the mean: "ITL p95 rose 3.3 ms -> 3.4 ms; at the earlier mix it
    would be 2.8 ms: slower within buckets, not a traffic shift" read as a contradiction, because the
    latency verdict (unlike both's) left out the mean's split it is judged on."""
    a = sample_window(3, EARLY_MIX, 2000)
    e = explain(a, sample_window(4, EARLY_MIX, 2000, {4: 0.5, 5: 0.5}))
    assert e.verdict == "latency"
    mix, lat = format_times(e.mix_effect_s, e.latency_effect_s, signed=True)
    assert f"faster within buckets, not a traffic shift (mean: mix {mix}, latency {lat}); " in verdict_line(e)
    shift = explain(sample_window(1, STORY_BEFORE, 2000), sample_window(2, STORY_AFTER, 2000))
    assert shift.verdict == "mix"
    mix, lat = format_times(shift.mix_effect_s, shift.latency_effect_s, signed=True)
    assert f"a traffic shift toward 8193+ prompts (mean: mix {mix}, latency {lat})" in verdict_line(shift)
