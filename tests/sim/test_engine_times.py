"""The sim reports each request's queue and prefill time (vLLM's definitions): in its truth log,
which formats.engine_log reads and joins to bench results, and as vLLM-named histograms."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from servelens.formats.engine_log import capacity_samples, load_engine_times
from servelens.formats.results import BenchRecord
from servelens.sim.testing import run_sim
from servelens.sim.tokenizer import make_text


async def test_truth_log_and_metrics_carry_queue_and_prefill_time(tmp_path: Path) -> None:
    log = tmp_path / "truth.jsonl"
    async with run_sim(model="m1", truth_log=str(log)) as sim, aiohttp.ClientSession() as s:
        async with s.post(sim.url + "/v1/completions",
                          json={"model": "m1", "prompt": make_text(300, 1), "max_tokens": 3, "ignore_eos": True}) as r:
            rid = r.headers["x-request-id"]
            await r.read()
        rec = await sim.wait_truth(rid)
        async with s.get(sim.url + "/metrics") as r:
            text = await r.text()
    assert rec.queue_ns is not None and rec.prefill_ns is not None and rec.ttft_ns is not None
    assert rec.queue_ns >= 0 and rec.prefill_ns > 0 and rec.queue_ns + rec.prefill_ns == rec.ttft_ns
    times = load_engine_times(log)
    assert times[rid] == (pytest.approx(rec.queue_ns / 1e9), pytest.approx(rec.prefill_ns / 1e9))
    assert 'vllm:request_queue_time_seconds_count{model_name="m1"} 1.0' in text
    assert 'vllm:request_prefill_time_seconds_count{model_name="m1"} 1.0' in text
    assert 'vllm:request_prefill_time_seconds_bucket{le="0.3",model_name="m1"}' in text


def test_engine_times_join_by_request_id_and_bad_lines_name_the_line(tmp_path: Path) -> None:
    log = tmp_path / "times.jsonl"
    log.write_text('{"request_id": "a", "queue_s": 0.5, "prefill_s": 0.25, "other": 1}\n\n'
                   '{"request_id": "b", "queue_s": null}\n')
    times = load_engine_times(log)
    assert times == {"a": (0.5, 0.25), "b": (None, None)}
    rec = BenchRecord(index=0, request_id="a", scheduled_ns=0, send_ns=0, wall_send_ns=0, first_output_ns=10**9,
                      end_ns=2 * 10**9, chunk_offsets_ns=(10**9,), chunk_tokens=(1,), tokens_from_usage=True,
                      isl_target=100, isl_server=100, osl_target=1, osl=1, cached_tokens=40, status="success")
    other = BenchRecord(**{**rec.__dict__, "request_id": "z"})
    got = capacity_samples([rec, other], times)
    assert (got[0].queue_s, got[0].prefill_s, got[0].uncached, got[0].ttft_s) == (0.5, 0.25, 60, 1.0)
    assert (got[1].queue_s, got[1].prefill_s) == (None, None)
    log.write_text('{"queue_s": 1}\n')
    with pytest.raises(ValueError, match=r"times.jsonl:1: not an engine-times line"):
        load_engine_times(log)
    for bad in ('{"request_id": "a", "prefill_s": -5}', '{"request_id": "a", "queue_s": NaN}'):
        log.write_text(bad + "\n")  # a negative time, or none at all, is no engine's
        with pytest.raises(ValueError, match=r"times.jsonl:1: not an engine-times line"):
            load_engine_times(log)
