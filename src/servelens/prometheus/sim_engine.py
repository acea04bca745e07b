"""Engine-side metrics of the simulated engine (``servelens sim``), named like vLLM's (label ``model_name``).

Names and bucket edges follow vLLM v1 (``vllm/v1/metrics/loggers.py``, v0.10): histograms
``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:e2e_request_latency_seconds``, ``vllm:request_queue_time_seconds`` (arrival to admission),
``vllm:request_prefill_time_seconds`` (admission to the first token), ``vllm:request_prompt_tokens``,
``vllm:request_generation_tokens``; gauges ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``; counters ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``, ``vllm:prompt_tokens_cached_total``,
``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total``,
``vllm:request_success_total`` (label ``finished_reason``).

Times are wall seconds measured by the sim (its arrival to its first token / each token / the end),
i.e. what the engine itself would report; with ``--speedup X`` they are the scaled times.
Observations happen once per finished request (never per token on the hot path).

Lives in ``servelens.prometheus`` (the only package importing ``prometheus_client``); used by
``servelens.sim.state`` with one registry per sim app.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                 240.0, 480.0, 960.0, 1920.0, 7680.0)


def _one_two_five(max_value: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return tuple(out)
            out.append(float(v))
        exp += 1


class SimMetrics:
    """The sim's vLLM-style metrics on their own registry.

    Args:
        model_name: value of the ``model_name`` label.
        max_model_len: upper end of the token-count buckets.
    """

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        lab = ["model_name"]
        tok = _one_two_five(max_model_len)
        self.model_name = model_name
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              lab, registry=r, buckets=TTFT_BUCKETS_S).labels(model_name)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             lab, registry=r, buckets=ITL_BUCKETS_S).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             lab, registry=r, buckets=E2E_BUCKETS_S).labels(model_name)
        # vLLM v1 gives its request-phase histograms the e2e edges (request_latency_buckets)
        self.queue = Histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.",
                               lab, registry=r, buckets=E2E_BUCKETS_S).labels(model_name)
        self.prefill = Histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.",
                                 lab, registry=r, buckets=E2E_BUCKETS_S).labels(model_name)
        self.prompt = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                lab, registry=r, buckets=tok).labels(model_name)
        self.generation = Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                    lab, registry=r, buckets=tok).labels(model_name)
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                             lab, registry=r).labels(model_name)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                             lab, registry=r).labels(model_name)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                              lab, registry=r).labels(model_name)
        self.prompt_total = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                    lab, registry=r).labels(model_name)
        self.generation_total = Counter("vllm:generation_tokens", "Number of generation tokens processed.",
                                        lab, registry=r).labels(model_name)
        self.cached_total = Counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens.",
                                    lab, registry=r).labels(model_name)
        self.cache_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of tokens.",
                                     lab, registry=r).labels(model_name)
        self.cache_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of tokens.",
                                  lab, registry=r).labels(model_name)
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                [*lab, "finished_reason"], registry=r)

    def observe_request(
        self, arrival_ns: int, token_times_ns: tuple[int, ...], end_ns: int, isl: int, cached: int,
        finish_reason: str | None, admitted_ns: int | None = None,
    ) -> None:
        """Observe one request that reached the engine (once, when it ends); queue time
        (``admitted_ns - arrival_ns``) when it was admitted, prefill time (first token minus
        ``admitted_ns``) when it also produced a token."""
        self.e2e.observe((end_ns - arrival_ns) / 1e9)
        if admitted_ns is not None:
            self.queue.observe((admitted_ns - arrival_ns) / 1e9)
            if token_times_ns:
                self.prefill.observe((token_times_ns[0] - admitted_ns) / 1e9)
        self.prompt.observe(isl)
        self.generation.observe(len(token_times_ns))
        self.prompt_total.inc(isl)
        self.generation_total.inc(len(token_times_ns))
        self.cached_total.inc(cached)
        if token_times_ns:
            self.ttft.observe((token_times_ns[0] - arrival_ns) / 1e9)
            prev = token_times_ns[0]
            for t in token_times_ns[1:]:
                self.itl.observe((t - prev) / 1e9)
                prev = t
        if finish_reason is not None:
            self._success.labels(self.model_name, "length" if finish_reason == "length" else "stop").inc()

    def exposition(self, running: int, waiting: int, kv_usage: float, queries: int, hits: int) -> bytes:
        """The text exposition, after setting the gauges and cache counters to the given values."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        self.cache_queries.inc(max(0, queries - self.cache_queries._value.get()))
        self.cache_hits.inc(max(0, hits - self.cache_hits._value.get()))
        return generate_latest(self.registry)
