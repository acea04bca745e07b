"""Data parallelism for the simulated engine: ``replicas`` independent engines, each with its own step
loop, behind one API server, as vLLM's ``--data-parallel-size`` serves (its internal load balancer
sends each request to the replica with the fewest waiting, then running, requests).

Why: a fleet of real-speed replicas serves many requests per second at a real engine's per-request
latencies, where one engine at ``--speedup N`` serves as many only by making every request N times
faster (the demo's short prompts then got TTFTs of a few ms, close to the client-gateway hop).
"""

from __future__ import annotations

import asyncio
import itertools

from servelens.sim.scheduler import Engine, SimRequest
from servelens.sim.steploop import Clock, LoopStats, StepLoop


class Replicas:
    """``len(loops)`` step loops, each over its own :class:`Engine`; the same ``submit``/``cancel``/
    ``start``/``stop`` as one :class:`StepLoop`.

    Args:
        loops: the replicas (at least one).

    Raises ValueError for no loops.
    """

    def __init__(self, loops: list[StepLoop]) -> None:
        if not loops:
            raise ValueError("need at least one replica")
        self.loops = loops

    @classmethod
    def build(cls, engines: list[Engine], clock: Clock, speedup: float) -> Replicas:
        """One :class:`StepLoop` per engine, all on ``clock`` at ``speedup``."""
        return cls([StepLoop(e, clock, speedup) for e in engines])

    @property
    def engines(self) -> list[Engine]:
        """The replicas' engines, in order."""
        return [lp.engine for lp in self.loops]

    def pick(self) -> StepLoop:
        """The replica a new request goes to: fewest waiting, then fewest running, then the first."""
        return min(self.loops, key=lambda lp: (len(lp.engine.waiting), len(lp.engine.running)))

    def submit(self, req: SimRequest) -> None:
        """Queue ``req`` on :meth:`pick`'s replica. Raises ValueError (see :meth:`Engine.submit`)."""
        self.pick().submit(req)

    def cancel(self, req: SimRequest) -> None:
        """Stop ``req`` within one step (the flag is on the request; every loop is woken, only its
        own engine holds it)."""
        for lp in self.loops:
            lp.cancel(req)

    def start(self) -> None:
        """Start every loop's task."""
        for lp in self.loops:
            lp.start()

    async def stop(self) -> None:
        """Stop every loop."""
        await asyncio.gather(*(lp.stop() for lp in self.loops))

    @property
    def stats(self) -> LoopStats:
        """The loops' timing stats together (steps and busy time summed, lateness pooled: the latest
        ``maxlen / replicas`` steps of each, so every replica is in it however long they ran)."""
        if len(self.loops) == 1:
            return self.loops[0].stats
        out = LoopStats()
        share = (out.late_ns.maxlen or 0) // len(self.loops)  # each loop's latest: one bounded history
        for lp in self.loops:
            out.steps += lp.stats.steps
            out.busy_ns += lp.stats.busy_ns
            late = lp.stats.late_ns
            out.late_ns.extend(itertools.islice(late, max(0, len(late) - share), None))
        return out
