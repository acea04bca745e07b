"""Event-loop lag self-check: is the bench client itself the bottleneck?

A task sleeps a fixed interval (default 10 ms) and records how late it wakes up (the overshoot).
Every chunk the client stamps waits for the loop like that task does, so the overshoot is how far
the client's timestamps can trail the bytes' arrival. When the p99 overshoot exceeds a threshold
(default 10 ms), the client's TTFT/ITL figures are marked as not trustworthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from servelens.core.quantiles import percentile


@dataclass(frozen=True)
class LagReport:
    """Event-loop lag over a run (milliseconds).

    Attributes:
        samples: how many sleeps were measured.
        p50_ms, p99_ms, max_ms: overshoot percentiles (ms); 0 without samples.
        interval_ms: the sleep interval.
        threshold_ms: the p99 above which the client figures are not trustworthy.
        trustworthy: ``p99_ms <= threshold_ms``.
    """

    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    interval_ms: float
    threshold_ms: float

    @property
    def trustworthy(self) -> bool:
        """True when the client was not the bottleneck (p99 lag within the threshold)."""
        return self.p99_ms <= self.threshold_ms

    def verdict(self) -> str:
        """One line for the table caption."""
        if self.trustworthy:
            return (f"client event-loop lag p99 {self.p99_ms:.1f} ms (<= {self.threshold_ms:g} ms): "
                    "client figures are trustworthy")
        return (f"NOT TRUSTWORTHY: client event-loop lag p99 {self.p99_ms:.1f} ms > {self.threshold_ms:g} ms; "
                "the bench client was a bottleneck, its latencies include its own delay")


class LagMonitor:
    """Samples event-loop overshoot while running. Use ``start()`` then ``await stop()``.

    Args:
        interval_s: sleep interval (s).
        threshold_ms: p99 overshoot above which figures are not trustworthy (ms).
    """

    def __init__(self, interval_s: float = 0.01, threshold_ms: float = 10.0) -> None:
        if interval_s <= 0:
            raise ValueError(f"lag interval must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self.threshold_ms = threshold_ms
        self._lags_ns: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        interval_ns = round(self.interval_s * 1e9)
        clock = time.perf_counter_ns
        lags = self._lags_ns
        while True:
            t0 = clock()
            await asyncio.sleep(self.interval_s)
            lags.append(max(0, clock() - t0 - interval_ns))

    def start(self) -> None:
        """Start sampling on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> LagReport:
        """Stop sampling and return the report."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        return self.report()

    def report(self) -> LagReport:
        """The report of the samples so far."""
        ms = [x / 1e6 for x in self._lags_ns]
        return LagReport(
            samples=len(ms),
            p50_ms=percentile(ms, 50) if ms else 0.0,
            p99_ms=percentile(ms, 99) if ms else 0.0,
            max_ms=max(ms) if ms else 0.0,
            interval_ms=self.interval_s * 1000,
            threshold_ms=self.threshold_ms,
        )
