"""Buckets by uncached prompt tokens (ISL - cached tokens) and the prompt-token counter per ISL bucket."""

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.snapshot import take_snapshot
from servelens.core.state import UNCACHED_SOURCES, FrontendState

MS = 1_000_000
B = IslBuckets.parse("512,1024,2048,4096,8192,16384")


def make(uncached: str | None = "512,1024,2048,4096,8192,16384") -> FrontendState:
    st = FrontendState(B, uncached_buckets=IslBuckets.parse(uncached) if uncached else None)
    st.register_model("m")
    return st


def test_off_by_default_nothing_created() -> None:
    st = make(None)
    ms = st.models["m"]
    assert ms.by_uncached is None and ms.uncached_sources is None
    r = st.begin("m", "chat_completions", "stream", 0)
    assert not r.uncached_enabled
    r.output(10 * MS)
    r.finish(20 * MS, "success", isl=3000, osl=1, cached_tokens=2900)
    assert r.uncached_bucket_label is None
    snap = take_snapshot(st)
    assert snap.uncached_labels == () and snap.models[0].uncached == () and snap.models[0].uncached_sources == ()


def test_every_uncached_bucket_at_zero_on_register() -> None:
    ms = make().models["m"]
    assert ms.by_uncached is not None and list(ms.by_uncached) == list(B.labels)
    assert all(u.ttft.count == u.itl.count == u.duration.count == 0 for u in ms.by_uncached.values())
    assert ms.uncached_sources == dict.fromkeys(UNCACHED_SOURCES, 0)


def test_latched_at_final_usage_ttft_recorded_then() -> None:
    st = make()
    ms = st.models["m"]
    r = st.begin("m", "chat_completions", "stream", 0)
    r.set_isl(20_000, "first_chunk_usage")  # ISL known on the first chunk: the ISL bucket latches at once
    r.output(30 * MS)
    r.output(40 * MS)
    assert ms.by_isl["16385+"].ttft.count == 1  # type: ignore[index]
    assert all(u.ttft.count == 0 for u in ms.by_uncached.values())  # type: ignore[union-attr]
    r.set_cached(19_800, "final_usage")  # the final usage chunk: 200 uncached tokens
    u = ms.by_uncached["0-512"]  # type: ignore[index]
    assert u.ttft.count == 1 and u.ttft.sum == pytest.approx(0.03)  # the TTFT measured at the first token
    assert r.uncached_bucket_label == "0-512"
    r.finish(50 * MS, "success", osl=2, cached_tokens=19_800)
    assert u.ttft.count == 1 and u.duration.count == 1 and u.itl.count == 1
    assert ms.uncached_sources["final_usage"] == 1  # type: ignore[index]
    # the prompt-token counter beside the cached tokens: hit ratio 19,800 / 20,000 in 16385+
    b = ms.by_isl["16385+"]  # type: ignore[index]
    assert b.cached.sum == 19_800 and b.prompt_tokens == 20_000


def test_latched_before_first_token_observes_ttft_at_the_token() -> None:
    st = make()
    r = st.begin("m", "chat_completions", "stream", 0)
    r.set_isl(3000, "first_chunk_usage")
    r.set_cached(0, "first_chunk_usage")  # a miss: 3,000 uncached tokens
    u = st.models["m"].by_uncached["2049-4096"]  # type: ignore[index]
    assert u.ttft.count == 0
    r.output(25 * MS)
    assert u.ttft.count == 1 and u.ttft.sum == pytest.approx(0.025)
    r.finish(30 * MS, "success", osl=1, cached_tokens=0)
    assert u.ttft.count == 1
    assert st.models["m"].uncached_sources["first_chunk_usage"] == 1  # type: ignore[index]


def test_latched_at_finish_from_its_arguments_and_boundary_inclusive() -> None:
    st = make()
    r = st.begin("m", "completions", "unary", 0)
    r.finish(40 * MS, "success", isl=1536, osl=5, cached_tokens=1024)  # 512 uncached: bucket 0-512
    ms = st.models["m"]
    assert ms.by_uncached["0-512"].duration.count == 1  # type: ignore[index]
    assert ms.by_isl["1025-2048"].duration.count == 1  # type: ignore[index]
    assert ms.uncached_sources["final_usage"] == 1  # type: ignore[index]


def test_usage_without_cached_tokens_is_unknown_not_zero() -> None:
    st = make()
    r = st.begin("m", "chat_completions", "stream", 0)
    r.output(10 * MS)
    r.finish(20 * MS, "success", isl=700, osl=1)  # no cached_tokens
    ms = st.models["m"]
    assert all(u.duration.count == 0 for u in ms.by_uncached.values())  # type: ignore[union-attr]
    assert ms.uncached_sources["no_cached_tokens"] == 1  # type: ignore[index]
    assert ms.by_isl["513-1024"].prompt_tokens == 0  # type: ignore[index]  # the hit ratio's denominator too
    assert ms.by_isl["513-1024"].duration.count == 1  # type: ignore[index]


def test_failure_before_first_token_gets_no_uncached_bucket() -> None:
    st = make()
    r = st.begin("m", "chat_completions", "stream", 0)
    r.set_isl(700, "tokenizer")
    r.set_cached(600, "first_chunk_usage")
    r.finish(5 * MS, "error", "backend_error")
    ms = st.models["m"]
    assert all(u.ttft.count == 0 and u.duration.count == 0 for u in ms.by_uncached.values())  # type: ignore[union-attr]
    assert ms.uncached_sources["unknown"] == 1  # type: ignore[index]


def test_cached_above_isl_counts_as_zero_uncached() -> None:
    st = make()
    r = st.begin("m", "chat_completions", "stream", 0)
    r.output(10 * MS)
    r.finish(20 * MS, "success", isl=100, osl=1, cached_tokens=128)  # a block-rounded count past the prompt
    assert st.models["m"].by_uncached["0-512"].duration.count == 1  # type: ignore[index]
