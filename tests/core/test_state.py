from typing import Any

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.edges import MetricEdges
from servelens.core.state import FrontendState

MS = 1_000_000


def make(buckets: str | None = "512,1024,2048,4096,8192,16384", **kw: Any) -> FrontendState:
    st = FrontendState(IslBuckets.parse(buckets) if buckets else None, **kw)
    st.register_model("m")
    return st


def test_every_bucket_exists_at_zero_on_register() -> None:
    st = make()
    by = st.models["m"].by_isl
    assert by is not None and list(by) == list(IslBuckets.default().labels)
    assert all(h.ttft.count == 0 and h.itl.count == 0 for h in by.values())


def test_bucket_fixed_at_first_chunk_usage_observes_ttft_then() -> None:
    st = make()
    r = st.begin("m", "chat_completions", "stream", 0)
    r.set_isl(600, "first_chunk_usage")
    r.output(40 * MS)
    b = st.models["m"].by_isl["513-1024"]  # type: ignore[index]
    assert b.ttft.count == 1 and b.ttft.sum == pytest.approx(0.04)  # observed at the first token
    r.output(50 * MS)
    r.output(60 * MS)
    assert b.itl.count == 0  # ITL is request-local until the end
    r.finish(70 * MS, "success", osl=3, cached_tokens=512)
    assert b.itl.count == 2 and b.itl.sum == pytest.approx(0.02)
    assert b.duration.count == 1 and b.osl.sum == 3 and b.cached.sum == 512
    assert st.models["m"].isl_sources == {"first_chunk_usage": 1, "final_usage": 0, "tokenizer": 0, "unknown": 0}


def test_isl_from_final_usage_observes_stored_ttft_into_bucket() -> None:
    st = make()
    r = st.begin("m", "chat_completions", "stream", 0)
    r.output(30 * MS)
    ms = st.models["m"]
    assert ms.stock.ttft.count == 1  # stock TTFT at the first token
    assert all(h.ttft.count == 0 for h in ms.by_isl.values())  # type: ignore[union-attr]
    r.output(35 * MS)
    r.finish(40 * MS, "success", isl=20000, osl=2)
    b = ms.by_isl["16385+"]  # type: ignore[index]
    assert b.ttft.count == 1 and b.ttft.sum == pytest.approx(0.03)
    assert ms.stock.isl is not None and ms.stock.isl.sum == 20000
    assert ms.isl_sources["final_usage"] == 1  # type: ignore[index]


def test_failure_before_first_token_gets_no_bucket_but_is_counted() -> None:
    st = make()
    r = st.begin("m", "completions", "stream", 0)
    r.set_isl(100, "tokenizer")  # even with the ISL known at arrival
    assert st.models["m"].inflight == 1
    r.finish(5 * MS, "error", "backend_error")
    ms = st.models["m"]
    assert ms.inflight == 0
    assert ms.requests == {("completions", "stream", "error", "backend_error"): 1}
    assert ms.stock.duration.count == 1
    assert ms.stock.ttft.count == 0 and ms.stock.itl.count == 0
    assert all(h.duration.count == 0 and h.ttft.count == 0 for h in ms.by_isl.values())  # type: ignore[union-attr]
    assert ms.isl_sources["unknown"] == 1  # type: ignore[index]


def test_finish_is_idempotent_and_counts_once() -> None:
    st = make()
    r = st.begin("m", "chat_completions", "stream", 0)
    r.output(1 * MS)
    first = r.finish(2 * MS, "success", isl=5, osl=1)
    again = r.finish(9 * MS, "error", "cancelled")
    assert again is first
    assert sum(st.models["m"].requests.values()) == 1
    assert st.models["m"].inflight == 0


def test_unknown_model_counts_requests_total_and_duration_only() -> None:
    st = make()
    r = st.begin("nope", "chat_completions", "unary", 0)
    assert r.model == "unknown_model"
    r.finish(3 * MS, "error", "not_found")
    st.count_unknown_model("completions", "stream", "validation", duration_s=0.5)
    st.count_unknown_model("completions", "stream", "validation")  # no duration known
    assert st.unknown_requests == {("chat_completions", "unary", "error", "not_found"): 1,
                                   ("completions", "stream", "error", "validation"): 2}
    assert st.unknown_duration is not None and st.unknown_duration.count == 2  # as Dynamo records them
    assert st.unknown_duration.sum == pytest.approx(0.503)
    assert "nope" not in st.models
    assert st.models["m"].inflight == 0


def test_unary_success_lands_in_its_bucket_without_ttft() -> None:
    st = make()
    r = st.begin("m", "chat_completions", "unary", 0)
    r.finish(50 * MS, "success", isl=700, osl=10, cached_tokens=0)
    b = st.models["m"].by_isl["513-1024"]  # type: ignore[index]
    assert b.ttft.count == 0 and b.duration.count == 1 and b.cached.count == 1


def test_bucketing_off_registers_nothing_by_isl() -> None:
    st = make(None)
    ms = st.models["m"]
    assert ms.by_isl is None and ms.isl_sources is None
    r = st.begin("m", "chat_completions", "stream", 0)
    r.set_isl(100, "final_usage")
    r.output(1 * MS)
    r.finish(2 * MS, "success", osl=1)
    assert r.bucket_label is None


def test_max_models_guard() -> None:
    st = FrontendState(None, max_models=2)
    st.register_model("a")
    st.register_model("b")
    st.register_model("a")  # idempotent
    with pytest.raises(ValueError, match="at most 2 models"):
        st.register_model("c")
    assert list(st.models) == ["a", "b"]  # no state (hence no series) for the rejected model
    with pytest.raises(ValueError, match="reserved"):
        FrontendState().register_model("unknown_model")


def test_bad_status_and_error_type_rejected() -> None:
    st = make()
    with pytest.raises(ValueError, match="status"):
        st.begin("m", "completions", "stream", 0).finish(1, "ok")
    with pytest.raises(ValueError, match="unknown error_type"):
        st.begin("m", "completions", "stream", 0).finish(1, "error", "boom")


def test_custom_edges_validated() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        MetricEdges(ttft_s=(1.0, 0.5))


def test_hot_path_append_equals_output_calls() -> None:
    st = make()
    a = st.begin("m", "chat_completions", "stream", 0)
    b = st.begin("m", "chat_completions", "stream", 0)
    a.output(10 * MS)
    b.output(10 * MS)
    append = b.chunk_times_ns.append
    for i in range(2, 60):
        a.output(i * 10 * MS)
        append(i * 10 * MS)
    ra = a.finish(700 * MS, "success", isl=1, osl=59)
    rb = b.finish(700 * MS, "success", isl=1, osl=59)
    assert ra.itl.counts == rb.itl.counts and ra.itl.sum == pytest.approx(rb.itl.sum)
    assert ra.itl.count == 58


def test_isl_known_mid_stream_observes_ttft_into_bucket_at_that_moment() -> None:
    st = make()
    r = st.begin("m", "chat_completions", "stream", 0)
    r.output(25 * MS)
    r.output(30 * MS)
    b = st.models["m"].by_isl["1025-2048"]  # type: ignore[index]
    assert b.ttft.count == 0
    r.set_isl(1500, "final_usage")  # bucket fixed now: TTFT goes in at once, not at the end
    assert b.ttft.count == 1 and b.ttft.sum == pytest.approx(0.025)
    assert b.itl.count == 0 and b.duration.count == 0 and b.osl.count == 0
    r.set_isl(10, "final_usage")  # the first ISL wins
    r.finish(40 * MS, "success", osl=2, cached_tokens=0)
    assert b.ttft.count == 1 and b.itl.count == 1 and b.duration.count == 1 and b.osl.sum == 2
    assert st.models["m"].by_isl["0-512"].duration.count == 0  # type: ignore[index]


def test_failure_after_first_token_keeps_its_bucket() -> None:
    st = make()
    r = st.begin("m", "chat_completions", "stream", 0)
    r.set_isl(3000, "tokenizer")
    r.output(10 * MS)
    r.output(20 * MS)
    r.finish(30 * MS, "error", "backend_error")
    ms = st.models["m"]
    b = ms.by_isl["2049-4096"]  # type: ignore[index]
    assert b.ttft.count == 1 and b.itl.count == 1 and b.duration.count == 1
    assert ms.requests == {("chat_completions", "stream", "error", "backend_error"): 1}


@pytest.mark.parametrize(("endpoint", "request_type", "msg"), [
    ("chat", "stream", "unknown endpoint 'chat'"),
    ("completions", "streaming", "unknown request_type 'streaming'"),
])
def test_endpoint_and_request_type_vocabulary(endpoint: str, request_type: str, msg: str) -> None:
    st = make()
    with pytest.raises(ValueError, match=msg):
        st.begin("m", endpoint, request_type, 0)
    with pytest.raises(ValueError, match=msg):
        st.count_unknown_model(endpoint, request_type)
    assert st.models["m"].inflight == 0 and not st.unknown_requests
