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
        finally:
            await running.close()
    assert line == (f"servelens gateway: upstream {sim.url}; models sim-model; ISL buckets 0-512, 513-1024, 1025+; "
                    "metrics dynamo_frontend_*")
    assert "\n" not in line


async def test_startup_summary_before_the_upstream_answers() -> None:
    cfg = GatewayConfig.from_mapping({"upstream": "http://127.0.0.1:9", "host": "127.0.0.1", "port": 0,
                                      "isl_buckets": "", "connect_timeout_s": 0.5})
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
