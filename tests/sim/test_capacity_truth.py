"""Where the capacity is short, on the sim whose truth is known (virtual time, fixed seeds): a run
short of prefill (prefill cost x4) and one short of batch slots (concurrency 32 over max_num_seqs 4)
are told apart per bucket, from the engine's per-request times, from the fit alone, and from
histograms (the gateway's by-ISL TTFT and the engine's vLLM-named queue and prefill histograms);
the fitted prefill throughput is the engine's configured rate."""

from __future__ import annotations

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.capacity import PREFILL, QUEUE, capacity_from_samples
from servelens.formats.engine_log import capacity_samples
from servelens.testing.sim_runs import BASE, run_loaded, slowed

BUCKETS = IslBuckets.default()
EVEN = (1, 1, 1, 1, 1, 1, 1)
PREFILL_X4 = slowed(prefill=4.0)
FEW_SEQS = BASE.with_overrides(max_num_seqs=4)


def test_prefill_bound_and_queue_bound_runs_are_told_apart_per_bucket() -> None:
    pre, pre_t = run_loaded(1, BUCKETS, EVEN, 400, concurrency=2, params=PREFILL_X4)
    que, que_t = run_loaded(1, BUCKETS, EVEN, 400, concurrency=32, params=FEW_SEQS)
    # the truth the sim knows: queue and prefill add up to the engine's TTFT of each request
    for r in pre:
        assert r.request_id is not None
        q, p = pre_t[r.request_id]
        assert q is not None and p is not None and r.ttft_s == pytest.approx(q + p, abs=1e-9)
    with_engine_pre = capacity_from_samples(capacity_samples(pre, pre_t), BUCKETS)
    with_engine_que = capacity_from_samples(capacity_samples(que, que_t), BUCKETS)
    assert [b.limited_by for b in with_engine_pre.buckets] == [PREFILL] * 7
    assert [b.limited_by for b in with_engine_que.buckets] == [QUEUE] * 7
    # without the engine's times, the fit alone: the same answer for every bucket but the
    # shortest of the prefill-bound run (its wait there is the fixed floor, longer than its prefill)
    fit_pre = capacity_from_samples(capacity_samples(pre), BUCKETS)
    fit_que = capacity_from_samples(capacity_samples(que), BUCKETS)
    assert [b.limited_by for b in fit_pre.buckets][1:] == [PREFILL] * 6
    assert [b.limited_by for b in fit_que.buckets] == [QUEUE] * 7
    assert all(b.split == "fit" for b in fit_pre.buckets)


def test_fitted_throughput_is_the_configured_rate() -> None:
    # alone on the engine, no attention cost: TTFT = chunks x overhead + uncached x prefill_s_per_token
    linear = BASE.with_overrides(prefill_attn_s_per_token_pair=0.0)
    recs, _ = run_loaded(2, BUCKETS, EVEN, 200, concurrency=1, params=linear)
    fit = capacity_from_samples(capacity_samples(recs), BUCKETS).fit
    assert fit is not None
    assert fit.throughput_tps == pytest.approx(1 / linear.prefill_s_per_token, rel=0.01)
    assert 0 <= fit.intercept_s <= 2 * linear.step_overhead_s
    # sharing steps with a second request (and paying attention cost) a request sees less than the
    # engine's rate, never more; within 10 % of it at concurrency 2
    recs, _ = run_loaded(1, BUCKETS, EVEN, 400, concurrency=2, params=PREFILL_X4)
    fit = capacity_from_samples(capacity_samples(recs), BUCKETS).fit
    assert fit is not None
    rate = 1 / PREFILL_X4.prefill_s_per_token
    assert 0.9 * rate <= fit.throughput_tps <= rate
    assert fit.throughput_low_tps is not None and fit.throughput_low_tps <= fit.throughput_tps
