"""servelens.asgi.MetricsMiddleware inside vLLM 0.32.0 (CPU build, tiny local model): issue 20 §3.

Marker ``vllm`` (``python -m pytest -q -m vllm tests/engines/test_vllm_asgi.py``). One engine for the
module, started with ``--middleware servelens.asgi.testing.RecordingTap --middleware
servelens.asgi.MetricsMiddleware`` (the tap sits inside the middleware and keeps what vLLM got and
sent) and this checkout's ``src`` on ``PYTHONPATH`` (vLLM's venv has every package servelens imports).

- On start, vLLM's own ``/metrics`` has every by-ISL family of the served model at zero, in every bucket.
- The client's bytes are vLLM's minus the usage the middleware added (the tap holds vLLM's bytes).
- After a replay of a short Mooncake cut: requests, prompt, generation and cached tokens equal vLLM's
  own ``vllm:`` counters; the per-bucket counts equal the bench's; TTFT lies between vLLM's own
  (which starts later, at the engine's arrival, and ends earlier, at the engine's output) and the
  client's: in total, and per bucket against the client's.
- A bad ``SERVELENS_*`` setting stops vLLM's startup, with one line in its log saying why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from servelens.asgi.testing import TAP_FILE_ENV, read_tap
from servelens.core.buckets import IslBuckets
from servelens.engines.vllm_cpu import BENCH_MAX_CONTEXT, VllmHarnessError, VllmServer
from servelens.testing.engines import (
    bench_bucket_counts,
    canon_events,
    delta,
    expected_events,
    gateway_bucket_counts,
    run_bench,
    scrape,
    sse_events,
    wait_until,
)

pytestmark = pytest.mark.vllm

SRC = Path(__file__).resolve().parents[2] / "src"
ISL_BUCKETS = "1024,4096,8192,16384"
N_REQUESTS = 12
WAIT_S = 30.0
CLOCK_SLACK_S = 0.002  # per request: vLLM's clock and ours are read in different places
BY_ISL = ("time_to_first_token_by_isl_seconds_count", "inter_token_latency_by_isl_seconds_count",
          "request_duration_by_isl_seconds_count", "output_sequence_tokens_by_isl_count",
          "cached_tokens_by_isl_count", "prompt_tokens_by_isl_total")
CASES = {
    "no-usage": {},
    "include-usage": {"stream_options": {"include_usage": True}},
    "continuous-usage": {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
}


@pytest.fixture(scope="module")
def tap_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("asgi-tap") / "tap.jsonl"


@pytest.fixture(scope="module")
def vllm(tap_file: Path) -> Iterator[VllmServer]:
    env = {"PYTHONPATH": str(SRC), "SERVELENS_ISL_BUCKETS": ISL_BUCKETS, TAP_FILE_ENV: str(tap_file)}
    args = ("--middleware", "servelens.asgi.testing.RecordingTap", "--middleware", "servelens.asgi.MetricsMiddleware")
    with VllmServer(extra_args=args, extra_env=env) as srv:
        yield srv


def _tap(path: Path) -> list[tuple[bytes, bytes]]:
    return read_tap(str(path)) if path.exists() else []


def _tap_line(path: Path, n_before: int) -> tuple[bytes, bytes]:
    """The tap's line of the request just answered: the tap writes it once vLLM's handler returned,
    which may be after the client got the last byte."""
    wait_until(lambda: len(_tap(path)) > n_before, WAIT_S, "the tap's line")
    lines = _tap(path)
    assert len(lines) == n_before + 1
    return lines[-1]


def test_by_isl_families_at_zero_on_start(vllm: VllmServer) -> None:
    s = scrape(vllm.url)
    labels = IslBuckets.parse(ISL_BUCKETS).labels
    for family in BY_ISL:
        for label in labels:
            key = ("servelens_" + family, tuple(sorted({"model": vllm.model, "isl_bucket": label}.items())))
            assert s.samples.get(key) == 0.0, key
    assert s.value("servelens_requests_total") == 0
    assert vllm.log_path is not None
    log = vllm.log_path.read_text(encoding="utf-8", errors="replace")
    assert log.count("servelens.asgi.MetricsMiddleware: measuring") == 1, "one start line"


async def test_client_bytes_unchanged(vllm: VllmServer, tap_file: Path) -> None:
    before = scrape(vllm.url)
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        for name, extra in CASES.items():
            n_tap = len(_tap(tap_file))
            body = {"model": vllm.model, "messages": [{"role": "user", "content": f"case {name}: hello " * 30}],
                    "max_tokens": 12, "ignore_eos": True, "stream": True, **extra}  # fmt: skip
            async with s.post(vllm.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                client_raw = await resp.read()
            request, vllm_raw = _tap_line(tap_file, n_tap)
            opts: dict[str, bool] = extra.get("stream_options", {})  # type: ignore[assignment]
            sent = json.loads(request)["stream_options"]
            assert sent["include_usage"] is True, name  # the middleware asked for usage where the client did not
            want = expected_events(sse_events(vllm_raw), bool(opts.get("include_usage")),
                                   bool(opts.get("continuous_usage_stats")))
            got = sse_events(client_raw)
            assert canon_events(got) == canon_events(want), name
            if name == "continuous-usage":
                assert client_raw == vllm_raw  # nothing added, nothing cut: the same bytes
            if name == "no-usage":
                assert all('"usage"' not in e for e in got)
        body = {"model": vllm.model, "messages": [{"role": "user", "content": "unary"}], "max_tokens": 5,
                "ignore_eos": True}  # fmt: skip
        n_tap = len(_tap(tap_file))
        async with s.post(vllm.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            client_raw = await resp.read()
        assert (json.dumps(body).encode(), client_raw) == _tap_line(tap_file, n_tap)
    n = len(CASES) + 1
    wait_until(lambda: delta(scrape(vllm.url), before, "servelens_requests_total") >= n, WAIT_S, "the middleware")
    after = scrape(vllm.url)
    assert delta(after, before, "servelens_requests_total", {"status": "success"}) == n
    assert delta(after, before, "servelens_output_sequence_tokens_sum") == 12 * len(CASES) + 5
    assert delta(after, before, "servelens_input_sequence_tokens_sum") == delta(
        after, before, "vllm:prompt_tokens_total")


def test_replay_counts_equal_vllms(vllm: VllmServer, tmp_path: Path) -> None:
    buckets = IslBuckets.parse(ISL_BUCKETS)
    v0 = scrape(vllm.url)
    records, _ = run_bench(vllm.url, [
        "--trace", "mooncake_conversation_400.jsonl", "--max-requests", str(N_REQUESTS), "--time-scale", "0.2",
        "--max-context", str(BENCH_MAX_CONTEXT), "--long-requests", "clip", "--tokenizer", str(vllm.tokenizer_path),
        "--isl-buckets", ISL_BUCKETS,
    ], tmp_path)  # fmt: skip
    assert len(records) == N_REQUESTS and all(r.ok for r in records)
    wait_until(lambda: delta(scrape(vllm.url), v0, "servelens_requests_total")
               >= delta(scrape(vllm.url), v0, "vllm:request_success_total") >= N_REQUESTS, WAIT_S,
               "both to count every request")  # fmt: skip
    v1 = scrape(vllm.url)
    succeeded = delta(v1, v0, "vllm:request_success_total")
    probes = int(succeeded) - N_REQUESTS  # the bench's one-token option probe, if it sent one
    assert probes in (0, 1)

    def d(name: str, match: dict[str, str] | None = None) -> float:
        return delta(v1, v0, name, match)

    assert d("servelens_requests_total", {"status": "success"}) == succeeded == d("servelens_requests_total")
    assert d("servelens_input_sequence_tokens_sum") == d("vllm:prompt_tokens_total")
    assert d("servelens_output_sequence_tokens_sum") == d("vllm:generation_tokens_total")
    assert d("servelens_cached_tokens_sum") == d("vllm:prompt_tokens_cached_total") > 0
    assert gateway_bucket_counts(v1, v0, buckets) == bench_bucket_counts(records, buckets, [1] * probes)
    # TTFT: vLLM's <= ours (arrival earlier, first chunk later) <= the client's, in total and per bucket
    n = succeeded
    assert d("servelens_time_to_first_token_seconds_count") == d("vllm:time_to_first_token_seconds_count") == n
    ours, theirs = d("servelens_time_to_first_token_seconds_sum"), d("vllm:time_to_first_token_seconds_sum")
    assert theirs - n * CLOCK_SLACK_S <= ours, (theirs, ours)
    # the by-ISL sums hold the same observations as the stock sum (bounded below by vLLM's just above);
    # each bucket's is at most the client's (bounded above); no ratio of speeds, which load changes
    by_isl = {label: d("servelens_time_to_first_token_by_isl_seconds_sum", {"isl_bucket": label})
              for label in buckets.labels}  # fmt: skip
    assert sum(by_isl.values()) == pytest.approx(ours, abs=1e-9), (by_isl, ours)
    probe_bucket = buckets.label(1)
    for label, mine in by_isl.items():
        client = [r.ttft_s or 0.0 for r in records if r.isl_server is not None and buckets.label(r.isl_server) == label]
        if label == probe_bucket and probes:
            continue  # the probe's TTFT is in ours, not in the client's records
        assert mine <= sum(client) + len(client) * CLOCK_SLACK_S, (label, mine, sum(client))
        assert (mine > 0) == bool(client), (label, mine, len(client))
    print(f"\nasgi in vLLM: {int(n)} requests, TTFT sum vLLM {theirs:.4f} s, middleware {ours:.4f} s, "
          f"client {sum(r.ttft_s or 0.0 for r in records):.4f} s")


def test_bad_setting_fails_vllm_startup_with_one_line(tmp_path: Path) -> None:
    """A bad ``SERVELENS_*`` value: vLLM does not start, and its log says why in one line (the
    middleware's ASGI ``lifespan.startup.failed``, which uvicorn logs before it exits)."""
    env = {"PYTHONPATH": str(SRC), "SERVELENS_ISL_BUCKETS": "512,abc"}
    srv = VllmServer(extra_args=("--middleware", "servelens.asgi.MetricsMiddleware"), extra_env=env)
    with pytest.raises(VllmHarnessError):
        srv.start()
    srv.stop()
    assert srv.log_path is not None
    lines = [ln for ln in srv.log_path.read_text(encoding="utf-8", errors="replace").splitlines() if "servelens" in ln
             and "non-default args" not in ln]
    assert lines == ["ERROR:    servelens.asgi.MetricsMiddleware: SERVELENS_ISL_BUCKETS='512,abc': ISL bucket boundary "
                     "must be a positive integer, got 'abc'"], lines
