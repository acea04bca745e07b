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
            except ConnectionRefusedError:
                return
            w.close()
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["TERM-TERM", "TERM-INT"])
async def test_a_second_signal_during_the_drain_cuts_now_and_counts(fake: ScriptedUpstream, tmp_path: Path,
                                                                    second: signal.Signals) -> None:
    """SIGTERM, then (while the drain waits for a stream that would run for ever, with a 600 s shutdown
    timeout) SIGTERM or SIGINT again: the stream is cut at once and counted cancelled, one line says so,
    no traceback, exit 0 (was: killed by the second SIGTERM, the stream never counted; or
    'servelens: interrupted', exit 130, sometimes a traceback)."""
    fake.hold = asyncio.Event()  # never set: the stream stays open after its first content chunk
    log, out = tmp_path / "req.jsonl", tmp_path / "out.txt"
    gw = ServerProcess(["gateway", "--upstream", fake.url, "--request-log", str(log), "--shutdown-timeout", "600"],
                       log_path=out).start()
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
    lines = [ln for ln in text.splitlines() if "second signal" in ln]
    assert len(lines) == 1 and "1 request(s) in flight" in lines[0], text
    assert json.dumps(entry)
