"""``servelens eval run`` stopped by SIGTERM or Ctrl-C mid-run, against the simulated engine: one line
saying how many items were done, a non-zero exit, no traceback; the same command again sends exactly
the missing items."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from servelens.eval.records import read_run
from servelens.eval.suites import answer_key, read_text_suite
from servelens.sim.testing import run_sim

N_ITEMS = 12
HELD_AT = 5  # the 6th request is held: 5 items are done when the signal comes
WAIT_S = 60.0


@dataclass
class Holder:
    """A proxy in front of the sim that holds request number ``hold_at + 1`` until the test is done
    (``held`` is set when it arrives); ``forwarded`` are the last user messages it passed on."""

    url: str = ""
    hold_at: int | None = HELD_AT
    held: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    forwarded: list[str] = field(default_factory=list)
    seen: int = 0


@asynccontextmanager
async def holding_proxy(upstream: str) -> AsyncIterator[Holder]:
    h = Holder()

    async def models(_: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as s, s.get(upstream + "/v1/models") as r:
            return web.json_response(await r.json())

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        h.seen += 1
        if h.hold_at is not None and h.seen == h.hold_at + 1:
            h.held.set()
            await h.release.wait()
            return web.json_response({"error": {"message": "released", "code": 503}}, status=503)
        h.forwarded.append(body["messages"][-1]["content"])
        async with aiohttp.ClientSession() as s, s.post(upstream + "/v1/chat/completions", json=body) as r:
            return web.json_response(await r.json(), status=r.status)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    h.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield h
    finally:
        h.release.set()
        await runner.cleanup()


def _key(tmp_path: Path) -> Path:
    path = tmp_path / "gsm8k-key.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in answer_key("gsm8k", read_text_suite("gsm8k", None))))
    return path


async def _eval_run(url: str, out: Path) -> asyncio.subprocess.Process:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "servelens", "eval", "run", "--url", url, "--suite", "gsm8k", "--limit",
        str(N_ITEMS), "--concurrency", "1", "--output-dir", str(out), "--no-progress", "--retries", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_stops_the_run_in_one_line_and_a_rerun_sends_exactly_the_missing_items(
    tmp_path: Path, sig: signal.Signals
) -> None:
    out = tmp_path / "out"
    items = read_text_suite("gsm8k", None)[:N_ITEMS]
    async with run_sim(answer_key=str(_key(tmp_path)), answer_accuracy=0.7, seed=2) as sim, \
            holding_proxy(sim.url) as proxy:  # fmt: skip
        proc = await _eval_run(proxy.url, out)
        try:
            async with asyncio.timeout(WAIT_S):
                await proxy.held.wait()  # 5 answered and recorded, the 6th in flight
            proc.send_signal(sig)
            async with asyncio.timeout(WAIT_S):
                stdout, stderr = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 128 + int(sig)
        err = stderr.decode()
        which = "" if sig == signal.SIGINT else f" ({sig.name})"
        cache = out / "gsm8k" / "cache.jsonl"
        assert err == (f"servelens: interrupted{which}: {HELD_AT} of {N_ITEMS} items done, their answers cached "
                       f"in {cache}; run the same command again to send only the missing {N_ITEMS - HELD_AT}\n")
        assert "Traceback" not in stdout.decode()
        assert len(cache.read_text().splitlines()) == HELD_AT
        first = [items[i].messages[-1]["content"] for i in range(HELD_AT)]
        assert proxy.forwarded == first

        proxy.hold_at = None  # the same command again: exactly the missing items go out
        proxy.forwarded.clear()
        proc = await _eval_run(proxy.url, out)
        async with asyncio.timeout(WAIT_S):
            stdout, stderr = await proc.communicate()
        assert proc.returncode == 0, stderr.decode()
    assert sorted(proxy.forwarded) == sorted(items[i].messages[-1]["content"] for i in range(HELD_AT, N_ITEMS))
    run = read_run(out / "gsm8k")
    assert [r.item for r in run.records] == [f"gsm8k/{i}" for i in range(N_ITEMS)]
    assert sum(r.cached for r in run.records) == HELD_AT and all(r.error is None for r in run.records)
