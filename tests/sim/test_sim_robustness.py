"""The simulated engine against hostile input and clients that go away."""

from __future__ import annotations

import json

import aiohttp
import pytest

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
