"""Bench results files as the report reads them: each request's table sample plus its wall-clock
send time (for "p95 TTFT over time"). Reading the file is :mod:`servelens.formats.results`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servelens.core.summary import RequestSample
from servelens.core.timing import NS_PER_S
from servelens.formats.results import load_results, to_sample


@dataclass(frozen=True)
class TimedSample:
    """A request's table sample and its wall-clock send time (unix seconds; None if unknown)."""

    sample: RequestSample
    send_time_s: float | None


def load_timed_samples(path: str | Path) -> list[TimedSample]:
    """Every request of a bench results file (a ``results.jsonl`` or the folder holding it).

    Raises ValueError for a missing, unreadable or malformed file (the message names the line).
    """
    try:
        records = load_results(path)
    except OSError as exc:
        raise ValueError(f"cannot read results file {path}: {exc.strerror or exc}") from None
    return [TimedSample(to_sample(r), r.wall_send_ns / NS_PER_S if r.wall_send_ns else None) for r in records]
