"""``GET /metrics`` at any size without stalling the relay: formatted in slices with the loop turning
between them, gzip as Prometheus asks for it (compressed off the loop), and the metrics listener."""

from __future__ import annotations

import asyncio
import gzip
import socket
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from servelens.cli.gateway import config_from_args
from servelens.cli.main import build_parser, main
from servelens.gateway import scrape as scrape_module
from servelens.gateway.config import GatewayConfig
from servelens.gateway.scrape import SLICE_BYTES, accepts_gzip
from servelens.gateway.server import start_gateway, startup_summary
from servelens.gateway.testing import FAKE_MODEL, ScriptedUpstream, run_gateway, value
from servelens.process import ServerProcess, free_port
from servelens.prometheus import FrontendMetrics
from servelens.prometheus.parse import parse_exposition
from servelens.testing.exporter import many_series_metrics

T = TypeVar("T")
PLAIN = {"Accept-Encoding": "identity"}


def collector_text(m: FrontendMetrics) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(m.collector)
    return generate_latest(reg)


async def turns_while(work: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """``work()``'s result and how many times the loop ran another task while it was awaited."""
    turns = 0
    done = False

    async def heartbeat() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)
    start = turns
    try:
        result = await work()
    finally:
        done = True
        await beat
    return result, turns - start


async def test_a_large_scrape_lets_the_loop_turn_between_slices(fake: ScriptedUpstream,
                                                                http: aiohttp.ClientSession) -> None:
    metrics = many_series_metrics()  # 10 models x 33 buckets x ~140 edges: ~107,000 lines, 11 MB
    async with run_gateway(fake.url, metrics=metrics) as gw:
        async def headers() -> aiohttp.ClientResponse:  # the handler has formatted everything by then
            return await http.get(gw.url + "/metrics", headers=PLAIN)

        resp, turns = await turns_while(headers)
        body = await resp.read()
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        # the text was formatted with a turn of the loop after every SLICE_BYTES of it (and every
        # model's copy), where one call formatting it all let the loop turn a handful of times
        assert len(body) > 80 * SLICE_BYTES
        assert turns >= len(body) // SLICE_BYTES + 10
        # what prometheus_client writes, byte for byte (then the gateway's connection metrics)
        assert body == collector_text(metrics) + metrics.added_exposition()
        assert b"servelens_gateway_max_connections " in metrics.added_exposition()


async def test_gzip_when_asked_compressed_off_the_loop(fake: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    threads: list[int] = []
    real = scrape_module.gzip_parts

    def recorded(*args: Any) -> bytes:
        threads.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(scrape_module, "gzip_parts", recorded)
    async with run_gateway(fake.url) as gw, aiohttp.ClientSession(auto_decompress=False) as raw:
        async with raw.get(gw.url + "/metrics", headers=PLAIN) as r:
            plain = await r.read()
            assert "Content-Encoding" not in r.headers and threads == []
        async with raw.get(gw.url + "/metrics", headers={"Accept-Encoding": "gzip"}) as r:  # as Prometheus
            assert r.headers["Content-Encoding"] == "gzip" and r.headers["Vary"] == "Accept-Encoding"
            packed = await r.read()
            assert int(r.headers["Content-Length"]) == len(packed) < len(plain) / 4
        assert gzip.decompress(packed) == plain
        assert threads and threading.get_ident() not in threads  # compressed in a worker thread
        async with raw.get(gw.url + "/metrics", headers={"Accept-Encoding": "gzip;q=0, identity"}) as r:
            assert "Content-Encoding" not in r.headers and await r.read() == plain
        async with raw.head(gw.url + "/metrics", headers=PLAIN) as r:
            assert r.status == 200 and int(r.headers["Content-Length"]) == len(plain)
            assert await r.read() == b""


@pytest.mark.parametrize(("header", "gz"), [
    ("gzip", True), ("GZIP", True), ("deflate, gzip;q=1.0, *;q=0.5", True), ("x-gzip", True), ("*", True),
    ("", False), ("identity", False), ("deflate, br", False), ("gzip;q=0", False), ("*, gzip;q=0", False),
    ("gzip;q=0.000", False), ("gzip;q=bad", False), ("gzipx", False), ("*;q=0", False),
])
def test_accept_encoding(header: str, gz: bool) -> None:
    assert accepts_gzip(header) is gz


async def test_metrics_listener_serves_metrics_and_the_api_port_does_not(fake: ScriptedUpstream,
                                                                         http: aiohttp.ClientSession) -> None:
    async with run_gateway(fake.url, metrics_port=0) as gw:
        assert gw.metrics_url.endswith("/metrics") and not gw.metrics_url.startswith(gw.url)
        body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with http.post(gw.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
        await gw.gateway.wait_finished(1)
        async with http.get(gw.metrics_url) as r:
            assert r.status == 200
            s = parse_exposition(await r.text())
        assert value(s, gw.metrics.names.requests, endpoint="chat_completions", error_type="", model=FAKE_MODEL,
                     request_type="unary", status="success") == 1
        async with http.get(gw.url + "/metrics") as r:  # not on the API port, nor relayed to the engine
            assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
        assert not any(req.path == "/metrics" for req in fake.requests)
        for path in ("/health", "/v1/models", "/"):  # the listener serves /metrics alone
            async with http.get(gw.metrics_url.removesuffix("/metrics") + path) as r:
                assert r.status == 404
        async with http.get(gw.url + "/health") as r:
            assert r.status == 200


def parse(*argv: str) -> GatewayConfig:
    return config_from_args(build_parser().parse_args(["gateway", *argv]))


def test_metrics_port_flags_and_config_file(tmp_path: Path) -> None:
    cfg = parse("--upstream", "http://h:1", "--metrics-port", "9100", "--metrics-host", "0.0.0.0")
    assert (cfg.metrics_port, cfg.metrics_host, cfg.port) == (9100, "0.0.0.0", 8080)
    assert parse("--upstream", "http://h:1").metrics_port is None
    f = tmp_path / "gw.yaml"
    f.write_text("upstream: http://h:1\nmetrics-port: 9100\n")
    assert parse("--config", str(f)).metrics_port == 9100
    assert parse("--config", str(f), "--metrics-port", "9200").metrics_port == 9200


@pytest.mark.parametrize(("argv", "message"), [
    (["--port", "9100", "--metrics-port", "9100"], "metrics_port must differ from port (9100)"),
    (["--metrics-port", "70000"], "metrics_port must be 0..65535"),
    (["--metrics-host", "127.0.0.1"], "metrics_host needs metrics_port"),
])
def test_bad_metrics_listener_settings_are_one_line(argv: list[str], message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", "--upstream", "http://127.0.0.1:9", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servelens: error: ") and message in err and err.count("\n") == 1


def test_metrics_port_of_the_wrong_type_in_the_config_file(tmp_path: Path) -> None:
    f = tmp_path / "gw.yaml"
    f.write_text("upstream: http://h:1\nmetrics_port: nine\n")
    with pytest.raises(ValueError, match="metrics_port must be an integer, got 'nine'"):
        parse("--config", str(f))


def test_metrics_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["gateway", "--upstream", "http://127.0.0.1:9", "--port", "0", "--metrics-port", str(port)]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"servelens: error: cannot listen on 127.0.0.1:{port}: ") and "in use" in last


async def test_cli_serves_metrics_on_the_metrics_port() -> None:
    port = free_port()
    with ServerProcess(["gateway", "--upstream", "http://127.0.0.1:9", "--model", "m",
                        "--metrics-port", str(port)]) as gw:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                assert r.status == 200 and 'servelens_inflight_requests{model="m"} 0.0' in await r.text()
            async with s.get(gw.url + "/metrics") as r:
                assert r.status == 404


async def test_startup_summary_says_where_the_metrics_are() -> None:
    cfg = GatewayConfig.from_mapping({"upstream": "http://127.0.0.1:9", "models": ["m"], "metrics_port": 0})
    running = await start_gateway(cfg)
    try:
        assert running.metrics_listener is not None
        line = startup_summary(running)
    finally:
        await running.close()
    assert f"; metrics servelens_* at http://127.0.0.1:{running.metrics_listener.port}/metrics, " in line
