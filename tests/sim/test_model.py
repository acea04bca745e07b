import asyncio

import pytest

from servelens.sim.model import ModelParams, decode_s, idle_ttft_s, prefill_chunk_s, step_s
from servelens.sim.prefix_cache import block_hashes
from servelens.sim.presets import PRESETS, get_preset
from servelens.sim.scheduler import Engine, SimRequest, Step, simulate
from servelens.sim.steploop import StepLoop, VirtualClock
from servelens.sim.tokenizer import make_text, tokenize

P = get_preset("llama-3.1-8b-h100").params


def req(rid: str, ids: list[int], osl: int, at: int = 0, params: ModelParams = P) -> SimRequest:
    return SimRequest(rid, block_hashes(ids, params.block_size), len(ids), osl, at)


def ttft(r: SimRequest) -> int:
    return r.token_times_ns[0] - r.arrival_ns


def test_formula_pieces() -> None:
    p = ModelParams(step_overhead_s=0.001, prefill_s_per_token=1e-4, prefill_attn_s_per_token_pair=1e-8,
                    decode_base_s=0.01, decode_s_per_seq=1e-3, decode_s_per_kv_token=1e-6)
    assert prefill_chunk_s(p, 100, 50) == pytest.approx(100 * 1e-4 + 1e-8 * 100 * (50 + 50.5))
    assert decode_s(p, 0, 1000) == 0
    assert decode_s(p, 4, 1000) == pytest.approx(0.01 + 0.004 + 0.001)
    assert step_s(p, [(100, 50)], 4, 1000) == pytest.approx(0.001 + prefill_chunk_s(p, 100, 50) + 0.015)
    with pytest.raises(ValueError):
        ModelParams(max_num_seqs=0)
    with pytest.raises(ValueError):
        P.with_overrides(no_such_param=1)


def test_presets_have_sources_and_sane_idle_ttft() -> None:
    assert len(PRESETS) >= 2
    for preset in PRESETS.values():
        assert preset.derivation and preset.description
        t1k = idle_ttft_s(preset.params, 1000)
        assert 0.02 < t1k < 0.3  # tens of ms for 1k tokens on H100-class hardware
        assert idle_ttft_s(preset.params, 8000) > 7 * t1k  # superlinear in ISL
    with pytest.raises(ValueError, match="known"):
        get_preset("nope")


def test_ttft_grows_with_uncached_isl_at_fixed_load() -> None:
    # Fixed background load: 16 decoding requests; then one probe of each ISL, alone in its run.
    results = []
    for isl in (256, 1024, 4096, 16384):
        engine = Engine(P)
        bg = [req(f"bg{i}", tokenize(make_text(200, ("bg", i))), 400) for i in range(16)]
        probe = req("probe", tokenize(make_text(isl, ("probe", isl))), 8, at=300_000_000)
        simulate(engine, [*bg, probe])
        results.append(ttft(probe))
    assert results == sorted(results) and results[-1] > 10 * results[0]


def test_repeated_prompt_is_cached_and_faster() -> None:
    engine = Engine(P)
    ids = tokenize(make_text(6000, "long"))
    first = req("a", ids, 4)
    second = req("b", ids, 4, at=10**9)
    simulate(engine, [first, second])
    assert first.cached_tokens == 0
    assert second.cached_tokens == (6000 - 1) // 16 * 16
    assert ttft(second) < ttft(first) / 10


def test_queueing_when_max_num_seqs_exceeded() -> None:
    p = P.with_overrides(max_num_seqs=2)
    engine = Engine(p)
    reqs = [req(f"r{i}", tokenize(make_text(100, i)), 50) for i in range(4)]
    simulate(engine, reqs)
    first_done = min(r.token_times_ns[-1] for r in reqs[:2])
    assert all(r.admitted_ns == 0 for r in reqs[:2])
    assert all(r.admitted_ns is not None and r.admitted_ns >= first_done for r in reqs[2:])
    assert ttft(reqs[3]) > 20 * ttft(reqs[0])


def test_kv_capacity_queues_and_rejects() -> None:
    p = P.with_overrides(kv_capacity_tokens=1000)
    engine = Engine(p)
    a = req("a", tokenize(make_text(500, 1)), 300)
    b = req("b", tokenize(make_text(500, 2)), 300)
    simulate(engine, [a, b])
    assert b.admitted_ns is not None and b.admitted_ns >= a.token_times_ns[-1]
    with pytest.raises(ValueError, match="KV cache"):
        Engine(p).submit(req("c", tokenize(make_text(900, 3)), 200))


def test_chunked_prefill_shares_budget_with_decode() -> None:
    p = P.with_overrides(max_num_batched_tokens=512)
    engine = Engine(p)
    dec = req("d", tokenize(make_text(10, 0)), 100)
    big = req("big", tokenize(make_text(2000, 1)), 2, at=20_000_000)
    simulate(engine, [dec, big])
    # the decoding request keeps emitting while the long prompt is prefilled in <= 511-token chunks
    during = [t for t in dec.token_times_ns if big.arrival_ns < t < big.token_times_ns[0]]
    assert len(during) >= 4


def test_prefill_chunk_takes_what_decode_leaves_of_the_budget() -> None:
    p = P.with_overrides(max_num_batched_tokens=512)
    engine = Engine(p)
    decoding = [req(f"d{i}", tokenize(make_text(10, ("d", i))), 100) for i in range(3)]
    for r in decoding:
        engine.submit(r)
    step = engine.plan()
    assert step is not None
    engine.complete(step, 0)  # their prefills are done: they decode from now on
    big = req("big", tokenize(make_text(2000, "big")), 2)
    engine.submit(big)
    step = engine.plan()
    assert step is not None and len(step.decode) == 3
    assert [(r.request_id, c) for r, c in step.prefill] == [("big", 512 - 3)]
    assert step.cost_s == pytest.approx(step_s(p, [(509, 0)], 3, sum(r.isl + 1 for r in decoding)))


async def test_step_loop_runs_the_model_divided_by_speedup() -> None:
    def make() -> list[SimRequest]:
        return [req(f"r{i}", tokenize(make_text(3000 * (i + 1), ("loop", i))), 20) for i in range(3)]

    ref = make()
    simulate(Engine(P), ref)
    speedup = 4.0
    reqs = make()
    loop = StepLoop(Engine(P), VirtualClock(), speedup=speedup)
    done = asyncio.Event()
    left = len(reqs)

    def finished() -> None:
        nonlocal left
        left -= 1
        if left == 0:
            done.set()

    for r in reqs:
        r.on_done = finished
        loop.submit(r)
    loop.start()
    await asyncio.wait_for(done.wait(), 5)
    await loop.stop()
    steps = loop.stats.steps
    assert steps > 20 and loop.stats.summary()["late_max_ms"] == 0
    for a, b in zip(ref, reqs, strict=True):
        assert len(b.token_times_ns) == len(a.token_times_ns) == 20
        # every emission at the model's time / speedup (int ns truncation: < 1 ns per step)
        assert all(abs(tb - ta / speedup) <= steps for ta, tb in zip(a.token_times_ns, b.token_times_ns, strict=True))


def test_cancel_stops_within_one_step() -> None:
    engine = Engine(P)
    r = req("r", tokenize(make_text(10, 0)), 1000)
    engine.submit(r)
    now = 0
    for _ in range(5):
        step = engine.plan()
        assert step is not None
        now += int(step.cost_s * 1e9)
        engine.complete(step, now)
    step = engine.plan()
    assert step is not None
    engine.cancel(r, now)  # arrives while a step is in flight
    engine.complete(step, now + 1)
    assert engine.plan() is None and r.finished and not engine.running
    assert r.generated - (r.tokens_at_cancel or 0) <= 1


async def test_a_failing_step_lets_its_requests_go_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(P)
    real_plan = engine.plan
    calls = 0

    def plan_failing_once() -> Step | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OverflowError("a step cost nothing validated")
        return real_plan()

    engine.plan = plan_failing_once  # type: ignore[method-assign]
    loop = StepLoop(engine, VirtualClock())
    first, second = asyncio.Event(), asyncio.Event()
    a = req("a", tokenize(make_text(10, "a")), 3)
    a.on_done = first.set
    loop.submit(a)
    loop.start()
    try:
        await asyncio.wait_for(first.wait(), 5)  # let go, not hanging
        assert len(a.token_times_ns) < 3
        b = req("b", tokenize(make_text(10, "b")), 3)
        b.on_done = second.set
        loop.submit(b)
        await asyncio.wait_for(second.wait(), 5)  # the loop still serves
        assert len(b.token_times_ns) == 3
    finally:
        await loop.stop()
    assert "sim step failed; letting go of 1 request(s)" in caplog.text
