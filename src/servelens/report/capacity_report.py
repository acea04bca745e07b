"""Where the capacity is short, for ``servelens report --capacity`` (one window): from a bench
results file (per request, joined with the engine's per-request times when ``--engine-log`` gives
them), from ``/metrics`` scrapes (the gateway's by-ISL TTFT and cached-token histograms beside the
engine's vLLM queue and prefill histograms), or from a Prometheus range (exact counter deltas).
The analysis is :mod:`servelens.core.capacity`."""

from __future__ import annotations

import time

from servelens.core.buckets import IslBuckets
from servelens.core.capacity import (
    BucketMeans,
    CapacityReport,
    EngineTimes,
    capacity_from_histograms,
    capacity_from_samples,
)
from servelens.dashboards.queries import model_matcher
from servelens.formats.engine_log import capacity_samples, load_engine_times
from servelens.formats.metrics_text import Scrape
from servelens.prometheus.names import MetricNames
from servelens.report.explain_windows import read_records
from servelens.report.promapi import PromClient, parse_duration_s
from servelens.report.sources import exact_increases, scrape

QUEUE_HISTOGRAM = "vllm:request_queue_time_seconds"
"""vLLM v1's queue time (arrival to first scheduled), all requests; label ``model_name``."""
PREFILL_HISTOGRAM = "vllm:request_prefill_time_seconds"
"""vLLM v1's prefill time (first scheduled to first token), all requests; label ``model_name``."""


def prompt_families(names: MetricNames) -> tuple[str, ...]:
    """Families that may carry the prompt tokens per ``isl_bucket`` (a histogram's ``_sum`` or a
    counter's ``_total``), first found wins: what a fit over bucket means needs beside the cached
    tokens. Absent from today's gateway: then the fit needs per-request data."""
    return (f"{names.prefix}_input_sequence_tokens_by_isl", f"{names.prefix}_prompt_tokens_by_isl")


def from_results(path: str, buckets: IslBuckets, engine_log: str | None = None) -> CapacityReport:
    """Per-request analysis of a bench run. Raises ValueError for a missing or malformed file."""
    records = read_records(path)
    times = load_engine_times(engine_log) if engine_log else None
    report = capacity_from_samples(capacity_samples(records, times), buckets)
    if times is not None and not any(r.request_id in times for r in records):
        raise ValueError(f"{engine_log}: no request id of {path} in it (another run's log?)")
    return report


def _engine_from_scrapes(after: Scrape, before: Scrape | None) -> EngineTimes | None:
    q, p = after.histogram(QUEUE_HISTOGRAM), after.histogram(PREFILL_HISTOGRAM)
    if q is None or p is None:
        return None
    if before is not None:
        q0, p0 = before.histogram(QUEUE_HISTOGRAM), before.histogram(PREFILL_HISTOGRAM)
        q, p = (q.minus(q0) if q0 else q), (p.minus(p0) if p0 else p)
    return EngineTimes(q.sum, q.count, p.sum, p.count)


def _delta(after: Scrape, before: Scrape | None, name: str, label: str, model: str | None) -> float | None:
    """``name``'s sample summed over series of bucket ``label`` (and model), after minus before;
    None when absent."""
    match = {"isl_bucket": label, **({"model": model} if model else {})}
    if not any(s == name and all(dict(lab).get(k) == v for k, v in match.items()) for s, lab in after.samples):
        return None
    return after.value(name, match) - (before.value(name, match) if before else 0.0)


def _bucket_means(labels: tuple[str, ...], ttft: dict[str, tuple[float, float]],
                  cached: dict[str, tuple[float, float]], prompt: dict[str, tuple[float, float]]) -> list[BucketMeans]:
    """Means per bucket from ``(sum, count)`` pairs; uncached = mean prompt - mean cached."""
    out = []
    for label in labels:
        s, n = ttft.get(label, (0.0, 0.0))
        unc = None
        if label in prompt and prompt[label][1] > 0:
            ps, pn = prompt[label]
            cs, cn = cached.get(label, (0.0, 0.0))
            unc = max(0.0, ps / pn - (cs / cn if cn > 0 else 0.0))
        out.append(BucketMeans(label, n, s / n if n > 0 else None, unc))
    return out


def from_metrics(source: str, names: MetricNames, before: str | None, model: str | None, labels: tuple[str, ...],
                 engine: str | None = None, engine_before: str | None = None) -> CapacityReport:
    """From a gateway scrape (or the difference of two) and, when given, the engine's (the vLLM
    histograms are also looked for in the gateway's scrape). Raises ValueError."""
    after, prior = scrape(source), (scrape(before) if before else None)
    e_after = scrape(engine) if engine else after
    e_before = scrape(engine_before) if engine_before else (None if engine else prior)
    if engine_before and not engine:
        raise ValueError("--engine-metrics-before needs --engine-metrics")
    ttft: dict[str, tuple[float, float]] = {}
    cached: dict[str, tuple[float, float]] = {}
    prompt: dict[str, tuple[float, float]] = {}
    for label in labels:
        for fam, into in ((names.ttft_by_isl, ttft), (names.cached_by_isl, cached)):
            s, n = _delta(after, prior, fam + "_sum", label, model), _delta(after, prior, fam + "_count", label, model)
            if s is not None and n is not None:
                into[label] = (s, n)
        for fam in prompt_families(names):
            s = _delta(after, prior, fam + "_sum", label, model)
            n = _delta(after, prior, fam + "_count", label, model)
            if s is None:  # a counter: its requests are the bucket's finished requests
                s = _delta(after, prior, fam + "_total", label, model)
                n = _delta(after, prior, names.duration_by_isl + "_count", label, model)
            if s is not None and n is not None:
                prompt[label] = (s, n)
                break
    if not ttft:
        raise ValueError(f"{source}: no {names.ttft_by_isl} series (bucketing off, or another --metrics-prefix?)")
    means = _bucket_means(labels, ttft, cached, prompt)
    return capacity_from_histograms(means, _engine_from_scrapes(e_after, e_before))


def from_prometheus(url: str, names: MetricNames, window: str, model: str | None, labels: tuple[str, ...],
                    end_s: float | None = None) -> CapacityReport:
    """From exact counter deltas over the last ``window``: the gateway's by-ISL sums and counts and
    the engine's vLLM queue and prefill histograms (``model_name`` = ``--model`` when given).
    Raises ValueError (PromApiError)."""
    parse_duration_s(window)
    client = PromClient(url)
    at = time.time() if end_s is None else end_s
    m = model_matcher(model)

    def pairs(fam: str, count: str | None = None) -> dict[str, tuple[float, float]]:
        sums = exact_increases(client, fam, m, window, at)
        counts = exact_increases(client, count or fam.replace("_sum", "_count"), m, window, at)
        return {k[0]: (v, counts.get(k, 0.0)) for k, v in sums.items()}

    ttft = pairs(f"{names.ttft_by_isl}_sum")
    cached = pairs(f"{names.cached_by_isl}_sum")
    prompt: dict[str, tuple[float, float]] = {}
    for fam in prompt_families(names):
        prompt = pairs(f"{fam}_sum") or pairs(f"{fam}_total", f"{names.duration_by_isl}_count")
        if prompt:
            break
    if not ttft:
        raise ValueError(f"{url}: no {names.ttft_by_isl}_sum series in the last {window}")
    em = "" if not model else f"model_name={model!r}".replace("'", '"')
    got = [exact_increases(client, f"{h}_{s}", em, window, at, ()).get(())
           for h in (QUEUE_HISTOGRAM, PREFILL_HISTOGRAM) for s in ("sum", "count")]
    engine = None if any(v is None for v in got) else EngineTimes(*(float(v or 0.0) for v in got))
    return capacity_from_histograms(_bucket_means(labels, ttft, cached, prompt), engine)
