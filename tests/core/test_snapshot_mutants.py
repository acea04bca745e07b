"""core/snapshot with every optional series on (ISL buckets, SLO counters, uncached buckets, an unknown
model): each field of the copy against the requests that made it, the families' slices, which copies
are reused, and the refusals (issue 21)."""

from __future__ import annotations

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.histogram import HistogramState
from servelens.core.slo import Slo, parse_threshold
from servelens.core.snapshot import HistogramCopy, copy_histogram, copy_model, take_snapshot
from servelens.core.state import FrontendState

MS = 1_000_000
B = IslBuckets.parse("512,1024")  # 0-512, 513-1024, 1025+


def state(ttft_s: str | None = "0.05", itl_s: str | None = "0.015", uncached: str | None = "256") -> FrontendState:
    slo = Slo(parse_threshold(ttft_s, B) if ttft_s else None, parse_threshold(itl_s, B) if itl_s else None)
    st = FrontendState(B, slo=slo, uncached_buckets=IslBuckets.parse(uncached) if uncached else None)
    st.register_model("a")
    return st


def request(st: FrontendState, isl: int, ttft_ms: int) -> None:
    """First token at ``ttft_ms``, two more 20 ms later (ITL 10 ms each), end 10 ms after; nothing cached."""
    r = st.begin("a", "chat_completions", "stream", 0)
    r.output(ttft_ms * MS)
    r.output((ttft_ms + 20) * MS, tokens=2)
    r.finish((ttft_ms + 30) * MS, "success", isl=isl, osl=3, cached_tokens=0)


def test_every_series_of_a_model_with_everything_on() -> None:
    st = state()
    request(st, 700, 10)  # 513-1024, uncached 257+: TTFT 10 ms meets 50 ms, ITL 10 ms meets 15 ms
    request(st, 100, 100)  # 0-512, uncached 0-256: TTFT 100 ms misses, ITL meets
    snap = take_snapshot(st)
    assert snap.slo_kinds == ("ttft", "itl", "all")
    assert snap.uncached_labels == ("0-256", "257+")
    (a,) = snap.models
    assert a.slo_met == (("0-512", 0, 1, 0), ("513-1024", 1, 1, 1), ("1025+", 0, 0, 0))
    assert a.prompt_tokens_by_isl == (100, 700, 0)
    assert a.uncached_sources == (("first_chunk_usage", 0), ("final_usage", 2), ("no_cached_tokens", 0),
                                  ("unknown", 0))
    # stock TTFT, ITL (4 tokens), duration, ISL, OSL, cached; then 5 per ISL bucket; the uncached apart
    assert [h.total for h in a.stock] == [2, 4, 2, 2, 2, 2]
    assert len(a.histograms) == 6 + 3 * 5
    assert [(h.total, h.sum) for h in a.by_isl(0)] == [(1, pytest.approx(0.1)), (1, pytest.approx(0.01)), (0, 0.0)]
    assert [h.total for h in a.by_isl(1)] == [2, 2, 0]
    assert [(h.total, h.sum) for h in a.by_isl(2)] == [(1, pytest.approx(0.13)), (1, pytest.approx(0.04)),
                                                       (0, 0.0)]
    assert [h.total for h in a.by_isl(3)] == [1, 1, 0] and [h.sum for h in a.by_isl(3)] == [3, 3, 0]
    assert [h.total for h in a.by_isl(4)] == [1, 1, 0]
    assert len(a.uncached) == 2 * 3
    assert [(h.total, h.sum) for h in a.by_uncached(0)] == [(1, pytest.approx(0.1)), (1, pytest.approx(0.01))]
    assert [h.total for h in a.by_uncached(1)] == [2, 2]
    assert [h.total for h in a.by_uncached(2)] == [1, 1]


@pytest.mark.parametrize(("ttft_s", "itl_s", "kinds"), [
    ("0.05", None, ("ttft", "all")), (None, "0.05", ("itl", "all")), (None, None, ())])
def test_slo_kinds_are_the_slos_set_and_all(ttft_s: str | None, itl_s: str | None, kinds: tuple[str, ...]) -> None:
    assert take_snapshot(state(ttft_s, itl_s)).slo_kinds == kinds


@pytest.mark.parametrize(("ttft_s", "itl_s", "thresholds"), [
    ("0.05", "0.015", (("ttft", "0.05"), ("itl", "0.015"))),
    ("0-512=0.5,513-1024=0.8,1025+=2", None, (("ttft", "0-512=0.5,513-1024=0.8,1025+=2.0"),)),
    (None, "0.01+2e-05*isl", (("itl", "0.01+2e-05*isl"),)),
    (None, None, ()),
])
def test_slo_thresholds_are_each_slo_set_with_its_spec(
    ttft_s: str | None, itl_s: str | None, thresholds: tuple[tuple[str, str], ...]
) -> None:
    assert take_snapshot(state(ttft_s, itl_s)).slo_thresholds == thresholds


def test_copy_histogram_reuses_only_an_equal_total_and_sum() -> None:
    h = HistogramState((1.0, 2.0))
    h.observe(0.5)
    h.observe(1.5, 2)
    fresh = copy_histogram(h)
    assert fresh == HistogramCopy((1, 2, 0), 3.5, 3)
    same = HistogramCopy((1, 2, 0), 3.5, 3)
    assert copy_histogram(h, same) is same
    assert copy_histogram(h, HistogramCopy((1, 2, 0), 3.25, 3)) == fresh  # another sum: a new copy
    assert copy_histogram(h, HistogramCopy((1, 1, 0), 3.5, 2)) == fresh  # another total: a new copy


def test_unknown_model_durations_keep_their_copy_until_they_change() -> None:
    st = state()
    st.count_unknown_model("completions", "unary", "not_found", duration_s=0.125)
    first = take_snapshot(st)
    assert first.unknown_duration is not None and first.unknown_duration.total == 1
    assert take_snapshot(st, first).unknown_duration is first.unknown_duration
    st.count_unknown_model("completions", "unary", "not_found", duration_s=0.25)
    third = take_snapshot(st, first)
    assert third.unknown_duration is not None and third.unknown_duration.total == 2


def test_a_previous_copy_of_another_layout_is_refused() -> None:
    st = state()
    other = state(uncached=None)  # the same ISL buckets, no uncached ones: 6 histograms fewer
    with pytest.raises(ValueError):
        copy_model(st, "a", take_snapshot(other).models[0])
    with pytest.raises(ValueError) as e:
        take_snapshot(st, take_snapshot(other))
    assert str(e.value) == "the previous snapshot is of a state with other edges or ISL buckets"
