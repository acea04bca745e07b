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
