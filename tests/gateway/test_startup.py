"""The gateway's start-up line on stderr: where it sends requests and what it will export."""

from __future__ import annotations

from servelens.gateway.config import GatewayConfig
from servelens.gateway.server import start_gateway, startup_summary
from servelens.sim.testing import run_sim


async def test_startup_summary_names_upstream_models_buckets_and_prefix() -> None:
    async with run_sim() as sim:
        cfg = GatewayConfig.from_mapping({"upstream": sim.url, "host": "127.0.0.1", "port": 0,
                                          "isl_buckets": "512,1024", "metrics_prefix": "dynamo_frontend"})
        running = await start_gateway(cfg)
        try:
            line = startup_summary(running)
            assert running.guard is not None
            b = running.guard.budget
        finally:
            await running.close()
    assert line == (f"servelens gateway: upstream {sim.url}; models sim-model; ISL buckets 0-512, 513-1024, 1025+; "
                    "metrics dynamo_frontend_*, 18 TTFT, 20 ITL and 10 duration le edges, 364 series per model, "
                    "at most 64 models; "
                    f"open files {b.soft} (hard {b.hard}): up to {b.max_connections} streams")
    assert b.max_connections == (b.soft - b.at_start - 64) // 2
    assert "\n" not in line
    # servelens' names: the fine edges, and the model cap the series budget leaves (7 ISL buckets)
    async with run_sim() as sim:
        running = await start_gateway(GatewayConfig(upstream=sim.url))
        try:
            line = startup_summary(running)
        finally:
            await running.close()
    assert ("metrics servelens_*, 140 TTFT, 134 ITL and 130 duration le edges, 3,556 series per model, at most 14 "
            "models; ") in line


async def test_startup_summary_before_the_upstream_answers() -> None:
    cfg = GatewayConfig.from_mapping({"upstream": "http://127.0.0.1:9", "host": "127.0.0.1", "port": 0,
                                      "isl_buckets": "off", "connect_timeout_s": 0.5})
    running = await start_gateway(cfg)
    try:
        line = startup_summary(running)
    finally:
        await running.close()
    assert "models none yet (polling /v1/models)" in line and "ISL buckets off" in line


def test_credentials_in_upstream_urls_are_never_shown() -> None:
    from servelens.gateway.upstream import redacted_url

    assert redacted_url("http://svc:s3cret@127.0.0.1:8000/v1") == "http://svc:***@127.0.0.1:8000/v1"
    assert redacted_url("https://token@engine:443") == "https://token@engine:443"  # a user name alone stays
    assert redacted_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"


async def test_ready_and_startup_line_hide_the_upstream_password() -> None:
    import aiohttp

    async with run_sim() as sim:
        url = sim.url.replace("http://", "http://svc:s3cret@")
        cfg = GatewayConfig.from_mapping({"upstream": url, "host": "127.0.0.1", "port": 0})
        running = await start_gateway(cfg)
        try:
            assert "s3cret" not in startup_summary(running) and "svc:***@" in startup_summary(running)
            async with aiohttp.ClientSession() as s, s.get(running.url + "/ready") as r:
                text = await r.text()
            assert r.status == 200 and "s3cret" not in text and "svc:***@" in text
        finally:
            await running.close()


async def test_a_gateway_started_before_its_engine_serves_as_soon_as_the_engine_answers() -> None:
    """No ``502 cannot list its models`` window once the upstream answers: a request while the latest
    poll failed polls again (the rate limit on re-polls applies only while the upstream answers)."""
    import aiohttp

    from servelens.gateway.testing import FAKE_MODEL, run_gateway, run_scripted_upstream
    from servelens.process import free_port

    port = free_port()
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 2}
    # no periodic refresh, and a re-poll limit far longer than the test: only requests make polls
    async with run_gateway(f"http://127.0.0.1:{port}", models_refresh_s=0, repoll_min_interval_s=3600,
                           connect_timeout_s=2) as gw, aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 502 and (await r.json())["error"]["code"] == "upstream_unavailable"
        async with run_scripted_upstream(port=port) as up:  # the engine comes up
            async with http.get(gw.url + "/v1/models") as r:
                assert r.status == 200
            async with http.post(gw.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()
                assert b"[DONE]" in await r.read()
            assert len(up.completions()) == 1


async def test_a_request_does_not_take_the_answer_of_a_poll_that_started_before_it() -> None:
    """A model-list poll in flight when the engine comes up fails; the request that arrived meanwhile
    polls again instead of answering 502."""
    import asyncio

    import aiohttp

    from servelens.gateway.testing import FAKE_MODEL, raw_tcp_server, read_http_request, run_gateway

    up_first = asyncio.Event()  # the first /v1/models request reached the engine
    release = asyncio.Event()
    lists = [0]

    async def engine(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head, _ = await read_http_request(r)
            if head.startswith(b"GET /v1/models"):
                lists[0] += 1
                if lists[0] == 2:  # the poll at start succeeded; the second one is in flight...
                    up_first.set()
                    await release.wait()
                    w.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")  # ...and fails
                    await w.drain()
                    continue
                data = b'{"object":"list","data":[{"id":"other"}]}' if lists[0] == 1 else (
                    b'{"object":"list","data":[{"id":"%s"}]}' % FAKE_MODEL.encode())
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(data), data))
                await w.drain()
            else:
                text = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}\n\n'
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(text), text))
                await w.drain()

    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with raw_tcp_server(engine) as (port, _), run_gateway(
        f"http://127.0.0.1:{port}", models_refresh_s=0, repoll_min_interval_s=0
    ) as gw, aiohttp.ClientSession() as http:
        first = asyncio.create_task(http.post(gw.url + "/v1/chat/completions", json=body))
        await up_first.wait()  # its poll is in flight
        second = asyncio.create_task(http.post(gw.url + "/v1/chat/completions", json=body))
        while not gw.gateway.router._poll_lock._waiters:  # the second request waits on that poll
            await asyncio.sleep(0)
        release.set()
        r1, r2 = await first, await second
        assert r1.status == 502  # its own poll failed
        assert r2.status == 200, await r2.text()  # not the failed poll's answer: it polled again
        assert lists[0] == 3
        r1.close()
        r2.close()
