"""The bench's workload: the requests of a run in send order (lengths, prefix blocks, due times),
from a trace or from synthetic length distributions, with requests over the context dropped or
clipped."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelens.bench.arrivals import arrival_offsets, trace_offsets
from servelens.bench.config import BenchConfig
from servelens.bench.distributions import parse_length_dist
from servelens.bench.traces import TraceRow, clip_row, read_trace
from servelens.core.timing import NS_PER_S


@dataclass(frozen=True)
class WorkItem:
    """One request to send: prompt and output length (tokens), prefix-cache block ids (traces), and
    its due time as an offset from the run start (ns; 0 in a closed loop)."""

    isl: int
    osl: int
    hash_ids: tuple[int, ...]
    offset_ns: int


def build_workload(config: BenchConfig, max_context: int | None) -> tuple[list[WorkItem], int, int, bool]:
    """Items in send order, dropped and clipped counts, and whether they carry their own schedule."""
    items: list[WorkItem] = []
    dropped = clipped = 0
    limit = config.max_requests
    if config.trace:
        rows: list[TraceRow] = read_trace(config.trace, config.trace_format)
        offsets = trace_offsets([r.offset_ns for r in rows], config.time_scale)
        end_ns = config.duration_s * NS_PER_S if config.duration_s is not None else None
        for row, off in zip(rows, offsets, strict=True):
            if (limit is not None and len(items) >= limit) or (end_ns is not None and off > end_ns):
                break
            if max_context is not None and row.isl_tokens + row.osl_tokens > max_context:
                if config.long_requests == "drop":
                    dropped += 1
                    continue
                clip_osl = min(row.osl_tokens, max(1, max_context // 2))
                row = clip_row(TraceRow(row.offset_ns, row.isl_tokens, clip_osl, row.hash_ids), max_context - clip_osl)
                clipped += 1
            items.append(WorkItem(row.isl_tokens, row.osl_tokens, row.hash_ids, off))
        return items, dropped, clipped, True
    isls = parse_length_dist(config.isl).sample(np.random.default_rng([config.seed, 1]), config.num_requests)
    osls = parse_length_dist(config.osl).sample(np.random.default_rng([config.seed, 2]), config.num_requests)
    for i, o in zip(isls, osls, strict=True):
        if limit is not None and len(items) >= limit:
            break
        if max_context is not None and i + o > max_context:
            if config.long_requests == "drop":
                dropped += 1
                continue
            o = min(o, max(1, max_context // 2))
            i = max_context - o
            clipped += 1
        items.append(WorkItem(i, o, (), 0))
    scheduled = config.rate is not None
    if config.rate is not None:
        offs = arrival_offsets(config.arrival, len(items), config.rate, config.seed)
        items = [WorkItem(it.isl, it.osl, it.hash_ids, off) for it, off in zip(items, offs, strict=True)]
        if config.duration_s is not None:
            items = [it for it in items if it.offset_ns <= config.duration_s * NS_PER_S]
    return items, dropped, clipped, scheduled
