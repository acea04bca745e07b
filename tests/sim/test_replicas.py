"""The sim's data parallelism (``--data-parallel-size``): each request goes to the least loaded
replica, and replicas do not queue behind each other."""

from __future__ import annotations

import asyncio

import pytest

from servelens.sim.config import MAX_DATA_PARALLEL, SimConfig
from servelens.sim.prefix_cache import block_hashes
from servelens.sim.presets import get_preset
from servelens.sim.replicas import Replicas
from servelens.sim.scheduler import Engine, SimRequest, simulate
from servelens.sim.steploop import StepLoop, VirtualClock
from servelens.sim.tokenizer import make_text, tokenize

P = get_preset("llama-3.1-8b-h100").params


def _reqs(n: int, osl: int = 8) -> list[SimRequest]:
    out = []
    for i in range(n):
        ids = tokenize(make_text(4000, ("dp", i)))
        out.append(SimRequest(f"r{i}", block_hashes(ids, P.block_size), len(ids), osl, 0))
    return out


async def _run(replicas: Replicas, reqs: list[SimRequest]) -> None:
    left = len(reqs)
    done = asyncio.Event()

    def finished() -> None:
        nonlocal left
        left -= 1
        if left == 0:
            done.set()

    for r in reqs:
        r.on_done = finished
        replicas.submit(r)
    replicas.start()
    await asyncio.wait_for(done.wait(), 5)
    await replicas.stop()


async def test_each_request_goes_to_an_idle_replica_and_does_not_queue() -> None:
    alone = _reqs(1)
    simulate(Engine(P), alone)
    together = _reqs(2)
    simulate(Engine(P), together)  # one engine: the second prefill waits behind the first
    assert together[1].token_times_ns[0] > alone[0].token_times_ns[0]

    reqs = _reqs(3)
    # each replica on its own virtual clock (a shared one would jump to the other's deadlines)
    replicas = Replicas([StepLoop(Engine(P), VirtualClock()) for _ in range(3)])
    picked = []
    for r in reqs:
        picked.append(replicas.pick())
        replicas.submit(r)
        r.on_done = None
    assert len({id(lp) for lp in picked}) == 3  # one each: the least loaded
    for lp in replicas.loops:
        lp.engine.drop_all()

    reqs = _reqs(3)
    replicas = Replicas([StepLoop(Engine(P), VirtualClock()) for _ in range(3)])
    await _run(replicas, reqs)
    for r in reqs:  # every one as fast as a request alone on one engine
        assert r.token_times_ns == alone[0].token_times_ns
    assert replicas.stats.steps == sum(lp.stats.steps for lp in replicas.loops) > 0


async def test_cancel_reaches_the_replica_that_holds_the_request() -> None:
    replicas = Replicas([StepLoop(Engine(P), VirtualClock()) for _ in range(2)])
    reqs = _reqs(2, osl=10_000)
    task = asyncio.ensure_future(_run(replicas, reqs))
    await asyncio.sleep(0)
    for r in reqs:
        replicas.cancel(r)
    await asyncio.wait_for(task, 5)
    assert all(r.cancelled and r.finished for r in reqs)
    assert not any(e.running or e.waiting for e in replicas.engines)


def test_data_parallel_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="data-parallel-size must be >= 1"):
        SimConfig(data_parallel_size=0)
    with pytest.raises(ValueError, match="at least one replica"):
        Replicas([])


def test_a_huge_data_parallel_size_is_refused_not_built() -> None:
    # 10**8 replicas were built one by one: minutes and gigabytes before any error
    with pytest.raises(ValueError, match=f"data-parallel-size must be at most {MAX_DATA_PARALLEL}"):
        SimConfig(data_parallel_size=10**8)
    assert SimConfig(data_parallel_size=MAX_DATA_PARALLEL).data_parallel_size == MAX_DATA_PARALLEL


async def test_a_data_parallel_sim_serves_and_counts_its_replicas_together() -> None:
    import aiohttp

    from servelens.sim.testing import capture, run_sim
    from servelens.sim.tokenizer import make_text

    async with run_sim(data_parallel_size=3, debug=True) as sim:
        assert isinstance(sim.loop, Replicas) and len(sim.loop.engines) == 3
        body = {"model": "sim-model", "prompt": make_text(2000, "dp"), "max_tokens": 4, "ignore_eos": True,
                "stream": True}
        caps = await asyncio.gather(*(capture(sim.url + "/v1/completions", body) for _ in range(3)))
        assert all(c.status == 200 and c.data[-1] == "[DONE]" for c in caps)
        async with aiohttp.ClientSession() as s:
            async with s.get(sim.url + "/debug/stats") as r:
                stats = await r.json()
            async with s.get(sim.url + "/metrics") as r:
                assert r.status == 200 and "vllm:num_requests_running" in await r.text()
        assert stats["replicas"] == 3 and stats["tokens_emitted"] == 12
        assert stats["steps"] == sum(lp.stats.steps for lp in sim.loop.loops)


def test_pooled_lateness_holds_every_replica() -> None:
    # the pooled history has one loop's bound: the last loops' steps used to push the first ones out
    params = get_preset("llama-3.1-8b-h100").params
    replicas = Replicas.build([Engine(params), Engine(params)], VirtualClock(), 1.0)
    bound = replicas.loops[0].stats.late_ns.maxlen or 0
    replicas.loops[0].stats.late_ns.extend([0] * bound)  # on time
    replicas.loops[1].stats.late_ns.extend([5_000_000] * bound)  # 5 ms late
    assert replicas.stats.summary()["within_1ms"] == 0.5
