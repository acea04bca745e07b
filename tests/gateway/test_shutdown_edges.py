"""Stopping a gateway while requests are in flight: a second signal during the drain, and connections that
were idle when the drain began. Counts and exit statuses, never timing."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp
import pytest

from servelens.gateway.requestlog import read_request_log
from servelens.gateway.testing import FAKE_MODEL, ScriptedUpstream
from servelens.process import ServerProcess

BODY = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}


async def _refused(port: int) -> None:
    """Until the gateway stopped listening (it is draining): polled, another process's state, with a
    bound for a hung test."""
    async with asyncio.timeout(30):
        while True:
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
            except (ConnectionRefusedError, ConnectionResetError):  # reset: it closed with ours in its backlog
                return
            w.close()
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers-2"])
@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["TERM-TERM", "TERM-INT"])
async def test_a_second_signal_during_the_drain_cuts_now_and_counts(fake: ScriptedUpstream, tmp_path: Path,
                                                                    second: signal.Signals, workers: int) -> None:
    """SIGTERM, then (while the drain waits for a stream that would run for ever, with a 600 s shutdown
    timeout) SIGTERM or SIGINT again: the stream is cut at once and counted cancelled, one line says so,
    no traceback, exit 0 (was: killed by the second SIGTERM, the stream never counted; or
    'servelens: interrupted', exit 130, sometimes a traceback)."""
    fake.hold = asyncio.Event()  # never set: the stream stays open after its first content chunk
    log, out = tmp_path / "req.jsonl", tmp_path / "out.txt"
    gw = ServerProcess(["gateway", "--upstream", fake.url, "--request-log", str(log), "--shutdown-timeout", "600",
                        "--workers", str(workers)], log_path=out).start()  # with 2: the supervisor passes it on
    try:
        port = int(gw.url.rsplit(":", 1)[1])
        async with aiohttp.ClientSession() as http:
            resp = await http.post(gw.url + "/v1/chat/completions", json=BODY)
            assert resp.status == 200
            await resp.content.readuntil(b"\n\n")
            await resp.content.readuntil(b"\n\n")  # the role chunk, then the first content chunk
            assert gw.proc is not None
            gw.proc.send_signal(signal.SIGTERM)
            await _refused(port)  # draining: the stream holds it
            gw.proc.send_signal(second)
            assert await asyncio.to_thread(gw.proc.wait, 30) == 0  # a bound for a hung test, not a figure
            with pytest.raises(aiohttp.ClientPayloadError):  # the stream was cut
                await resp.read()
    finally:
        gw.stop()
    (entry,) = read_request_log(log)
    assert (entry["status"], entry["error_type"]) == ("error", "cancelled")
    text = out.read_text()
    assert "Traceback" not in text and "interrupted" not in text
    lines = [ln for ln in text.splitlines() if "second signal" in ln and "1 request(s) in flight" in ln]
    assert len(lines) == 1, text  # the worker that held the stream (another one may say it held none)
    assert json.dumps(entry)


async def _answer(r: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One whole HTTP/1.1 answer with a Content-Length body: (head, body)."""
    head = await r.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length:"))
    return head, await r.readexactly(length)


def _unary(keep: bool = True) -> bytes:
    body = json.dumps({**BODY, "stream": False}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%b\r\n%b" % (len(body), b"" if keep else b"Connection: close\r\n", body))


async def test_a_request_sent_on_an_idle_connection_as_the_drain_begins_is_answered(
        fake: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """A keep-alive connection is idle when the drain begins; its client sends its next request on it then
    (as an HTTP client pool does). It is answered, with Connection: close, and counted (was: the idle
    connection closed at once, the request lost at the client, 'Can not write request body', and in no
    requests_total). The grace is made long here so that only the connection's own close ends it."""
    from servelens.gateway import server as server_module
    from servelens.gateway.config import GatewayConfig
    from servelens.gateway.server import start_gateway
    from servelens.gateway.testing import requests_total

    monkeypatch.setattr(server_module, "IDLE_GRACE_S", 30.0)
    running = await start_gateway(GatewayConfig(upstream=fake.url, host="127.0.0.1", port=0, shutdown_timeout_s=30))
    draining = asyncio.Event()
    drain = running.gateway.drain

    async def spied_drain(timeout: float) -> bool:
        draining.set()
        return await drain(timeout)

    monkeypatch.setattr(running.gateway, "drain", spied_drain)
    r, w = await asyncio.open_connection("127.0.0.1", running.port)
    try:
        w.write(_unary())
        head, _ = await _answer(r)
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()  # kept alive
        closing = asyncio.create_task(running.close())
        async with asyncio.timeout(30):  # a bound for a hung test, not a figure
            await draining.wait()  # the gateway stopped listening and drains
            w.write(_unary())  # the next request on the idle connection
            head, body = await _answer(r)
            assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower()
            assert json.loads(body)["object"] == "chat.completion"
            assert await r.read() == b""  # then the gateway closes it
            await closing  # and, no connection left, the grace ends
    finally:
        w.close()
    assert requests_total(running.metrics, status="success") == 2 and requests_total(running.metrics) == 2
