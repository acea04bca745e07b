"""The snapshot a scrape formats: a copy of the state's values, with unchanged histograms' copies reused."""

from __future__ import annotations

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.snapshot import BY_ISL_HISTOGRAMS, STOCK_HISTOGRAMS, copy_model, take_snapshot
from servelens.core.state import FrontendState, LiveRequest

MS = 1_000_000


def one_request(state: FrontendState, model: str, isl: int, t0: int = 0) -> LiveRequest:
    r = state.begin(model, "chat_completions", "stream", t0)
    r.output(t0 + 10 * MS)
    r.output(t0 + 30 * MS, tokens=2)
    r.finish(t0 + 40 * MS, "success", isl=isl, osl=3, cached_tokens=0)
    return r


def test_snapshot_holds_the_values_and_does_not_move_with_the_state() -> None:
    st = FrontendState(IslBuckets.parse("512,1024"))
    st.register_model("a")
    st.register_model("b")
    one_request(st, "a", isl=700)
    st.begin("ghost", "completions", "unary", 0).finish(MS, "error", "not_found")
    st.client_disconnected()
    snap = take_snapshot(st)
    assert snap.isl_labels == ("0-512", "513-1024", "1025+")
    a, b = snap.models
    assert (a.name, b.name) == ("a", "b")
    assert len(a.histograms) == STOCK_HISTOGRAMS + 3 * BY_ISL_HISTOGRAMS
    ttft, itl = a.stock[0], a.stock[1]
    assert ttft.total == 1 and ttft.sum == pytest.approx(0.010)
    assert itl.total == 2 and itl.sum == pytest.approx(0.020)  # a 20 ms gap over two tokens: 10 ms each
    assert list(ttft.counts) == st.models["a"].stock.ttft.counts
    assert [h.total for h in a.by_isl(0)] == [0, 1, 0]  # TTFT by bucket: the request's is 513-1024
    assert a.requests == ((("chat_completions", "stream", "success", ""), 1),)
    assert a.inflight == 0 and a.output_tokens == 3
    assert dict(a.isl_sources)["final_usage"] == 1
    assert snap.unknown_requests == ((("completions", "unary", "error", "not_found"), 1),)
    assert snap.unknown_duration is not None and snap.unknown_duration.total == 1
    assert snap.disconnected_clients == 1
    assert all(h.total == 0 for h in b.histograms)
    one_request(st, "a", isl=700)
    assert ttft.total == 1 and a.requests[0][1] == 1 and take_snapshot(st).models[0].stock[0].total == 2


def test_unchanged_histograms_keep_their_copy_and_a_request_renews_exactly_its_own() -> None:
    st = FrontendState(IslBuckets.parse("512,1024,2048"))
    for name in ("a", "b"):
        st.register_model(name)
    one_request(st, "a", isl=100)
    first = take_snapshot(st)
    second = take_snapshot(st, first)
    assert all(x is y for m1, m2 in zip(first.models, second.models, strict=True)
               for x, y in zip(m1.histograms, m2.histograms, strict=True))
    one_request(st, "a", isl=1500)  # stock TTFT, ITL, duration, ISL, OSL, cached; five of bucket 1025-2048
    third = take_snapshot(st, second)
    renewed = [(m.name, i) for m2, m in zip(second.models, third.models, strict=True)
               for i, (x, y) in enumerate(zip(m2.histograms, m.histograms, strict=True)) if x is not y]
    bucket = STOCK_HISTOGRAMS + 2 * BY_ISL_HISTOGRAMS
    assert renewed == [("a", i) for i in range(STOCK_HISTOGRAMS)] + [("a", bucket + i) for i in range(5)]
    # a value of 0 changes the counts, not the sum: still a new copy
    with st.lock:
        st.models["b"].stock.cached.observe(0)
    assert take_snapshot(st, third).models[1].stock[5] is not third.models[1].stock[5]


def test_models_copied_one_at_a_time_and_a_previous_of_another_state() -> None:
    st = FrontendState(IslBuckets.parse("512"))
    st.register_model("a")
    st.register_model("b")
    first = take_snapshot(st)
    one_request(st, "b", isl=10)
    models = [copy_model(st, name, prev) for name, prev in zip(st.models, first.models, strict=True)]
    snap = take_snapshot(st, first, models)
    assert snap.models[0].histograms == first.models[0].histograms
    assert snap.models[1].stock[0].total == 1
    with pytest.raises(KeyError):
        copy_model(st, "nobody")
    other = FrontendState(IslBuckets.parse("512,1024"))
    with pytest.raises(ValueError, match="other edges or ISL buckets"):
        take_snapshot(other, first)


def test_buckets_off_copies_only_the_stock_histograms() -> None:
    st = FrontendState(None)
    st.register_model("a")
    one_request(st, "a", isl=100)
    (a,) = take_snapshot(st).models
    assert len(a.histograms) == STOCK_HISTOGRAMS and a.isl_sources == () and a.by_isl(0) == ()
