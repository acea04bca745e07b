"""The bench against hostile files and servers: a clear one-line error, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servelens.bench.traces import read_trace
from servelens.cli.main import main
from servelens.testing.static import serve_static

DEEP = b"[" * 200_000 + b"]" * 200_000


def test_trace_line_nested_too_deep_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b'{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n' + DEEP + b"\n")
    with pytest.raises(ValueError, match=r"trace\.jsonl:2: not JSON"):
        read_trace(path, "mooncake")


@pytest.fixture(params=[DEEP, b"<html><body>not an API</body></html>"], ids=["deep_json", "html"])
def models_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """A loopback HTTP server whose ``/v1/models`` answers 200 with a body that is not a model list."""
    with serve_static(request.param) as url:
        yield url


def test_model_list_that_is_not_json_is_one_line(models_server: str, capsys: Any) -> None:
    assert main(["bench", "--url", models_server, "--num-requests", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servelens: error: ") and err.count("\n") == 1, err
    assert "/v1/models" in err and "not JSON" in err


@pytest.mark.parametrize("fmt", [None, "mooncake", "azure"])
def test_trace_that_is_not_utf8_names_the_file(tmp_path: Path, fmt: str | None) -> None:
    path = tmp_path / "trace.bin"
    path.write_bytes(b'{"timestamp": 0, "input_length": 10, "output_length": 5}\n\xff\xfe\x00junk\n')
    with pytest.raises(ValueError, match=r"trace\.bin.*not UTF-8 text"):
        read_trace(path, fmt)


@pytest.mark.parametrize("silent", ["url", "url-with-model", "metrics-url"])
async def test_server_that_never_answers_is_one_line_within_the_control_timeout(
        silent: str, upstream: Any, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # a server that accepts and never answers: /v1/models and the /metrics scrape waited
    # --request-timeout (600 s) in silence; they are bounded by CONTROL_TIMEOUT_S (shortened here)
    import asyncio

    import aiohttp

    from servelens.bench import control
    from servelens.gateway.testing import raw_tcp_server

    monkeypatch.setattr(control, "_CONTROL_TIMEOUT", aiohttp.ClientTimeout(total=0.3))
    done = asyncio.Event()

    async def never(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await done.wait()

    async with raw_tcp_server(never) as (port, _):
        silent_url = f"http://127.0.0.1:{port}"
        url, metrics = (upstream.url, silent_url + "/metrics") if silent == "metrics-url" else (silent_url, None)
        args = ["bench", "--url", url, "--num-requests", "1", "--output-dir", str(tmp_path), "--no-progress"]
        if silent == "url-with-model":  # the model list was skipped, and the probe waited 600 s
            args += ["--model", "m"]
        if metrics:
            args += ["--metrics-url", metrics]
        try:
            code = await asyncio.wait_for(asyncio.to_thread(main, args), 30)
        finally:
            done.set()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    what = "cannot scrape" if silent == "metrics-url" else "cannot reach"
    assert err.startswith(f"servelens: error: {what} {silent_url}") and err.endswith(": timed out\n"), err


async def test_a_server_without_a_model_list_runs_when_model_is_given(tmp_path: Path) -> None:
    # llama.cpp-style servers may lack /v1/models (404): with --model the bench goes on
    import json as _json

    from aiohttp import web

    from servelens.bench import BenchConfig, run_bench
    from servelens.gateway.testing import serve_app

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        chunk = {"choices": [{"index": 0, "delta": {"content": " w"}, "finish_reason": "length"}],
                 "usage": usage if (body.get("stream_options") or {}).get("continuous_usage_stats") else None}
        await resp.write(b"data: " + _json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: " + _json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    async with serve_app(app) as url:
        res = await run_bench(BenchConfig(url=url, model="m", isl="5", osl="1", num_requests=2))
        assert res.model == "m" and len(res.records) == 2 and all(r.ok for r in res.records)
        with pytest.raises(ValueError, match="answered HTTP 404"):  # without --model: which model?
            await run_bench(BenchConfig(url=url, isl="5", osl="1", num_requests=1))
