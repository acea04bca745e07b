"""The event-loop lag self-check flags a client whose loop is blocked."""

import asyncio
import functools
import io
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from servelens.bench import BenchConfig, print_result, run_bench
from servelens.bench.lag import LagMonitor, LagReport


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), timeout)


def block_loop(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


async def test_blocked_loop_is_not_trustworthy() -> None:
    mon = LagMonitor(interval_s=0.002, threshold_ms=10.0)
    mon.start()
    for k in range(1, 4):
        await until(functools.partial(lambda k: mon.report().samples >= k, k))
        block_loop(40)  # the monitor's sleep overshoots by about this much
    await until(lambda: mon.report().samples >= 5)
    rep = await mon.stop()
    assert rep.max_ms >= 30 and rep.p99_ms > 10 and not rep.trustworthy
    assert "NOT TRUSTWORTHY" in rep.verdict()


def test_verdict_text() -> None:
    ok = LagReport(samples=100, p50_ms=0.1, p99_ms=2.0, max_ms=3.0, interval_ms=10, threshold_ms=10)
    assert ok.trustworthy and "trustworthy" in ok.verdict() and "NOT" not in ok.verdict()


async def test_metrics_url_without_by_isl_families(upstream: Any) -> None:
    res = await run_bench(BenchConfig(url=upstream.url, isl="10", osl="2", num_requests=2,
                                      metrics_url=upstream.url + "/metrics"))
    assert res.server_rows == ()
    buf = io.StringIO()
    print_result(res, Console(file=buf, width=150))
    assert "no servelens by-ISL histograms" in buf.getvalue()
