"""Faults under load (issue 16): the engine SIGKILLed and restarted in the middle of a load run; an engine
that stalls mid-stream for many requests at once; a storm of client disconnects.

Each test drives a bounded number of concurrent streams through an in-process gateway and asserts what
must hold whatever the machine's speed: every request counted once in ``requests_total`` with the outcome
the client saw (success, a cut stream, the gateway's 502 or 504), inflight back to 0, no request still being
answered, no upstream connection left in use, no task and no socket left over once the clients are
gone, and the gateway serving normally afterwards. Waits are on the gateway's own counts and the sim's
truth records (events), each with a bound for a hung test, never a timed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from servelens.gateway.testing import GatewayHandle, inflight, run_gateway, samples, value
from servelens.process import ServerProcess, free_port
from servelens.sim.testing import run_sim

PROMPT = "the quick brown fox jumps over the lazy dog " * 20
HUNG_S = 60.0
"""Bound on any single wait: only a hung test reaches it."""


def body(n: int) -> dict[str, Any]:
    return {"model": "sim-model", "max_tokens": n, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": PROMPT}]}


async def stream(s: aiohttp.ClientSession, url: str, n: int, headers: dict[str, str] | None = None,
                 leave_after: int | None = None) -> str:
    """One streamed request; the outcome as the gateway names it: ``success`` (the stream ended with
    ``[DONE]``), ``truncated_stream`` or ``response_timeout`` (a stream cut: which one the caller knows),
    ``unavailable``/``backend_error`` (the gateway's 502 by its ``error.code``), ``cancelled`` (this client
    left after ``leave_after`` reads)."""
    reads = 0
    data = b""
    try:
        async with s.post(url + "/v1/chat/completions", json=body(n), headers=headers or {}) as r:
            if r.status == 502:
                code = (await r.json())["error"]["code"]
                return {"upstream_unavailable": "unavailable", "upstream_error": "backend_error"}[code]
            if r.status != 200:
                return f"http_{r.status}"
            async for part in r.content.iter_any():
                data += part
                reads += 1
                if leave_after is not None and reads >= leave_after:
                    r.close()  # the rest is not read: the connection is dropped under the stream
                    return "cancelled"
    except aiohttp.ClientPayloadError:
        return "cut"
    return "success" if data.endswith(b"data: [DONE]\n\n") else "cut"


def gateway_outcomes(gw: GatewayHandle) -> Counter[str]:
    """``requests_total`` of the gateway by outcome (``success`` or the error type)."""
    out: Counter[str] = Counter()
    for (name, labels), v in samples(gw.metrics).items():
        if name == gw.metrics.names.requests and v:
            d = dict(labels)
            out["success" if d["status"] == "success" else d["error_type"]] += int(v)
    return out


def open_sockets() -> int:
    """Sockets open in this process (a child's pipe, such as the restarted engine's output, is not one)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return n


def left_over(before: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - before - {asyncio.current_task()}  # type: ignore[operator]


async def until(cond: Callable[[], bool], what: str, left_over: Callable[[], object] | None = None,
                timeout_s: float = HUNG_S) -> None:
    """Wait until ``cond()`` holds (a count of this process: tasks, descriptors, connections), checked
    every 10 ms; bounded by ``timeout_s`` (then fail saying ``what``, and what ``left_over()`` shows)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what}: {left_over() if left_over else ''}"
        await asyncio.sleep(0.01)  # polling a condition with a deadline, not a timed wait


@asynccontextmanager
async def clean_gateway(upstream: str, **config: Any) -> AsyncIterator[GatewayHandle]:
    """A gateway, and afterwards: nothing in flight, no upstream connection in use, no task and (once its
    idle keep-alive connections expired) no socket more than before it started."""
    sockets0 = open_sockets()
    async with run_gateway(upstream, **config) as gw:
        tasks0 = asyncio.all_tasks()  # the gateway's own (model refresher, server) included
        yield gw
        await until(lambda: gw.gateway.accounting.active == 0, "requests still being answered")
        assert inflight(gw.metrics) == 0
        # the relay lets go of its upstream connection as a request ends
        await until(lambda: gw.gateway.upstream.connections[0] == 0, "upstream connections in use")
        # what the clients' connections leave on the server side ends when they are gone
        await until(lambda: not left_over(tasks0), "tasks left over", left_over=lambda: left_over(tasks0))
    await until(lambda: open_sockets() <= sockets0, f"sockets over the {sockets0} before", left_over=open_sockets)


async def wait_counted(gw: GatewayHandle, n: int) -> None:
    await gw.gateway.wait_finished(n, timeout=HUNG_S)


def truth_outcomes(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(json.loads(line)["outcome"] for line in path.read_text().splitlines())


async def test_engine_sigkilled_and_restarted_mid_load(tmp_path: Path) -> None:
    """24 streams in a loop of 150 requests; after 30 are counted the engine is SIGKILLed; 3 requests
    are sent while it is down; then it is restarted on the same port and the loop goes on. Streams cut by
    the kill are ``truncated_stream`` (``unavailable`` if the engine had not sent their headers yet), requests
    meanwhile ``unavailable``, every other one ``success``:
    the same counts at the client and in ``requests_total``, and the engines' truth has every success (but
    those that ended as the engine was killed)."""
    port = free_port()
    truths = [tmp_path / "truth1.jsonl", tmp_path / "truth2.jsonl"]
    total, workers, while_down = 150, 24, 3
    sim = ServerProcess(["sim", "--port", str(port), "--truth-log", str(truths[0])]).start()
    restarted = ServerProcess(["sim", "--port", str(port), "--truth-log", str(truths[1])])
    engine_up = asyncio.Event()
    engine_up.set()
    tally: Counter[str] = Counter()
    try:
        async with clean_gateway(sim.url, read_timeout_s=HUNG_S) as gw:
            todo = itertools.count()

            async def worker(s: aiohttp.ClientSession) -> None:
                while next(todo) < total:
                    outcome = await stream(s, gw.url, 48)
                    tally["truncated_stream" if outcome == "cut" else outcome] += 1
                    if outcome != "success":
                        await engine_up.wait()  # the next one after the restart

            async def chaos(s: aiohttp.ClientSession) -> None:
                await wait_counted(gw, 30)
                engine_up.clear()
                assert sim.proc is not None
                os.killpg(sim.proc.pid, signal.SIGKILL)
                for _ in range(while_down):
                    tally[await stream(s, gw.url, 8)] += 1
                await asyncio.to_thread(restarted.start)  # the same port; ready when it prints its line
                engine_up.set()

            async with aiohttp.ClientSession() as s:
                await asyncio.gather(chaos(s), *(worker(s) for _ in range(workers)))
                await wait_counted(gw, total + while_down)
                assert await stream(s, gw.url, 8) == "success"  # served normally afterwards
                tally["success"] += 1
            assert gateway_outcomes(gw) == tally
            assert sum(tally.values()) == total + while_down + 1
            assert set(tally) <= {"success", "truncated_stream", "unavailable"}, tally
            # the streams in flight at the kill fail too: cut mid-stream (truncated_stream), or before the
            # engine sent their headers (unavailable: a loaded run had the engine still queueing all 24)
            assert tally["unavailable"] >= while_down, tally
            assert tally["truncated_stream"] + tally["unavailable"] > while_down, tally
            assert tally["success"] > 30
    finally:
        sim.stop()
        restarted.stop()
    # every success was an engine's: truth1 has the ones before the kill, truth2 the ones after. The sim
    # writes a request's truth just after its last byte, so a stream that ended at the very moment of the
    # kill reached the client without its truth line: at most one per worker
    engines = truth_outcomes(truths[0]) + truth_outcomes(truths[1])
    assert tally["success"] - workers <= engines["ok"] <= tally["success"], (engines, tally)


@pytest.mark.parametrize("read_timeout_s", [None, 1.0])
async def test_engine_stalls_mid_stream_for_many_requests(read_timeout_s: float | None) -> None:
    """32 streams at once go silent half-way (the sim's ``stall_mid_stream``). A stall shorter than the
    gateway's read timeout: every stream resumes and succeeds, and the stall is in its ITL sum. A stall longer
    than it: every stream is cut by the gateway, counted ``response_timeout``, and its engine request closed
    (the engine's truth says the client left)."""
    n = 32
    stall_ms = 1500 if read_timeout_s is None else 10_000  # 9 s more than the read timeout
    config: dict[str, Any] = {} if read_timeout_s is None else {"read_timeout_s": read_timeout_s}
    async with run_sim(speedup=20) as sim, clean_gateway(sim.url, **config) as gw:
        headers = {"x-servelens-fault": "stall_mid_stream", "x-servelens-fault-delay-ms": str(stall_ms)}
        async with aiohttp.ClientSession() as s:
            got = await asyncio.gather(*(stream(s, gw.url, 16, dict(headers, **{"x-request-id": f"stall-{i}"}))
                                         for i in range(n)))
            await wait_counted(gw, n)
            if read_timeout_s is None:
                assert got == ["success"] * n
                assert gateway_outcomes(gw) == {"success": n}
                # each stream's ITL values add up to its last chunk's time minus its first's, which holds the
                # stall (how it is shared out depends on how the tokens after it were read)
                itl_sum = value(samples(gw.metrics), gw.metrics.names.itl + "_sum", model="sim-model")
                assert itl_sum >= n * stall_ms / 1000
            else:
                assert got == ["cut"] * n
                assert gateway_outcomes(gw) == {"response_timeout": n}
                for i in range(n):  # the gateway closed each engine request: the sim sees it at its next write
                    truth = await sim.wait_truth(f"stall-{i}", timeout=HUNG_S)
                    assert truth.outcome == "cancelled"
            assert await stream(s, gw.url, 4) == "success"  # served normally afterwards
        assert gateway_outcomes(gw)["success"] == (n + 1 if read_timeout_s is None else 1)


async def test_storm_of_client_disconnects() -> None:
    """64 streams whose clients all leave after their second read: each counted ``cancelled`` once, each
    engine request stopped short of its tokens (the engine's truth), and the gateway serves normally."""
    n = 64
    async with run_sim() as sim, clean_gateway(sim.url) as gw:
        async with aiohttp.ClientSession() as s:
            got = await asyncio.gather(*(stream(s, gw.url, 400, {"x-request-id": f"gone-{i}"}, leave_after=2)
                                         for i in range(n)))
            assert got == ["cancelled"] * n
            await wait_counted(gw, n)
            truths = [await sim.wait_truth(f"gone-{i}", timeout=HUNG_S) for i in range(n)]
            assert {t.outcome for t in truths} == {"cancelled"}
            assert all(t.osl < 400 for t in truths)  # generation stopped after the client left
            assert gateway_outcomes(gw) == {"cancelled": n}
            assert value(samples(gw.metrics), gw.metrics.names.disconnected) == n
            assert await stream(s, gw.url, 8) == "success"  # served normally afterwards
        assert gateway_outcomes(gw) == {"cancelled": n, "success": 1}
