"""The load loops: an open loop (each request sent at its due time, in-flight requests capped or
not) and a closed loop (a fixed number of workers, each sending its next request when the last one
ends). Both stop starting requests at ``stop_ns``; requests in flight finish.

Both take the clock (int ns) and the sleep they wait with as arguments (``time.perf_counter_ns`` and
``asyncio.sleep`` by default), so that a test can run them on a virtual clock and check the schedule
exactly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from servelens.bench.workload import WorkItem
from servelens.core.timing import NS_PER_S


async def open_loop(
    items: Sequence[WorkItem], one: Callable[[int], Any], t_start: int, cap: int | None, stop_ns: int | None,
    *, clock: Callable[[], int] = time.perf_counter_ns, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> None:
    """Start ``one(i)`` for each item at ``t_start + offset_ns`` (``clock`` ns): as soon as ``clock``
    reads at least that, never before; items in their order, each started without waiting for the
    ones before it to end; at most ``cap`` at once (None: no cap); none due after ``stop_ns``. Return
    when all have ended. Cancelled, it cancels the requests in flight."""
    sem = asyncio.Semaphore(cap) if cap else None
    tasks: set[asyncio.Task[None]] = set()

    async def guarded(i: int) -> None:
        if sem is None:
            await one(i)
            return
        async with sem:
            await one(i)

    loop = asyncio.get_running_loop()
    try:
        for i, it in enumerate(items):
            due = t_start + it.offset_ns
            if stop_ns is not None and due > stop_ns:
                break
            wait = due - clock()
            while wait > 0:  # a sleep may end early by the clock's reading: never start before due
                await sleep(wait / NS_PER_S)
                wait = due - clock()
            t = loop.create_task(guarded(i))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()


async def closed_loop(
    n: int, one: Callable[[int], Any], workers: int, stop_ns: int | None, ramp_s: float = 0.0,
    *, clock: Callable[[], int] = time.perf_counter_ns, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> None:
    """``workers`` tasks take requests ``0..n-1`` in order, each sending its next when the last ends,
    until all are sent or ``clock`` passes ``stop_ns``; worker ``k`` starts ``ramp_s * k / workers``
    seconds late."""
    it: Iterator[int] = iter(range(n))

    async def worker(k: int) -> None:
        if ramp_s > 0 and k:
            await sleep(ramp_s * k / workers)
        for i in it:
            if stop_ns is not None and clock() > stop_ns:
                return
            await one(i)

    await asyncio.gather(*(worker(k) for k in range(min(workers, n))))
