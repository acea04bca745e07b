"""A buffering proxy between the bench and the engine is noticed: Debian's nginx with only
``proxy_pass`` (its defaults: ``proxy_buffering on``, HTTP/1.0 upstream) makes the bench's chunk gaps
clump, and :func:`~servelens.core.clumping.detect_clumping` says so; the gateway's
``X-Accel-Buffering: no`` turns nginx's buffering off for its streams.

A test rather than a benchmark: what is asserted is a verdict on a shape (bursts of chunks read at
once against a steady 5 ms pace), which holds on a busy machine, and a regression of either the
header or the detector should fail CI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from servelens.bench.client import RequestSpec, send_request
from servelens.core.clumping import ClumpingReport, detect_clumping
from servelens.formats.results import BenchRecord
from servelens.gateway.testing import run_gateway, serve_app
from servelens.testing.nginx import PROXY_PASS_ONLY, run_nginx

pytestmark = pytest.mark.binaries("nginx")

CHUNKS = 60
PACE_S = 0.005  # the engine's decode step: 5 chunks per 25 ms, well above the 1 ms near-zero bound
STREAMS = 3


async def paced(request: web.Request) -> web.StreamResponse:
    """An engine streaming one token every PACE_S, with cumulative usage on every chunk."""
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(CHUNKS):
        choice = {"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": "length" if i == CHUNKS - 1 else None}
        body = {"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [choice],
                "usage": {"prompt_tokens": 5, "completion_tokens": i + 1, "total_tokens": i + 6}}
        await resp.write(b"data: " + json.dumps(body).encode() + b"\n\n")
        await asyncio.sleep(PACE_S)  # the engine's pace, not a test wait
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def models(_: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", paced)
    app.router.add_get("/v1/models", models)
    async with serve_app(app) as url:
        yield url


async def bench(url: str) -> ClumpingReport:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "max_tokens": CHUNKS, "stream_options": {"include_usage": True,
                                                                "continuous_usage_stats": True}}).encode()
    async with aiohttp.ClientSession() as session:
        recs: list[BenchRecord] = await asyncio.gather(*(
            send_request(session, f"{url}/v1/chat/completions", RequestSpec(i, 0, 5, CHUNKS, body))
            for i in range(STREAMS)))
    assert all(r.ok and len(r.chunk_offsets_ns) == CHUNKS for r in recs), [r.error for r in recs]
    return detect_clumping(r.chunk_offsets_ns for r in recs)


async def test_nginx_defaults_in_front_of_an_engine_clump_tokens_and_the_bench_warns(engine: str) -> None:
    direct = await bench(engine)
    assert not direct.clumped, direct
    with run_nginx(engine, PROXY_PASS_ONLY) as ngx:
        behind = await bench(ngx.url)
    assert behind.clumped, behind
    assert "WARNING" in behind.line()


async def test_nginx_defaults_in_front_of_the_gateway_do_not_buffer_its_streams(engine: str) -> None:
    async with run_gateway(engine) as gw:
        with run_nginx(gw.url, PROXY_PASS_ONLY) as ngx:
            report = await bench(ngx.url)
    assert not report.clumped, report


async def test_the_bench_prints_the_warning_and_records_the_verdict(engine: str) -> None:
    import io

    from rich.console import Console

    from servelens.bench import BenchConfig, print_result, run_bench

    def printed(res: object) -> str:
        buf = io.StringIO()
        print_result(res, Console(file=buf, width=200, color_system=None))  # type: ignore[arg-type]
        # words only: a title with more marks (a lagging client's, on a busy machine) wraps over lines
        return " ".join(buf.getvalue().split())

    cfg = dict(isl="20", osl=str(CHUNKS), num_requests=STREAMS, concurrency=STREAMS, seed=1)
    with run_nginx(engine, PROXY_PASS_ONLY) as ngx:
        behind = await run_bench(BenchConfig(url=ngx.url, **cfg))  # type: ignore[arg-type]
    assert behind.errors == 0 and behind.summary["token_clumping"]["clumped"] is True
    out = printed(behind)
    assert "WARNING: tokens arrive in clumps" in out and "A PROXY BUFFERS THE STREAM" in out
    direct = await run_bench(BenchConfig(url=engine, **cfg))  # type: ignore[arg-type]
    assert direct.summary["token_clumping"]["clumped"] is False
    assert "clumps" not in printed(direct)
