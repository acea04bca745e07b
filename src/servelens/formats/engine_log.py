"""An engine's per-request times, joined to bench results by request id: the queue and prefill
time of each request, for the capacity analysis (:mod:`servelens.core.capacity`).

The file is JSONL, one object per request with ``request_id`` (the response's ``x-request-id``,
which the bench records) and ``queue_s`` and ``prefill_s`` in seconds (null: unknown). The sim's
``--truth-log`` is such a file (:class:`servelens.sim.truth.TruthRecord`: vLLM's definitions,
queue = arrival to admission, prefill = admission to the first token); other fields are ignored,
so a log from a real engine's request tracing can be brought to this shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from servelens.core.capacity import CapacitySample
from servelens.formats.results import BenchRecord


class _Line(msgspec.Struct):
    request_id: str
    queue_s: float | None = None
    prefill_s: float | None = None


_decoder = msgspec.json.Decoder(_Line)


def load_engine_times(path: str | Path) -> dict[str, tuple[float | None, float | None]]:
    """``request_id -> (queue_s, prefill_s)`` from a JSONL file (blank lines skipped; a later line
    for the same id wins). Raises ValueError naming the line for a line without ``request_id`` or
    with times that are not numbers of seconds >= 0; OSError when unreadable."""
    out: dict[str, tuple[float | None, float | None]] = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = _decoder.decode(line)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise ValueError(f"{path}:{lineno}: not an engine-times line (request_id, queue_s, prefill_s): "
                                 f"{exc}") from None
            bad = [v for v in (rec.queue_s, rec.prefill_s) if v is not None and not 0 <= v < math.inf]
            if bad:
                raise ValueError(f"{path}:{lineno}: not an engine-times line: queue_s and prefill_s are seconds "
                                 f">= 0, got {bad[0]!r}")
            out[rec.request_id] = (rec.queue_s, rec.prefill_s)
    return out


def capacity_samples(records: Sequence[BenchRecord],
                     engine: Mapping[str, tuple[float | None, float | None]] | None = None) -> list[CapacitySample]:
    """One :class:`CapacitySample` per record (ISL, cached tokens, TTFT; a failed request's TTFT
    counts only if it had a first token), with the engine's times where its request id is in
    ``engine``."""
    out = []
    for r in records:
        q, p = (engine.get(r.request_id, (None, None)) if engine and r.request_id else (None, None))
        out.append(CapacitySample(r.isl, r.cached_tokens, r.ttft_s, q, p))
    return out
