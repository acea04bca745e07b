"""The simulated engine's step loop: the one asyncio task that advances time, with the clock
injected (:class:`MonotonicClock` in the server, :class:`VirtualClock` in tests).

:class:`StepLoop` is the only task that advances time: it plans a step, sleeps until the step's
modelled end (``cost_s / speedup`` after its start), completes it (stamping every token emitted by
the step with the clock's time) and wakes the requests' handlers through their ``notify``
callbacks. One task serves every request; handlers never sleep per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from servelens.sim.model import MIN_SPEEDUP
from servelens.sim.scheduler import Engine, SimRequest

log = logging.getLogger("servelens.sim")


class Clock(Protocol):
    """Time source of the step loop (int ns)."""

    def now_ns(self) -> int:
        """Current time in ns."""
        ...

    async def sleep_until(self, deadline_ns: int) -> None:
        """Return at (or just after) ``deadline_ns``."""
        ...


class MonotonicClock:
    """``time.perf_counter_ns()``; sleeps with asyncio, then yields to the loop (``sleep(0)``) for
    the last ``min(spin_ns, wait / 4)`` so that a step ends well within a millisecond of its
    deadline even though asyncio timers have millisecond granularity (the quarter cap keeps the
    spin's CPU cost at most a quarter of a core when steps are short; a wait under 1 ms is one 1 ms
    timer, never a spin). ``spin_ns=0`` never spins."""

    __slots__ = ("spin_ns",)

    def __init__(self, spin_ns: int = 1_000_000) -> None:
        self.spin_ns = spin_ns

    def now_ns(self) -> int:
        """``time.perf_counter_ns()``."""
        return time.perf_counter_ns()

    async def sleep_until(self, deadline_ns: int) -> None:
        """Sleep until ``deadline_ns`` (perf_counter ns)."""
        wait = deadline_ns - time.perf_counter_ns()
        if wait <= 0:
            return
        spin = min(self.spin_ns, wait // 4)
        # never a sub-millisecond timer: uvloop truncates it to 0 ms and fires it at once (a busy
        # loop); a wait under 1 ms therefore ends up to 1 ms late instead of spinning
        await asyncio.sleep(max(wait - spin, 1_000_000) / 1e9)
        while time.perf_counter_ns() < deadline_ns:
            await asyncio.sleep(0)


class VirtualClock:
    """A clock that jumps to each deadline at once (for deterministic tests of the step loop)."""

    __slots__ = ("now",)

    def __init__(self, start_ns: int = 0) -> None:
        self.now = start_ns

    def now_ns(self) -> int:
        """The virtual time."""
        return self.now

    async def sleep_until(self, deadline_ns: int) -> None:
        """Advance to ``deadline_ns`` and yield once."""
        self.now = max(self.now, deadline_ns)
        await asyncio.sleep(0)


@dataclass
class LoopStats:
    """Step-loop timing: lateness of each step's end against the model (ns), bounded history."""

    steps: int = 0
    late_ns: deque[int] = field(default_factory=lambda: deque(maxlen=200_000))
    busy_ns: int = 0

    def summary(self) -> dict[str, float]:
        """Step count, p50/p99/max lateness (ms) and the fraction of steps ending <= 1 ms late."""
        xs = sorted(self.late_ns)
        if not xs:
            return {"steps": self.steps, "late_p50_ms": 0.0, "late_p99_ms": 0.0, "late_max_ms": 0.0,
                    "within_1ms": 1.0}
        return {
            "steps": self.steps,
            "late_p50_ms": xs[len(xs) // 2] / 1e6,
            "late_p99_ms": xs[min(len(xs) - 1, int(len(xs) * 0.99))] / 1e6,
            "late_max_ms": xs[-1] / 1e6,
            "within_1ms": bisect_right(xs, 1_000_000) / len(xs),
        }


class StepLoop:
    """The asyncio task that runs :class:`Engine` steps in (scaled) time.

    Args:
        engine: the planner.
        clock: time source (:class:`MonotonicClock` in the server, :class:`VirtualClock` in tests).
        speedup: simulated seconds per wall second; wall step = ``cost_s / speedup``.
        catchup_ns: if a step ends at most this late, the next step starts at the modelled end
            (lateness does not accumulate); later than that, it starts now (the engine slows down,
            as a real one would on a busy host).
    """

    def __init__(self, engine: Engine, clock: Clock, speedup: float = 1.0, catchup_ns: int = 2_000_000) -> None:
        if not speedup >= MIN_SPEEDUP:
            raise ValueError(f"speedup must be >= {MIN_SPEEDUP:g} (inf: no waiting), got {speedup!r}")
        self.engine = engine
        self.clock = clock
        self.speedup = speedup
        self.catchup_ns = catchup_ns
        self.stats = LoopStats()
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def submit(self, req: SimRequest) -> None:
        """Queue a request and wake the loop. Raises ValueError (see :meth:`Engine.submit`)."""
        self.engine.submit(req)
        self._work.set()

    def cancel(self, req: SimRequest) -> None:
        """Stop ``req`` within one step."""
        self.engine.cancel(req, self.clock.now_ns())
        self._work.set()

    def start(self) -> None:
        """Start the loop task in the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="servelens-sim-steps")

    async def stop(self) -> None:
        """Cancel the loop task and wait for it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.engine.drop_all()

    async def run(self) -> None:
        """Plan, sleep, complete; forever (until cancelled). A step that raises (a bug, or a model
        input nothing validated) is logged with its traceback, and the requests in the engine are let
        go (their ``on_done`` runs, so their clients get an end instead of hanging); the loop goes on."""
        while True:
            try:
                await self._steps()
            except Exception:
                log.exception("sim step failed; letting go of %d request(s)",
                              len(self.engine.waiting) + len(self.engine.running))
                try:
                    self.engine.drop_all()
                except Exception:  # a request's own callback failed: the loop must still go on
                    log.exception("letting go of the requests failed too")
                await asyncio.sleep(0)  # a failure that repeats must not hold the event loop

    async def _steps(self) -> None:
        engine, clock, stats = self.engine, self.clock, self.stats
        start = clock.now_ns()
        while True:
            step = engine.plan()
            if step is None:
                self._work.clear()
                await self._work.wait()
                start = clock.now_ns()
                continue
            engine.admit_times(step, clock.now_ns())
            deadline = start + int(step.cost_s * 1e9 / self.speedup)
            await clock.sleep_until(deadline)
            now = clock.now_ns()
            late = now - deadline
            stats.steps += 1
            stats.late_ns.append(late)
            stats.busy_ns += now - start
            engine.complete(step, now)
            start = deadline if late <= self.catchup_ns else now
