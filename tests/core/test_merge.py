"""The sum of several states' snapshots is the snapshot of one state that took all their requests."""

from __future__ import annotations

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.merge import merge_snapshots, without_inflight
from servelens.core.slo import Slo, parse_threshold
from servelens.core.snapshot import take_snapshot
from servelens.prometheus import FrontendMetrics

MS = 1_000_000  # ns
BUCKETS = "512,1024,2048"


def _metrics() -> FrontendMetrics:
    buckets = IslBuckets.parse(BUCKETS)
    return FrontendMetrics(isl_buckets=BUCKETS, uncached_buckets="256,1024",
                           slo=Slo(parse_threshold("0.5", buckets), parse_threshold("0.25", buckets)))


def _requests(metrics: list[FrontendMetrics], n: int) -> None:
    """``n`` requests spread over ``metrics`` round robin: several models, outcomes, buckets, SLO
    results, uncached buckets, disconnects and an unknown model."""
    for i in range(n):
        m = metrics[i % len(metrics)]
        model = ("a", "b")[i % 3 == 0]
        if i % 7 == 6:
            m.state.count_unknown_model("chat_completions", "stream", "not_found", duration_s=0.125)
            continue
        req = m.begin(model, ("chat_completions", "completions")[i % 2], ("stream", "unary")[i % 5 == 0], 0)
        t = (100 + 50 * (i % 9)) * MS
        for k in range(i % 6):
            req.output(t + 16 * k * MS, tokens=1 + k % 2)
        req.set_isl(200 + 400 * (i % 6), "final_usage")
        status = "success" if i % 4 else "error"
        req.finish(t + 256 * MS, status, "" if status == "success" else "backend_error",
                   osl=max(1, i % 6), cached_tokens=(i % 3) * 64)
        if i % 11 == 10:
            m.state.client_disconnected()


@pytest.mark.parametrize("parts", [2, 3])
def test_merged_snapshot_is_one_state_that_took_every_request(parts: int) -> None:
    whole = _metrics()
    for name in ("a", "b"):
        whole.register_model(name)
    split = [_metrics() for _ in range(parts)]
    for m in split:
        for name in ("a", "b"):
            m.register_model(name)
    _requests([whole], 60)
    _requests(split, 60)
    merged = merge_snapshots([take_snapshot(m.state) for m in split])
    got = whole.text.render(merged).decode().splitlines()
    want = whole.exposition().decode().splitlines()
    assert len(got) == len(want) > 1000
    for g, w in zip(got, want, strict=True):  # counts exact; a float _sum up to the order of its additions
        if "_sum{" in w:
            assert g.rsplit(" ", 1)[0] == w.rsplit(" ", 1)[0]
            assert float(g.rsplit(" ", 1)[1]) == pytest.approx(float(w.rsplit(" ", 1)[1]), rel=1e-12)
        else:
            assert g == w


def test_models_are_the_union_in_order_of_first_appearance_and_inflight_of_the_ended_is_dropped() -> None:
    one, two = _metrics(), _metrics()
    one.register_model("a")
    two.register_model("b")
    two.register_model("a")
    live = two.begin("a", "chat_completions", "stream", 0)
    merged = merge_snapshots([take_snapshot(one.state), take_snapshot(two.state)])
    assert [m.name for m in merged.models] == ["a", "b"]
    assert [m.inflight for m in merged.models] == [1, 0]
    ended = merge_snapshots([take_snapshot(one.state), without_inflight(take_snapshot(two.state))])
    assert [m.inflight for m in ended.models] == [0, 0]
    live.finish(MS, "success")


def test_states_of_other_buckets_do_not_merge() -> None:
    with pytest.raises(ValueError, match="other edges, buckets"):
        merge_snapshots([take_snapshot(_metrics().state), take_snapshot(FrontendMetrics(isl_buckets="512").state)])
    with pytest.raises(ValueError, match="nothing"):
        merge_snapshots([])
