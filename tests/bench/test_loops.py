"""The open and closed load loops on a virtual clock: the schedule is checked exactly (which request
starts when, in which order, how many at once), with no wall-clock bound."""

from __future__ import annotations

import asyncio

from servelens.bench.loops import closed_loop, open_loop
from servelens.bench.workload import WorkItem

MS = 1_000_000


class VirtualClock:
    """A clock in int ns that moves only when the one task that waits on it sleeps."""

    def __init__(self, now_ns: int = 0) -> None:
        self.now_ns = now_ns
        self.sleeps: list[float] = []

    def __call__(self) -> int:
        return self.now_ns

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)  # what is ready runs first, at the time it was started
        self.now_ns += round(seconds * 1e9)


def items(offsets_ms: list[float]) -> list[WorkItem]:
    return [WorkItem(isl=10, osl=2, hash_ids=(), offset_ns=round(o * MS)) for o in offsets_ms]


async def test_open_loop_starts_each_request_at_its_due_time_in_order() -> None:
    clock = VirtualClock(now_ns=7 * MS)  # the run starts at 5 ms on this clock, its start-up took 2
    offsets = [0, 10, 30, 30, 31.5, 90]
    started: list[tuple[int, int]] = []

    async def one(i: int) -> None:
        started.append((i, clock()))

    await open_loop(items(offsets), one, t_start=5 * MS, cap=None, stop_ns=None, clock=clock, sleep=clock.sleep)
    # each at its due time (the first is late: it was due before the loop began), none before
    assert started == [(0, 7 * MS), (1, 15 * MS), (2, 35 * MS), (3, 35 * MS), (4, 36_500_000), (5, 95 * MS)]
    assert all(s > 0 for s in clock.sleeps)  # it waits only when something is due later


async def test_open_loop_never_starts_early_when_a_sleep_ends_early() -> None:
    clock = VirtualClock()

    async def short_sleep(seconds: float) -> None:  # a timer that fires up to half its time early
        await clock.sleep(seconds / 2 if seconds > 1e-6 else seconds)

    started: list[int] = []

    async def one(i: int) -> None:
        started.append(clock())

    await open_loop(items([0, 20, 50]), one, t_start=0, cap=None, stop_ns=None, clock=clock, sleep=short_sleep)
    assert [s >= due for s, due in zip(started, (0, 20 * MS, 50 * MS), strict=True)] == [True, True, True], started


async def test_open_loop_does_not_wait_for_a_request_before_starting_the_next() -> None:
    # request 0 ends only once request 3 has started: a loop that waited for it would never get there
    clock = VirtualClock()
    last_started = asyncio.Event()
    started: list[int] = []

    async def one(i: int) -> None:
        started.append(i)
        if i == 3:
            last_started.set()
        if i == 0:
            await last_started.wait()

    async with asyncio.timeout(30):  # a bound for a hung test, not a figure
        await open_loop(items([0, 10, 20, 30]), one, 0, None, None, clock=clock, sleep=clock.sleep)
    assert started == [0, 1, 2, 3]


async def test_open_loop_all_due_at_once_are_all_in_flight_together() -> None:
    # rate inf: every offset 0; each request yields once before it ends, so when they are all
    # started together none ends before the last one started
    clock = VirtualClock()
    started: list[int] = []
    seen_at_end: list[int] = []

    async def one(i: int) -> None:
        started.append(i)
        await asyncio.sleep(0)
        seen_at_end.append(len(started))

    await open_loop(items([0] * 8), one, 0, None, None, clock=clock, sleep=clock.sleep)
    assert started == list(range(8)) and seen_at_end == [8] * 8
    assert clock.sleeps == []  # nothing was waited for


async def test_open_loop_cap_bounds_requests_in_flight() -> None:
    clock = VirtualClock()
    in_flight = 0
    most = 0

    async def one(i: int) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        for _ in range(3):
            await asyncio.sleep(0)
        in_flight -= 1

    await open_loop(items([0] * 8), one, 0, 2, None, clock=clock, sleep=clock.sleep)
    assert most == 2 and in_flight == 0


async def test_open_loop_stops_at_the_planned_due_times() -> None:
    # 100 req/s: due at 0, 10, ..., 190 ms; stop at 45 ms keeps the first five, by the plan
    clock = VirtualClock()
    started: list[int] = []

    async def one(i: int) -> None:
        started.append(i)

    await open_loop(items([10 * i for i in range(20)]), one, 0, None, 45 * MS, clock=clock, sleep=clock.sleep)
    assert started == [0, 1, 2, 3, 4] and clock() == 40 * MS  # no sleep towards a request it will not send


async def test_closed_loop_sends_the_next_when_the_last_ends_until_the_stop() -> None:
    # one worker, every request 20 ms long: starts at 0, 20 and 40 ms; at 60 ms the clock is past the
    # 50 ms stop, so the fourth is not sent
    clock = VirtualClock()
    started: list[tuple[int, int]] = []

    async def one(i: int) -> None:
        started.append((i, clock()))
        await clock.sleep(0.020)

    await closed_loop(50, one, 1, 50 * MS, clock=clock, sleep=clock.sleep)
    assert started == [(0, 0), (1, 20 * MS), (2, 40 * MS)]


async def test_closed_loop_workers_take_the_requests_in_order_each_once() -> None:
    clock = VirtualClock()
    started: list[int] = []

    async def one(i: int) -> None:
        started.append(i)
        await asyncio.sleep(0)

    await closed_loop(10, one, 3, None, clock=clock, sleep=clock.sleep)
    assert started == list(range(10))
