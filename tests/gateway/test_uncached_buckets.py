"""The gateway's opt-in buckets by uncached prompt tokens, through the scripted upstream (whose usage
carries ``prompt_tokens_details.cached_tokens`` on the final usage chunk only, as vLLM's does)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from servelens.cli.gateway import config_from_args
from servelens.cli.main import build_parser
from servelens.gateway.config import GatewayConfig
from servelens.gateway.testing import FAKE_MODEL, ScriptedUpstream, run_gateway, samples, value


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stream": True, **extra}


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with http.post(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"}) as r:
        await r.read()
        return r.status


@pytest.mark.parametrize("continuous", ["on", "off"])
async def test_counts_and_buckets_from_known_usage(fake: ScriptedUpstream, http: aiohttp.ClientSession,
                                                   continuous: str) -> None:
    async with run_gateway(fake.url, uncached_buckets="512,1024,2048,4096,8192,16384",
                           continuous_usage=continuous) as gw:
        n = gw.metrics.names
        for prompt, cached in ((3000, 2900), (3000, 0), (700, None), (20000, 19000)):
            fake.prompt_tokens, fake.cached_tokens = prompt, cached
            assert await post(http, gw.url, chat()) == 200
        await gw.gateway.wait_finished(4)
        s = samples(gw.metrics)

        def ucount(bucket: str) -> float:
            return value(s, n.ttft_by_uncached + "_count", model=FAKE_MODEL, uncached_bucket=bucket)

        # 3000-2900 = 100 -> 0-512; 3000-0 -> 2049-4096; 20000-19000 = 1000 -> 513-1024; no cached: none
        assert [ucount(b) for b in ("0-512", "513-1024", "1025-2048", "2049-4096", "16385+")] == [1, 1, 0, 1, 0]
        assert value(s, n.duration_by_uncached + "_count", model=FAKE_MODEL, uncached_bucket="2049-4096") == 1
        for src, want in (("final_usage", 3), ("no_cached_tokens", 1), ("first_chunk_usage", 0), ("unknown", 0)):
            assert value(s, n.uncached_assignments, model=FAKE_MODEL, source=src) == want
        # the ISL buckets are untouched: both 3000-token prompts in 2049-4096
        assert value(s, n.ttft_by_isl + "_count", model=FAKE_MODEL, isl_bucket="2049-4096") == 2
        # the hit ratio's parts per ISL bucket: 2,900 cached of 6,000 prompt tokens in 2049-4096
        assert value(s, n.cached_by_isl + "_sum", model=FAKE_MODEL, isl_bucket="2049-4096") == 2900
        assert value(s, n.prompt_tokens_by_isl, model=FAKE_MODEL, isl_bucket="2049-4096") == 6000
        # the request without cached tokens is in no prompt-token sum (unknown, not a miss)
        assert value(s, n.prompt_tokens_by_isl, model=FAKE_MODEL, isl_bucket="513-1024") == 0
        assert value(s, n.prompt_tokens_by_isl, model=FAKE_MODEL, isl_bucket="16385+") == 20000


async def test_off_by_default_nothing_registered(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    assert GatewayConfig(upstream="http://127.0.0.1:1").uncached_buckets is None
    async with run_gateway(fake.url) as gw:
        assert gw.metrics.uncached_buckets is None
        assert gw.metrics.state.models[FAKE_MODEL].by_uncached is None
        await post(http, gw.url, chat())
        await gw.gateway.wait_finished(1)
        text = gw.metrics.exposition().decode()
    assert "uncached" not in text
    assert "servelens_prompt_tokens_by_isl_total" in text  # part of the by-ISL families


async def test_sidecar_with_dynamo_prefix_exports_them(fake: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    async with run_gateway(fake.url, by_isl_only=True, metrics_prefix="dynamo_frontend",
                           uncached_buckets="1024") as gw:
        await post(http, gw.url, chat())
        await gw.gateway.wait_finished(1)
        async with http.get(gw.url + "/metrics") as r:
            text = await r.text()
    assert 'dynamo_frontend_time_to_first_token_by_uncached_seconds_count{model="fake-model",' \
           'uncached_bucket="0-1024"} 1.0' in text
    assert 'dynamo_frontend_uncached_bucket_assignments_total{model="fake-model",source="final_usage"} 1.0' in text
    assert "dynamo_frontend_time_to_first_token_seconds" not in text


def test_cli_flag_and_config_file(tmp_path: Path) -> None:
    parser = build_parser()
    cfg = config_from_args(parser.parse_args(["gateway", "--upstream", "http://127.0.0.1:1",
                                              "--uncached-buckets", "256,4096"]))
    assert cfg.uncached_buckets == "256,4096"
    f = tmp_path / "gw.yaml"
    f.write_text("upstream: http://127.0.0.1:1\nuncached_buckets: [512, 2048]\n")
    cfg = config_from_args(parser.parse_args(["gateway", "--config", str(f)]))
    assert cfg.uncached_buckets == "512,2048"
    f.write_text("upstream: http://127.0.0.1:1\nuncached_buckets: off\n")
    assert config_from_args(parser.parse_args(["gateway", "--config", str(f)])).uncached_buckets is None
    with pytest.raises(ValueError, match="uncached_buckets: ISL bucket boundaries must be strictly increasing"):
        GatewayConfig(upstream="http://127.0.0.1:1", uncached_buckets="512,256")
    with pytest.raises(ValueError, match="uncached_buckets: at most 32"):
        GatewayConfig.from_mapping({"upstream": "http://127.0.0.1:1", "uncached_buckets": list(range(1, 34))})
