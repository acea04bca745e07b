"""A ``/metrics`` endpoint for tests: a :class:`~servelens.prometheus.frontend.FrontendMetrics`
served over HTTP on 127.0.0.1, fed with synthetic requests whose exact values are known."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from servelens.core.buckets import IslBuckets
from servelens.core.edges import MetricEdges
from servelens.core.summary import RequestSample
from servelens.core.timing import NS_PER_S
from servelens.prometheus.frontend import FrontendMetrics
from servelens.testing.static import serve_static

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@contextmanager
def serve_metrics(metrics: FrontendMetrics) -> Iterator[str]:
    """Serve ``metrics.exposition()`` at ``http://127.0.0.1:PORT/metrics`` (free port) until exit.

    Yields the metrics URL; the server thread is shut down on exit.
    """
    with serve_static(metrics.exposition, CONTENT_TYPE, path="/metrics") as base:
        yield base + "/metrics"


def synthetic_samples(
    n: int, buckets: IslBuckets, seed: int = 0, tokens: int = 8, ttft_per_token_s: float = 40e-6
) -> list[RequestSample]:
    """``n`` successful requests spread over every bucket: TTFT grows with ISL (about
    ``ttft_per_token_s`` per prompt token, log-normal noise), ``tokens`` output tokens with
    log-normal ITL around 20 ms, cached tokens half the ISL."""
    rng = np.random.default_rng(seed)
    upper = [*buckets.boundaries, buckets.boundaries[-1] * 2]
    lower = [1, *(b + 1 for b in buckets.boundaries)]
    out = []
    for i in range(n):
        k = i % len(upper)
        isl = int(rng.integers(lower[k], upper[k] + 1))
        ttft = float(isl * ttft_per_token_s * rng.lognormal(0.0, 0.35)) + 0.002
        itl = tuple(float(x) for x in 0.02 * rng.lognormal(0.0, 0.3, size=tokens - 1))
        out.append(RequestSample(isl=isl, ok=True, ttft_s=ttft, itl_s=itl, cached_tokens=isl // 2))
    return out


def feed(metrics: FrontendMetrics, samples: Sequence[RequestSample], model: str = "test-model") -> None:
    """Record each sample as a streamed request (one token per chunk) on ``metrics``, with
    synthetic integer timestamps (no clock reads), so the exported histograms hold exactly
    these TTFT, ITL and cached-token values."""
    t = 0
    for s in samples:
        req = metrics.begin(model, "chat_completions", "stream", arrival_ns=t)
        assert s.ttft_s is not None
        now = t + round(s.ttft_s * NS_PER_S)
        req.output(now, 1)
        for gap in s.itl_s:
            now += round(gap * NS_PER_S)
            req.output(now, 1)
        req.finish(now + 1000, "success" if s.ok else "error", "" if s.ok else "internal",
                   isl=s.isl, osl=1 + len(s.itl_s), cached_tokens=s.cached_tokens)
        t = now + NS_PER_S // 100


MANY_BOUNDARIES = tuple(512 * (i + 1) for i in range(32))
"""32 ISL boundaries (the most allowed), 512 tokens apart: 33 buckets."""


def many_series_metrics(models: int = 10, boundaries: Sequence[int] = MANY_BOUNDARIES,
                        edges: MetricEdges | None = None, requests_per_model: int = 99, seed: int = 0,
                        **kwargs: Any) -> FrontendMetrics:
    """A :class:`FrontendMetrics` at a large configuration, every series' histogram fed: ``models``
    models (``model-0``, ...) x the ISL buckets of ``boundaries``, ``edges``, each model fed
    ``requests_per_model`` requests spread over every bucket (:func:`synthetic_samples`, one in ten
    failed), and a request for an unknown model; the series budget is set to hold them all. Defaults: 10
    models x 33 buckets x the default (fine) edges, ~109,000 lines of exposition (11.6 MB). ``kwargs``:
    more :class:`FrontendMetrics` arguments."""
    buckets = IslBuckets(tuple(boundaries))
    metrics = FrontendMetrics(isl_buckets=buckets, edges=edges, max_models=max(models, 64),
                              max_series=10**9, **kwargs)
    for k in range(models):
        name = f"model-{k}"
        metrics.register_model(name)
        samples = synthetic_samples(requests_per_model, buckets, seed=seed + k)
        feed(metrics, [s if i % 10 else replace(s, ok=False) for i, s in enumerate(samples)], model=name)
    metrics.begin("no-such-model", "completions", "unary", 0).finish(1_000_000, "error", "not_found")
    return metrics
