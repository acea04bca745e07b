"""Sum of several processes' :class:`~servelens.core.snapshot.StateSnapshot` (pure): one ``/metrics``
for the workers of one gateway (:mod:`servelens.gateway.workers`).

Every exported value of a frontend state is a count that only grows (histogram buckets and sums,
``requests_total``, the assignment, prompt-token and SLO counters, disconnected clients) or a gauge
of requests in flight; the whole is the sum, series by series, of the parts: the same as one process
that had taken all the requests, since each request is counted by exactly one worker. A histogram's
``_sum`` is a float sum, so a merged sum may differ from one process's in the last bits (the order of
the additions); counts are exact.

The parts must share their edges and buckets (one gateway config); models and ``requests_total``
series are the union, in order of first appearance (a series one worker has not created yet counts 0
there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from servelens.core.snapshot import HistogramCopy, ModelSnapshot, RequestKey, StateSnapshot


def add_histograms(parts: Sequence[HistogramCopy]) -> HistogramCopy:
    """The histogram of all observations of ``parts`` (same edges). Raises ValueError for a different
    number of buckets."""
    if len(parts) == 1:
        return parts[0]
    n = len(parts[0].counts)
    if any(len(p.counts) != n for p in parts):
        raise ValueError("cannot add histograms with different edges")
    counts = tuple(map(sum, zip(*(p.counts for p in parts), strict=True)))
    return HistogramCopy(counts, sum(p.sum for p in parts), sum(p.total for p in parts))


def _add_keyed(parts: Sequence[Sequence[tuple[RequestKey, int]]]) -> tuple[tuple[RequestKey, int], ...]:
    out: dict[RequestKey, int] = {}
    for part in parts:
        for key, count in part:
            out[key] = out.get(key, 0) + count
    return tuple(sorted(out.items()))


def _add_named(parts: Sequence[Sequence[tuple[str, int]]]) -> tuple[tuple[str, int], ...]:
    out: dict[str, int] = {}
    for part in parts:
        for key, count in part:
            out[key] = out.get(key, 0) + count
    return tuple(out.items())


def _add_columns(parts: Sequence[Sequence[HistogramCopy]]) -> tuple[HistogramCopy, ...]:
    if len({len(p) for p in parts}) != 1:
        raise ValueError("cannot add models with different ISL or uncached buckets")
    return tuple(add_histograms(col) for col in zip(*parts, strict=True))


def merge_models(parts: Sequence[ModelSnapshot]) -> ModelSnapshot:
    """One model's values summed over ``parts`` (the same model in several processes). Raises
    ValueError for parts with different buckets."""
    if len(parts) == 1:
        return parts[0]
    slo: list[tuple[str, int, int, int]] = []
    if any(p.slo_met for p in parts):
        rows = [p.slo_met for p in parts if p.slo_met]
        for row in zip(*rows, strict=True):
            slo.append((row[0][0], sum(r[1] for r in row), sum(r[2] for r in row), sum(r[3] for r in row)))
    prompt = [p.prompt_tokens_by_isl for p in parts]
    return ModelSnapshot(
        name=parts[0].name,
        histograms=_add_columns([p.histograms for p in parts]),
        isl_sources=_add_named([p.isl_sources for p in parts]),
        requests=_add_keyed([p.requests for p in parts]),
        inflight=sum(p.inflight for p in parts),
        output_tokens=sum(p.output_tokens for p in parts),
        slo_met=tuple(slo),
        prompt_tokens_by_isl=tuple(map(sum, zip(*prompt, strict=True))) if prompt[0] else (),
        uncached=_add_columns([p.uncached for p in parts]),
        uncached_sources=_add_named([p.uncached_sources for p in parts]),
    )


def without_inflight(snap: StateSnapshot) -> StateSnapshot:
    """``snap`` with every model's ``inflight`` at 0: what a process that ended still counts (its
    requests in flight were never finished, and no longer are in flight)."""
    return replace(snap, models=tuple(replace(m, inflight=0) for m in snap.models))


def merge_snapshots(parts: Sequence[StateSnapshot]) -> StateSnapshot:
    """The sum of ``parts`` series by series (see the module docstring); models in order of first
    appearance. Raises ValueError when ``parts`` is empty or its edges or buckets differ."""
    if not parts:
        raise ValueError("nothing to merge")
    first = parts[0]
    if len(parts) == 1:
        return first
    for p in parts[1:]:
        if (p.edges, p.isl_labels, p.uncached_labels, p.slo_kinds, p.slo_thresholds) != (
                first.edges, first.isl_labels, first.uncached_labels, first.slo_kinds, first.slo_thresholds):
            raise ValueError("cannot merge snapshots of states with other edges, buckets or SLOs")
    by_name: dict[str, list[ModelSnapshot]] = {}
    for p in parts:
        for m in p.models:
            by_name.setdefault(m.name, []).append(m)
    unknown = [p.unknown_duration for p in parts if p.unknown_duration is not None]
    return StateSnapshot(
        edges=first.edges,
        isl_labels=first.isl_labels,
        models=tuple(merge_models(ms) for ms in by_name.values()),
        unknown_requests=_add_keyed([p.unknown_requests for p in parts]),
        unknown_duration=add_histograms(unknown) if unknown else None,
        disconnected_clients=sum(p.disconnected_clients for p in parts),
        slo_kinds=first.slo_kinds,
        uncached_labels=first.uncached_labels,
        slo_thresholds=first.slo_thresholds,
    )
