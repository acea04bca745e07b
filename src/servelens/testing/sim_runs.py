"""Bench runs whose truth is known: the simulated engine's step planner run in virtual time
(:func:`servelens.sim.scheduler.simulate`, no server, no clock), one request at a time, turned into
bench results records (and, fed to a :class:`~servelens.prometheus.frontend.FrontendMetrics`, into
``/metrics`` scrapes).

One request at a time (each starts 1 ms after the previous one ends) means no request waits for
another: a request's TTFT and ITL are the engine model's for its own prompt, so between two runs
on the same engine each bucket's latency distribution is the same, whatever the bucket mix, as
long as the prompt lengths inside a bucket are drawn alike (uniform over the bucket here). A run
on an engine with other parameters (prefill cost doubled, attention slower) changes the latency
of exactly the buckets the model says. The results are deterministic for a seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servelens.core.buckets import IslBuckets
from servelens.core.timing import NS_PER_S
from servelens.formats.results import BenchRecord
from servelens.prometheus.frontend import FrontendMetrics
from servelens.prometheus.sim_engine import SimMetrics
from servelens.sim.model import ModelParams
from servelens.sim.presets import DEFAULT_PRESET, get_preset
from servelens.sim.scheduler import Engine, SimRequest, simulate

BASE = get_preset(DEFAULT_PRESET).params.with_overrides(prefix_cache_blocks=0)
"""The default preset without a prefix cache (every prompt is prefilled in full)."""
GAP_NS = 1_000_000
WALL_START_NS = 1_767_225_600 * NS_PER_S  # 2026-01-01 UTC: wall-clock send times for "over time" charts


def slowed(prefill: float = 1.0, attention: float = 1.0, params: ModelParams = BASE) -> ModelParams:
    """``params`` with the linear prefill cost times ``prefill`` and the attention cost (which grows
    with the prompt, so it slows long prompts most) times ``attention``."""
    return params.with_overrides(prefill_s_per_token=params.prefill_s_per_token * prefill,
                                 prefill_attn_s_per_token_pair=params.prefill_attn_s_per_token_pair * attention)


def bucket_isls(rng: np.random.Generator, buckets: IslBuckets, mix: Sequence[float], n: int) -> np.ndarray:
    """``n`` prompt lengths: a bucket drawn from ``mix`` (relative weights), then a length uniform
    over it (the open top bucket: up to twice its lower bound)."""
    p = np.asarray(mix, dtype=float) / float(np.sum(mix))
    ks = rng.choice(len(buckets), size=n, p=p)
    lows = np.array([1, *(b + 1 for b in buckets.boundaries)])
    highs = np.array([*buckets.boundaries, 2 * buckets.boundaries[-1]])
    return rng.integers(lows[ks], highs[ks] + 1)


def run_phase(
    seed: int, buckets: IslBuckets, mix: Sequence[float], n: int, params: ModelParams = BASE, osl: int = 16,
    start_ns: int = 0,
) -> list[BenchRecord]:
    """``n`` requests one after another on an engine with ``params``, prompt lengths from ``mix``
    (see :func:`bucket_isls`), ``osl`` output tokens each; starting at ``start_ns`` (virtual)."""
    rng = np.random.default_rng(seed)
    isls = bucket_isls(rng, buckets, mix, n)
    engine = Engine(params)
    now = start_ns
    out = []
    for i, isl in enumerate(int(x) for x in isls):
        req = SimRequest(f"r{seed}-{i}", (), isl, osl, now)
        end = simulate(engine, [req], now)
        times = req.token_times_ns
        out.append(BenchRecord(
            index=i, request_id=req.request_id, scheduled_ns=now - start_ns, send_ns=now,
            wall_send_ns=WALL_START_NS + now, first_output_ns=times[0], end_ns=end,
            chunk_offsets_ns=tuple(t - now for t in times), chunk_tokens=(1,) * len(times),
            tokens_from_usage=True, isl_target=isl, isl_server=isl, osl_target=osl, osl=len(times),
            cached_tokens=req.cached_tokens, status="success",
        ))
        now = end + GAP_NS
    return out


def feed_records(metrics: FrontendMetrics, records: Sequence[BenchRecord], model: str = "test-model") -> None:
    """Record each bench record on ``metrics`` as the gateway would have seen it (arrival at the
    send time, one output chunk per recorded chunk), with the records' own integer timestamps."""
    for r in records:
        req = metrics.begin(model, "chat_completions", "stream", arrival_ns=r.send_ns)
        for off, tokens in zip(r.chunk_offsets_ns, r.chunk_tokens, strict=True):
            req.output(r.send_ns + off, tokens)
        req.finish(r.end_ns, "success" if r.ok else "error", "" if r.ok else "internal",
                   isl=r.isl, osl=r.osl, cached_tokens=r.cached_tokens)


def run_loaded(
    seed: int, buckets: IslBuckets, mix: Sequence[float], n: int, concurrency: int, params: ModelParams = BASE,
    osl: int = 16, start_ns: int = 0,
) -> tuple[list[BenchRecord], dict[str, tuple[float | None, float | None]]]:
    """``n`` requests in a closed loop of ``concurrency`` on one engine with ``params`` (virtual time):
    a new request is sent the moment one finishes, so with more requests than ``max_num_seqs`` (or
    than the step's token budget admits) they queue. Prompt lengths as :func:`run_phase`.

    Returns the bench records and the engine's times per request id, ``(queue_s, prefill_s)``
    (vLLM's definitions: arrival to admission, admission to the first token), as the sim's truth
    log gives them (:func:`servelens.formats.engine_log.load_engine_times`).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    rng = np.random.default_rng(seed)
    isls = [int(x) for x in bucket_isls(rng, buckets, mix, n)]
    engine = Engine(params)
    now = start_ns
    done: list[SimRequest] = []
    order: dict[str, int] = {}

    def send(i: int) -> None:
        req = SimRequest(f"q{seed}-{i}", (), isls[i], osl, now)
        req.on_done = lambda: done.append(req)
        order[req.request_id] = i
        engine.submit(req)

    sent = 0
    while sent < min(concurrency, n):
        send(sent)
        sent += 1
    out: list[BenchRecord] = []
    times: dict[str, tuple[float | None, float | None]] = {}
    while engine.has_work():
        step = engine.plan()
        if step is None:  # nothing fits (cannot happen with requests that fit the KV cache alone)
            raise RuntimeError("engine stalled with work queued")
        engine.admit_times(step, now)
        now += int(step.cost_s * 1e9)
        engine.complete(step, now)
        while done:
            req = done.pop()
            t = req.token_times_ns
            i = order[req.request_id]
            out.append(BenchRecord(
                index=i, request_id=req.request_id, scheduled_ns=req.arrival_ns - start_ns,
                send_ns=req.arrival_ns, wall_send_ns=WALL_START_NS + req.arrival_ns, first_output_ns=t[0],
                end_ns=now, chunk_offsets_ns=tuple(x - req.arrival_ns for x in t), chunk_tokens=(1,) * len(t),
                tokens_from_usage=True, isl_target=req.isl, isl_server=req.isl, osl_target=osl, osl=len(t),
                cached_tokens=req.cached_tokens, status="success",
            ))
            assert req.admitted_ns is not None
            times[req.request_id] = ((req.admitted_ns - req.arrival_ns) / NS_PER_S,
                                     (t[0] - req.admitted_ns) / NS_PER_S)
            if sent < n:
                send(sent)
                sent += 1
    out.sort(key=lambda r: r.index)
    return out, times


def engine_exposition(records: Sequence[BenchRecord], times: dict[str, tuple[float | None, float | None]],
                      model: str = "test-model") -> bytes:
    """The sim engine's own ``/metrics`` (vLLM's names) after ``records``, with their queue and
    prefill ``times`` (:func:`run_loaded`) in ``vllm:request_queue_time_seconds`` and
    ``vllm:request_prefill_time_seconds``."""
    m = SimMetrics(model, 131072)
    for r in records:
        q, _ = times.get(r.request_id or "", (None, None))
        admitted = None if q is None else r.send_ns + round(q * NS_PER_S)
        m.observe_request(r.send_ns, tuple(r.send_ns + off for off in r.chunk_offsets_ns), r.end_ns, r.isl,
                          r.cached_tokens or 0, "length", admitted)
    return m.exposition(0, 0, 0.0, 0, 0)
