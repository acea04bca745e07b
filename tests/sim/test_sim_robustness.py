"""The simulated engine against hostile input and clients that go away."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest

from servelens.sim import writer as sim_writer
from servelens.sim.testing import run_sim

DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize"])
async def test_body_nested_too_deep_is_400(path: str) -> None:
    async with run_sim(speedup=50) as sim, aiohttp.ClientSession() as s, s.post(sim.url + path, data=DEEP) as r:
        assert r.status == 400
        err = json.loads(await r.read())["error"]
        assert set(err) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize"])
async def test_token_id_beyond_int64_is_400(path: str) -> None:
    body = {"model": "sim-model", "prompt": [1, 2**63], "max_tokens": 2}
    async with run_sim(speedup=50) as sim, aiohttp.ClientSession() as s, \
            s.post(sim.url + path, json=body) as r:
        assert r.status == 400
        assert "token ids must be in [0, " in json.loads(await r.read())["error"]["message"]


async def test_unknown_model_with_a_lone_surrogate_is_an_openai_404() -> None:
    # the 404 echoes the name; it was a 500 in aiohttp's text (the error body could not be encoded)
    async with run_sim(speedup=50) as sim, aiohttp.ClientSession() as s, \
            s.post(sim.url + "/v1/chat/completions", data=b'{"model":"\\ud800","messages":[]}') as r:
        assert r.status == 404
        err = json.loads(await r.read())["error"]
        assert set(err) == {"message", "type", "param", "code"} and "\ud800" in err["message"]


async def test_client_gone_during_a_write_is_cancelled_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # a write to a connection the client already closed raises ConnectionResetError before aiohttp
    # cancels the handler (seen under load on the final usage/[DONE] writes)
    real_event = sim_writer.SSEWriter.event
    calls = 0

    async def event(self: sim_writer.SSEWriter, payload: bytes, last: bool = False) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        await real_event(self, payload, last)

    monkeypatch.setattr(sim_writer.SSEWriter, "event", event)
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "stream": True, "ignore_eos": True}
    caplog.set_level(logging.ERROR, logger="aiohttp.server")
    async with run_sim(speedup=50) as sim, aiohttp.ClientSession() as s:
        async with s.post(sim.url + "/v1/chat/completions", json=body, headers={"x-request-id": "gone"}) as r:
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
        rec = await sim.wait_truth("gone")
        assert rec.outcome == "cancelled"
    assert not [r for r in caplog.records if r.name == "aiohttp.server"], "handler error logged"


@pytest.mark.parametrize(("headers", "param"), [({"x-servelens-fault": "nope"}, "x-servelens-fault"),
                                                ({"x-servelens-fault-delay-ms": "soon"}, "x-servelens-fault-delay-ms"),
                                                ({"x-servelens-fault-delay-ms": "-1"}, "x-servelens-fault-delay-ms")])
async def test_bad_fault_header_names_that_header(headers: dict[str, str], param: str) -> None:
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 2}
    async with run_sim(speedup=50) as sim, aiohttp.ClientSession() as s, \
            s.post(sim.url + "/v1/completions", json=body, headers=headers) as r:
        assert r.status == 400
        assert json.loads(await r.read())["error"]["param"] == param


async def test_body_that_cannot_be_decoded_is_400(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="aiohttp.server")
    body = json.dumps({"model": "sim-model", "prompt": "hi", "max_tokens": 2}).encode()
    async with run_sim(speedup=50) as sim, aiohttp.ClientSession() as s, \
            s.post(sim.url + "/v1/completions", data=body, headers={"Content-Encoding": "gzip"}) as r:
        assert r.status == 400
        assert "content-encoding" in json.loads(await r.read())["error"]["message"].lower()
    assert not [r for r in caplog.records if r.name == "aiohttp.server"], "error logged"
