"""FrontendState and LiveRequest on small cases with exact expected counts: counters add up over
several requests, the SLO counters per bucket, the first call wins, the error texts (issue 21)."""

from __future__ import annotations

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.slo import Slo, Threshold
from servelens.core.state import UNCACHED_SOURCES, FrontendState, LiveRequest, slo_kind_on

MS = 1_000_000
B = IslBuckets.parse("512,1024")
KEY = ("chat_completions", "stream", "success", "")


def make(**kw: object) -> FrontendState:
    st = FrontendState(B, **kw)  # type: ignore[arg-type]
    st.register_model("m")
    return st


def stream(st: FrontendState, model: str = "m", gaps_ms: tuple[int, ...] = (), ttft_ms: int | None = 10,
           request_type: str = "stream") -> LiveRequest:
    r = st.begin(model, "chat_completions", request_type, 0)
    if ttft_ms is not None:
        t = ttft_ms * MS
        r.output(t)
        for g in gaps_ms:
            t += g * MS
            r.output(t)
    return r


def test_counters_add_up_over_requests() -> None:
    st = make()
    ms = st.models["m"]
    a, b = stream(st), stream(st)
    assert ms.inflight == 2
    a.finish(20 * MS, "success", isl=100, osl=3)
    b.finish(20 * MS, "success", isl=200, osl=4)
    assert ms.inflight == 0 and ms.requests == {KEY: 2} and ms.output_tokens == 7
    assert ms.isl_sources == {"first_chunk_usage": 0, "final_usage": 2, "tokenizer": 0, "unknown": 0}
    c = stream(st, gaps_ms=(5, 5))  # no osl: its counted output tokens
    c.finish(40 * MS, "success")
    assert ms.output_tokens == 10
    assert ms.stock.isl is not None and ms.stock.isl.count == 2  # a request without ISL observes no ISL
    st.client_disconnected()
    st.client_disconnected()
    assert st.disconnected_clients == 2


def test_unknown_model_requests_add_up_and_never_touch_a_model() -> None:
    st = FrontendState(B, uncached_buckets=B)
    for _ in range(2):
        r = stream(st, model="other")
        r.set_isl(100, "first_chunk_usage")
        r.set_cached(10, "first_chunk_usage")
        assert r.finish(30 * MS, "success").status == "success"
    assert st.unknown_requests == {KEY: 2} and st.models == {}
    assert st.unknown_duration is not None and st.unknown_duration.count == 2
    st.count_unknown_model("completions", "unary")  # the default error_type
    assert st.unknown_requests[("completions", "unary", "error", "not_found")] == 1


def test_the_record_carries_what_finish_was_given() -> None:
    st = make()
    r = stream(st, gaps_ms=(5,))
    rec = r.finish(30 * MS, "error", "backend_error", isl=300, osl=2, cached_tokens=100)
    assert (rec.status, rec.error_type, rec.isl, rec.osl, rec.cached_tokens) == ("error", "backend_error", 300, 2, 100)
    assert rec.itl_values_s == ()  # kept only when asked
    kept = st.begin("m", "chat_completions", "stream", 0, keep_itl_values=True)
    kept.output(10 * MS)
    kept.output(15 * MS)
    assert kept.finish(20 * MS, "success").itl_values_s == pytest.approx((0.005,))


def test_prompt_tokens_add_the_isl_of_requests_with_cached_tokens() -> None:
    st = make()
    for isl, cached in ((100, 20), (0, 0), (300, 50)):
        stream(st).finish(20 * MS, "success", isl=isl, osl=1, cached_tokens=cached)
    b = st.models["m"].by_isl
    assert b is not None and b["0-512"].prompt_tokens == 400 and b["0-512"].cached.sum == 70
    assert b["0-512"].isl is None  # the ISL histogram is the stock one's only


def test_got_output_needs_a_first_token_or_a_unary_success() -> None:
    st = make()
    ms = st.models["m"]
    assert ms.by_isl is not None
    stream(st, ttft_ms=None).finish(20 * MS, "success", isl=100)  # a stream without output
    stream(st, ttft_ms=None, request_type="unary").finish(20 * MS, "error", "backend_error", isl=100)
    assert ms.by_isl["0-512"].duration.count == 0
    assert ms.isl_sources == {"first_chunk_usage": 0, "final_usage": 0, "tokenizer": 0, "unknown": 2}
    stream(st, ttft_ms=None, request_type="unary").finish(20 * MS, "success", isl=100)
    assert ms.by_isl["0-512"].duration.count == 1


def test_first_isl_and_first_cached_win_and_bad_ones_are_ignored() -> None:
    st = make(uncached_buckets=B)
    r = stream(st)
    assert r.isl_source == "unknown"
    r.set_isl(-1, "tokenizer")
    r.set_isl(0, "tokenizer")  # an empty prompt is a length
    r.set_isl(900, "final_usage")
    assert (r.isl, r.bucket_label, r.isl_source) == (0, "0-512", "tokenizer")
    r.set_cached(-1, "first_chunk_usage")
    assert r.cached_tokens is None
    r.set_cached(0, "first_chunk_usage")
    r.set_cached(5, "final_usage")
    assert (r.cached_tokens, r.uncached_bucket_label) == (0, "0-512")
    r.finish(20 * MS, "success")
    r.set_cached(7, "final_usage")  # after finish: a no-op
    late = stream(st)
    late.finish(20 * MS, "success", isl=600)
    late.set_cached(7, "final_usage")
    assert late.cached_tokens is None and late.uncached_bucket_label is None


def test_uncached_sources_add_up() -> None:
    st = make(uncached_buckets=B)
    ms = st.models["m"]
    for _ in range(2):
        stream(st).finish(20 * MS, "success", isl=600, osl=1, cached_tokens=100)  # latched at finish
        stream(st).finish(20 * MS, "success", isl=600, osl=1)  # usage without cached tokens
        stream(st, ttft_ms=None).finish(20 * MS, "error", "backend_error", isl=600)  # no output: unknown
        stream(st).finish(20 * MS, "success", cached_tokens=100)  # cached tokens but no ISL: unknown
    assert ms.uncached_sources == dict(zip(UNCACHED_SOURCES, (0, 2, 2, 4), strict=True))
    assert ms.by_uncached is not None and ms.by_uncached["0-512"].duration.count == 2


def test_slo_counters_per_bucket() -> None:
    # TTFT within 0.001 s per prompt token (0.3 s at ISL 300), mean ITL within 10 ms
    st = make(slo=Slo(ttft=Threshold(per_token_s=0.001), itl=Threshold(base_s=0.01)))
    ms = st.models["m"]
    assert ms.slo_met == {"0-512": [0, 0, 0], "513-1024": [0, 0, 0], "1025+": [0, 0, 0]}
    cases = [
        (100, (5, 5), "success"),  # both
        (600, (5, 5), "success"),  # ITL only
        (100, (50, 150), "success"),  # TTFT only: mean ITL 100 ms
        (100, (), "success"),  # one token: no ITL to miss
        (100, (5, 5), "error"),  # a failure meets none
    ]
    for ttft, gaps, status in cases:
        stream(st, ttft_ms=ttft, gaps_ms=gaps).finish(800 * MS, status, "backend_error" if status == "error" else "",
                                                      isl=300, osl=3)
    assert ms.slo_met == {"0-512": [3, 3, 2], "513-1024": [0, 0, 0], "1025+": [0, 0, 0]}
    stream(st).finish(20 * MS, "success")  # no ISL: no bucket, not judged
    assert ms.slo_met["0-512"] == [3, 3, 2]


def test_slo_settings() -> None:
    ttft_only = Slo(ttft=Threshold(1.0))
    assert make(slo=ttft_only).slo == ttft_only
    assert make(slo=Slo(itl=Threshold(1.0))).models["m"].slo_met is not None
    assert make(slo=Slo()).slo is None  # no threshold: nothing to count
    assert make().models["m"].slo_met is None
    with pytest.raises(ValueError) as err:
        FrontendState(None, slo=ttft_only)
    assert str(err.value) == "SLO counters are per ISL bucket: they need ISL buckets"
    assert [slo_kind_on(ttft_only, k) for k in ("ttft", "itl", "all")] == [True, False, True]
    assert [slo_kind_on(Slo(itl=Threshold(1.0)), k) for k in ("ttft", "itl", "all")] == [False, True, True]
    assert not slo_kind_on(ttft_only, "other")


def test_register_model_errors_and_names() -> None:
    st = FrontendState(B, max_models=1)
    assert st.register_model("m").name == "m" and st.is_registered("m") and not st.is_registered("n")
    with pytest.raises(ValueError) as err:
        st.register_model("")
    assert str(err.value) == "model name must not be empty"
    with pytest.raises(ValueError) as err:
        st.register_model("n")
    assert str(err.value) == "cannot register model 'n': at most 1 models (raise max_models if this is intended)"
    budget = FrontendState(B, max_models=1, limit_reason="a budget of 50 series")
    budget.register_model("m")
    with pytest.raises(ValueError) as err:
        budget.register_model("n")
    assert str(err.value) == ("cannot register model 'n': at most 1 models (a budget of 50 series) "
                              "(raise max_models if this is intended)")
